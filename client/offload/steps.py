"""The points between an offload's steps, where a test or the simulator may stop it.

An offload is a sequence of metadata compare-and-sets and store calls whose order is what makes
a crash anywhere harmless (docs/design/tiered-storage.md, "Crash points"). ``Steps.at`` runs at
each named point; production passes ``NO_STEPS``, which does nothing, and the crash tests pass
one that raises there as a killed process would stop.
"""

from __future__ import annotations

from typing import Final

# In the order an offload reaches them.
LISTED: Final = "listed"  # the work-list key names the ledger; its metadata does not yet
COPYING: Final = "copying"  # the metadata names the attempt; no byte written yet
UPLOADING: Final = "uploading"  # part of the object written, not yet complete
WRITTEN: Final = "written"  # the object complete, not yet read back
VERIFIED: Final = "verified"  # read back and checked, the metadata still says copying
COPIED: Final = "copied"  # the metadata says copied; the bookies still hold the ledger
RELEASED: Final = "released"  # the metadata says released; the bookies drop it at their GC
POINTS: Final = (LISTED, COPYING, UPLOADING, WRITTEN, VERIFIED, COPIED, RELEASED)


class Steps:
    """Called at each point of an offload; this one does nothing."""

    async def at(self, point: str) -> None:
        """Reached ``point`` (one of ``POINTS``)."""
        return


NO_STEPS: Final = Steps()

__all__ = ["NO_STEPS", "POINTS", "Steps"]
