"""The compiled modules, looked up by name: a module the build did not make is None, and so is
every module while the environment says ``AIOBK_NO_EXTENSIONS=1``; the caller then runs the
pure-Python code the module stands for.

The compiled modules (Cython, built by ``pip install`` where a C compiler is found) are
``aiobk.bookie._records``, ``aiobk.protocol._runs`` and ``aiobk.protocol._adds``. Each caller
looks its module up once, when it is imported (so the variable is set before the process
starts), keeps the pure code beside the choice, and the tests hold the two equal. The lowest
layer (pyproject.toml): the codec chooses with it and imports no ``os`` itself.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``name``; None when it is not built or ``AIOBK_NO_EXTENSIONS=1``."""
    if os.environ.get("AIOBK_NO_EXTENSIONS") == "1":
        return None
    try:  # by name: an optional binary module, which the import graph cannot read
        return importlib.import_module(name)
    except ImportError:
        return None


__all__ = ["compiled"]
