"""Names no other test of the process uses: store prefixes, in-memory stores, ledger families.

One counter for the whole process, so two tests (or a fixture and its test) never share a
prefix in the etcd server the session shares or in the process-wide in-memory stores.
"""

from __future__ import annotations

import itertools

_names = itertools.count()


def unique_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"
