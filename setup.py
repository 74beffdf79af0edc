"""The compiled parts, both optional: where one does not build, the install goes on without it.

* enspipe.data._jpegregion (src/enspipe/data/_jpegregion.c): a JPEG's region decoded by
  libjpeg-turbo; it builds where libjpeg's headers are (Debian's libjpeg-dev). Without it every JPEG
  decodes whole (enspipe.data.decoding.REGION_DECODE says which).
* enspipe.data._pixels (src/enspipe/data/_pixels.c): the antialiased bilinear resize of
  ``standard`` and the wire's normalisation by table; without it Pillow, numpy and OpenCV do them
  (enspipe.data.pixels.KERNELS says which).
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("enspipe.data._jpegregion", ["src/enspipe/data/_jpegregion.c"], libraries=["jpeg"],
              extra_compile_args=["-O2"], optional=True),
    Extension("enspipe.data._pixels", ["src/enspipe/data/_pixels.c"], extra_compile_args=["-O3"], optional=True),
])
