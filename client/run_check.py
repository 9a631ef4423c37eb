"""A READ_RANGE answer's bodies checked in one pass, where the compiled module is built: the
choice between it and the pure-Python checks, made once at import.

A copy of a closed ledger reads it in READ_RANGE answers of up to a thousand entries and keeps
each body as served, after checking it as a READ's body is checked: its ids, its digest type,
its digest. Per entry in Python that is most of what a copy costs at small entries.
``aiobk.protocol._runs`` (Cython, built by ``pip install`` where a C compiler is found) does the
whole answer in C and takes it only when every body passes; any other answer, and every answer
without the module or with ``AIOBK_NO_EXTENSIONS=1`` (read once, at import), is left to the
pure-Python checks (``unpack_range`` and ``Digester.check_body``), which say what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable

from aiobk.extensions import compiled

CheckRun = Callable[[bytes, int, int, int, int, bool], "list[bytes] | None"]


def _none(
    packed: bytes, ledger_id: int, first: int, last: int, kind: int, check_digest: bool
) -> list[bytes] | None:
    return None


_module = compiled("aiobk.protocol._runs")

COMPILED = _module is not None
"""Whether the compiled module is in use."""

check_run: CheckRun = _module.check_run if _module is not None else _none
"""``check_run(packed, ledger_id, first, last, kind, check_digest)``: the bodies of the answer
``packed`` for entries ``first``..``last`` of ``ledger_id`` when each is the next entry of the
run, of digest type ``kind``, and (``check_digest``) carries its digest; None to leave the
answer to the pure-Python checks."""

__all__ = ["COMPILED", "check_run"]
