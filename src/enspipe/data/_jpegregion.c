/* A region of a baseline JPEG decoded to RGB at a DCT scale, by libjpeg-turbo: only the rows the
 * region needs pass the inverse DCT (jpeg_skip_scanlines skips the rows above it, the decode stops
 * after its last row), and only the iMCU columns that hold it (jpeg_crop_scanline).
 *
 *   decode(data, denom, x0, y0, x1, y1) -> (pixels: bytearray, width, height, left, top) | reason
 *
 * The region is [x0, x1) x [y0, y1) of the image decoded at 1/denom (1, 2, 4 or 8); the pixels are
 * height rows of width RGB pixels whose first is (left, top) of that image: left <= x0 (an iMCU
 * boundary before it), width >= x1 - left, top == y0. Where the decode cannot take the image,
 * or libjpeg warns of anything (corrupt or cut-short data), the answer is a string saying why, and
 * the caller decodes the image whole. Errors never leave the call: libjpeg's error_exit jumps back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

struct failure {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    int warned;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct failure *f = (struct failure *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, f->message);
    longjmp(f->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    struct failure *f = (struct failure *)cinfo->err;
    if (level < 0 && !f->warned) {  /* a warning: corrupt or cut-short data */
        f->warned = 1;
        (*cinfo->err->format_message)(cinfo, f->message);
    }
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    int denom, x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "y*iiiii", &data, &denom, &x0, &y0, &x1, &y1))
        return NULL;
    if (!(denom == 1 || denom == 2 || denom == 4 || denom == 8) || x0 < 0 || y0 < 0 || x1 <= x0 || y1 <= y0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "decode: denom must be 1, 2, 4 or 8 and the region non-empty");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct failure f;
    const char *volatile reason = NULL;
    PyObject *volatile out = NULL;
    JDIMENSION left = 0, width = 0;
    volatile JDIMENSION kept_left = 0, kept_width = 0;
    cinfo.err = jpeg_std_error(&f.mgr);
    f.mgr.error_exit = on_error;
    f.mgr.emit_message = on_message;
    f.warned = 0;
    f.message[0] = 0;
    jpeg_create_decompress(&cinfo);
    if (setjmp(f.jump)) {
        reason = f.message;
        goto done;
    }
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    if (!(cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE
          || cinfo.jpeg_color_space == JCS_RGB)) { reason = "not RGB, YCbCr or grey (CMYK or YCCK)"; goto done; }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)denom;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_calc_output_dimensions(&cinfo);
    if ((JDIMENSION)x1 > cinfo.output_width || (JDIMENSION)y1 > cinfo.output_height) {
        reason = "region outside the image";
        goto done;
    }
    jpeg_start_decompress(&cinfo);
    /* two columns more each side: fancy upsampling repeats a crop's edge column of chroma where
     * the whole decode would read its neighbour, so the pixels next to a crop's edge differ */
    left = (JDIMENSION)(x0 > 2 ? x0 - 2 : 0);
    width = (JDIMENSION)x1 + 2 < cinfo.output_width ? (JDIMENSION)x1 + 2 - left : cinfo.output_width - left;
    if (left > 0 || width < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &left, &width);
    kept_left = left;
    kept_width = width;
    if (y0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
        reason = "cut short before the region";
        goto done;
    }
    Py_ssize_t stride = (Py_ssize_t)width * 3, rows = y1 - y0;
    out = PyByteArray_FromStringAndSize(NULL, stride * rows);
    if (out == NULL) goto done;
    unsigned char *pixels = (unsigned char *)PyByteArray_AS_STRING(out);
    volatile Py_ssize_t row = 0;
    volatile int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(f.jump) == 0) {  /* an error while the GIL is released comes back here, not above */
        while (row < rows && !f.warned) {
            JSAMPROW line = pixels + row * stride;
            if (jpeg_read_scanlines(&cinfo, &line, 1) != 1) break;
            row++;
        }
    } else {
        failed = 1;
    }
    Py_END_ALLOW_THREADS
    if (failed || f.warned || row < rows) {
        PyObject *dropped = out;
        out = NULL;
        Py_DECREF(dropped);
        reason = (failed || f.warned) ? f.message : "cut short in the region";
    }
done:
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    if (out != NULL) {
        PyObject *answer = Py_BuildValue("(Oiiii)", out, (int)kept_width, y1 - y0, (int)kept_left, y0);
        Py_DECREF(out);
        return answer;
    }
    if (PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(reason != NULL && reason[0] ? reason : "libjpeg failed");
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "decode(data, denom, x0, y0, x1, y1) -> (pixels, width, height, left, top) | reason"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegregion",
                                    "A JPEG's region decoded by libjpeg-turbo (see enspipe.data.decoding).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpegregion(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER",
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
                                             LIBJPEG_TURBO_VERSION_NUMBER
#else
                                             0
#endif
                                             ) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
