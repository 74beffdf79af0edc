"""The one compiled part: enspipe.data._jpegregion, a JPEG's region decoded by libjpeg-turbo
(src/enspipe/data/_jpegregion.c). It builds where libjpeg's headers are (Debian's libjpeg-dev);
where they are not, the install goes on without it and enspipe decodes every JPEG whole
(enspipe.data.decoding.REGION_DECODE says which)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("enspipe.data._jpegregion", ["src/enspipe/data/_jpegregion.c"],
                             libraries=["jpeg"], extra_compile_args=["-O2"], optional=True)])
