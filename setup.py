"""The compiled extension, the one part of the build pyproject.toml cannot declare.

``aiobk.bookie._records`` (bookie/_records.pyx), ``aiobk.protocol._runs`` (protocol/_runs.pyx)
and ``aiobk.protocol._adds`` (protocol/_adds.pyx), all Cython, are built as optional
extensions: where they do not compile (no C compiler, no Python headers) the install goes on and
the pure-Python code they stand for runs (``aiobk.bookie.record_codecs``,
``aiobk.client.run_check``, ``aiobk.protocol.add_codecs``). Everything else about the
package is in pyproject.toml.
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
                name,
                [source],
                include_dirs=["protocol"],
                depends=["protocol/_crc32c.h", "protocol/_bigendian.h"],
                extra_compile_args=["-O2"],
            )
            for name, source in (
                ("aiobk.bookie._records", "bookie/_records.pyx"),
                ("aiobk.protocol._runs", "protocol/_runs.pyx"),
                ("aiobk.protocol._adds", "protocol/_adds.pyx"),
            )
        ],
        compiler_directives={"language_level": "3"},
    )
    for extension in ext_modules:
        extension.optional = True  # set after cythonize, which does not carry it over

setup(ext_modules=ext_modules)
