/* The pillow backend's pixel kernels (enspipe.data.pixels): resize and normalise.
 *
 * Antialiased bilinear resampling of a box of an 8-bit RGB image, with the arithmetic of Pillow's
 * Image.resize(size, BILINEAR, box) (what torchvision's transforms do on PIL images), so that its
 * pixels are Pillow's, bit for bit, without Pillow's RGBX copies in and out:
 *
 *   resize(pixels, x0, y0, x1, y1, width, height) -> bytearray of height x width x 3
 *
 * pixels: an H x W x 3 uint8 buffer whose rows may have any stride (a view of a larger image).
 * The box is in float32, as Pillow takes it. Each axis: a triangle filter of support max(1, scale)
 * in input pixels centred on each output pixel's centre, its weights normalised to sum to one and
 * rounded to 22-bit fixed point; the horizontal pass over the rows the vertical pass reads makes
 * 8-bit pixels, rounded and clipped, then the vertical pass makes the output from them.
 *
 *   lookup(pixels, table) -> bytearray of H x W x 3 items of the table's
 *
 * Each 8-bit value of channel c becomes table[c][value]: a table of 3 x 256 float32 or uint8 items
 * holds what a per-channel function of the value gives (the wire's normalisation), so the image
 * costs one read and one write a value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BITS 22
#define HALF (1 << (BITS - 1))

static inline uint8_t to8(int32_t v) {
    v >>= BITS;
    return (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

/* Each output position's first input, its number of taps, and ksize fixed-point weights. */
struct taps {
    int ksize;
    int *first, *count;
    int32_t *weight;
};

static void taps_free(struct taps *t) {
    free(t->first);
    free(t->count);
    free(t->weight);
}

static int taps_make(struct taps *t, int in_size, float in0, float in1, int out_size) {
    double scale = (double)(in1 - in0) / out_size;
    double spread = scale < 1.0 ? 1.0 : scale;
    double support = spread, reach = 1.0 / spread; /* the triangle's half-width: 1 input pixel, stretched */
    t->ksize = (int)ceil(support) * 2 + 1;
    t->first = malloc(sizeof(int) * out_size);
    t->count = malloc(sizeof(int) * out_size);
    t->weight = malloc(sizeof(int32_t) * (size_t)out_size * t->ksize);
    double *w = malloc(sizeof(double) * t->ksize);
    if (!t->first || !t->count || !t->weight || !w) {
        free(w);
        return -1;
    }
    for (int o = 0; o < out_size; o++) {
        double centre = in0 + (o + 0.5) * scale, sum = 0.0;
        int lo = (int)(centre - support + 0.5), hi = (int)(centre + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        int n = hi - lo;
        for (int i = 0; i < n; i++) {
            double d = fabs((i + lo - centre + 0.5) * reach);
            w[i] = d < 1.0 ? 1.0 - d : 0.0;
            sum += w[i];
        }
        int32_t *k = t->weight + (size_t)o * t->ksize;
        for (int i = 0; i < t->ksize; i++) {
            double v = i < n ? (sum != 0.0 ? w[i] / sum : w[i]) : 0.0;
            k[i] = (int32_t)(v < 0 ? -0.5 + v * (1 << BITS) : 0.5 + v * (1 << BITS));
        }
        t->first[o] = lo;
        t->count[o] = n;
    }
    free(w);
    return 0;
}

/* The two passes, compiled for AVX2 as well where the compiler can (the loader picks by the CPU). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

static void horizontal_row(const uint8_t *line, uint8_t *m, int width, const struct taps *h) {
    for (int o = 0; o < width; o++) {
        const int32_t *k = h->weight + (size_t)o * h->ksize;
        const uint8_t *p = line + (Py_ssize_t)h->first[o] * 3;
        int32_t s0 = HALF, s1 = HALF, s2 = HALF;
        for (int i = 0, n = h->count[o]; i < n; i++, p += 3) {
            s0 += p[0] * k[i];
            s1 += p[1] * k[i];
            s2 += p[2] * k[i];
        }
        m[o * 3] = to8(s0);
        m[o * 3 + 1] = to8(s1);
        m[o * 3 + 2] = to8(s2);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The same sums, a pixel's three channels (and a fourth, unused byte) in one SSE4.1 register:
 * it reads one byte past a row's last pixel, so the buffer's last row goes to horizontal_row. */
__attribute__((target("sse4.1"))) static void horizontal_row_sse41(const uint8_t *line, uint8_t *m, int width,
                                                                    const struct taps *h) {
    const __m128i half = _mm_set1_epi32(HALF);
    for (int o = 0; o < width; o++) {
        const int32_t *k = h->weight + (size_t)o * h->ksize;
        const uint8_t *p = line + (Py_ssize_t)h->first[o] * 3;
        __m128i s = half;
        for (int i = 0, n = h->count[o]; i < n; i++, p += 3) {
            int32_t four;
            memcpy(&four, p, 4);
            s = _mm_add_epi32(s, _mm_mullo_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(four)), _mm_set1_epi32(k[i])));
        }
        s = _mm_srai_epi32(s, BITS);
        s = _mm_packus_epi16(_mm_packs_epi32(s, s), s); /* saturated to 0..255, as to8 */
        int32_t out = _mm_cvtsi128_si32(s);
        memcpy(m + o * 3, &out, 3);
    }
}
#define HAVE_SSE41_ROW 1
#endif

static void horizontal(const uint8_t *base, Py_ssize_t in_stride, int in_h, int row0, int rows, uint8_t *mid,
                       int width, const struct taps *h) {
    Py_ssize_t mid_stride = (Py_ssize_t)width * 3;
#ifdef HAVE_SSE41_ROW
    int fast = __builtin_cpu_supports("sse4.1");
#else
    int fast = 0;
#endif
    for (int r = 0; r < rows; r++) {
        const uint8_t *line = base + (Py_ssize_t)(r + row0) * in_stride;
        uint8_t *m = mid + (Py_ssize_t)r * mid_stride;
#ifdef HAVE_SSE41_ROW
        if (fast && r + row0 < in_h - 1) {
            horizontal_row_sse41(line, m, width, h);
            continue;
        }
#endif
        horizontal_row(line, m, width, h);
    }
    (void)fast;
}

CLONES static void vertical(const uint8_t *mid, int row0, uint8_t *dst, int width, int height,
                            const struct taps *v, int32_t *restrict acc) {
    Py_ssize_t stride = (Py_ssize_t)width * 3;
    for (int o = 0; o < height; o++) {
        const int32_t *k = v->weight + (size_t)o * v->ksize;
        const uint8_t *m = mid + (Py_ssize_t)(v->first[o] - row0) * stride;
        for (Py_ssize_t x = 0; x < stride; x++) acc[x] = HALF;
        for (int i = 0, n = v->count[o]; i < n; i++, m += stride) {
            int32_t w = k[i];
            for (Py_ssize_t x = 0; x < stride; x++) acc[x] += m[x] * w;
        }
        uint8_t *d = dst + (Py_ssize_t)o * stride;
        for (Py_ssize_t x = 0; x < stride; x++) d[x] = to8(acc[x]);
    }
}

static PyObject *resample(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *obj;
    float x0, y0, x1, y1;
    int width, height;
    if (!PyArg_ParseTuple(args, "Offffii", &obj, &x0, &y0, &x1, &y1, &width, &height)) return NULL;
    Py_buffer src;
    if (PyObject_GetBuffer(obj, &src, PyBUF_RECORDS_RO) < 0) return NULL;
    PyObject *out = NULL;
    struct taps h = {0}, v = {0};
    uint8_t *mid = NULL;
    int32_t *acc = NULL;
    if (src.ndim != 3 || src.shape[2] != 3 || src.itemsize != 1 || src.strides[2] != 1 || src.strides[1] != 3
        || src.strides[0] < src.shape[1] * 3 || strcmp(src.format ? src.format : "B", "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "resize: pixels must be H x W x 3 uint8 with whole pixels side by side");
        goto done;
    }
    int in_h = (int)src.shape[0], in_w = (int)src.shape[1];
    Py_ssize_t in_stride = src.strides[0];
    if (width < 1 || height < 1 || in_h < 1 || in_w < 1 || !(x1 > x0) || !(y1 > y0) || x0 < 0 || y0 < 0
        || x1 > in_w || y1 > in_h) {
        PyErr_SetString(PyExc_ValueError, "resize: the box must lie in the image and the size be positive");
        goto done;
    }
    if (taps_make(&h, in_w, x0, x1, width) < 0 || taps_make(&v, in_h, y0, y1, height) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int row0 = v.first[0], rows = v.first[height - 1] + v.count[height - 1] - row0;
    Py_ssize_t mid_stride = (Py_ssize_t)width * 3;
    out = PyByteArray_FromStringAndSize(NULL, mid_stride * height);
    mid = malloc((size_t)mid_stride * rows);
    acc = malloc(sizeof(int32_t) * mid_stride);
    if (!out || !mid || !acc) {
        if (out) Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *dst = (uint8_t *)PyByteArray_AS_STRING(out);
    const uint8_t *base = (const uint8_t *)src.buf;
    Py_BEGIN_ALLOW_THREADS
    horizontal(base, in_stride, in_h, row0, rows, mid, width, &h);
    vertical(mid, row0, dst, width, height, &v, acc);
    Py_END_ALLOW_THREADS
done:
    taps_free(&h);
    taps_free(&v);
    free(mid);
    free(acc);
    PyBuffer_Release(&src);
    return out;
}

static PyObject *lookup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *obj, *tobj;
    if (!PyArg_ParseTuple(args, "OO", &obj, &tobj)) return NULL;
    Py_buffer src, table;
    if (PyObject_GetBuffer(obj, &src, PyBUF_RECORDS_RO) < 0) return NULL;
    if (PyObject_GetBuffer(tobj, &table, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t item = table.itemsize;
    if (src.ndim != 3 || src.shape[2] != 3 || src.itemsize != 1 || src.strides[2] != 1 || src.strides[1] != 3
        || strcmp(src.format ? src.format : "B", "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "lookup: pixels must be H x W x 3 uint8 with whole pixels side by side");
        goto done;
    }
    if (table.len != 3 * 256 * item || !(item == 1 || item == 4)) {
        PyErr_SetString(PyExc_ValueError, "lookup: the table must hold 3 x 256 items of 1 or 4 bytes");
        goto done;
    }
    Py_ssize_t h = src.shape[0], w = src.shape[1];
    out = PyByteArray_FromStringAndSize(NULL, h * w * 3 * item);
    if (!out) goto done;
    char *dst = PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t y = 0; y < h; y++) {
        const uint8_t *p = (const uint8_t *)src.buf + y * src.strides[0];
        if (item == 4) {
            const uint32_t *t = (const uint32_t *)table.buf;
            uint32_t *d = (uint32_t *)dst + y * w * 3;
            for (Py_ssize_t x = 0; x < w * 3; x += 3) {
                d[x] = t[p[x]];
                d[x + 1] = t[256 + p[x + 1]];
                d[x + 2] = t[512 + p[x + 2]];
            }
        } else {
            const uint8_t *t = (const uint8_t *)table.buf;
            uint8_t *d = (uint8_t *)dst + y * w * 3;
            for (Py_ssize_t x = 0; x < w * 3; x += 3) {
                d[x] = t[p[x]];
                d[x + 1] = t[256 + p[x + 1]];
                d[x + 2] = t[512 + p[x + 2]];
            }
        }
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&table);
    return out;
}

static PyMethodDef methods[] = {
    {"lookup", lookup, METH_VARARGS, "lookup(pixels, table) -> bytearray: each value of channel c as table[c][value]"},
    {"resize", resample, METH_VARARGS,
     "resize(pixels, x0, y0, x1, y1, width, height) -> bytearray: Pillow's antialiased bilinear of the box"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pixels",
                                    "The pillow backend's pixel kernels (see enspipe.data.pixels).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pixels(void) { return PyModule_Create(&module); }
