"""The compiled extension, the one part of the build pyproject.toml cannot declare.

``aiobk.bookie._records`` (bookie/_records.pyx, Cython) is built as an optional extension:
where it does not compile (no C compiler, no Python headers) the install goes on and the bookie
runs the pure-Python encoders it stands for (``aiobk.bookie.record_codecs``). Everything else
about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython: the pure-Python path only
    ext_modules = []
else:
    ext_modules = cythonize(
        [
            Extension(
                "aiobk.bookie._records",
                ["bookie/_records.pyx"],
                include_dirs=["bookie"],
                depends=["bookie/_crc32c.h"],
                extra_compile_args=["-O2"],
            )
        ],
        compiler_directives={"language_level": "3"},
    )
    for extension in ext_modules:
        extension.optional = True  # set after cythonize, which does not carry it over

setup(ext_modules=ext_modules)
