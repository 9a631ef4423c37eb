"""The sync cursor of BookKeeper's "BP-14: Relax durability", pure: which entries of a ledger
this bookie has synced.

"LastAddSynced": every entry up to it is synced here (or confirmed in the ensemble, when a
piggybacked LAC moved it). Entries synced above it, out of order, are kept as disjoint ranges
until the gap below them closes. BP-14 "Update Sync Cursor":

- an entry synced at LastAddSynced + 1 moves the cursor (and swallows ranges it now reaches);
- one synced further up joins the ranges;
- a piggybacked LAC above the cursor moves it to the LAC.
"""

from __future__ import annotations

import bisect


class SyncCursor:
    __slots__ = ("last_add_synced", "ranges")

    def __init__(self, last_add_synced: int = -1) -> None:
        self.last_add_synced = last_add_synced
        self.ranges: list[list[int]] = []  # sorted, disjoint, non-adjacent [first, last]

    def synced(self, entry_id: int) -> int:
        """Record that ``entry_id`` is synced; return LastAddSynced."""
        if entry_id <= self.last_add_synced:
            return self.last_add_synced
        if entry_id == self.last_add_synced + 1:
            self.last_add_synced = entry_id
            self._absorb()
            return self.last_add_synced
        ranges = self.ranges
        index = bisect.bisect_left(ranges, [entry_id, entry_id])
        if index > 0 and ranges[index - 1][1] >= entry_id - 1:
            index -= 1
            ranges[index][1] = max(ranges[index][1], entry_id)
        elif index < len(ranges) and ranges[index][0] <= entry_id + 1:
            ranges[index][0] = min(ranges[index][0], entry_id)
        else:
            ranges.insert(index, [entry_id, entry_id])
        if index + 1 < len(ranges) and ranges[index + 1][0] <= ranges[index][1] + 1:
            ranges[index][1] = max(ranges[index][1], ranges.pop(index + 1)[1])
        return self.last_add_synced

    def confirmed(self, lac: int) -> int:
        """A piggybacked LAC: everything up to it is on an ack quorum somewhere."""
        if lac > self.last_add_synced:
            self.last_add_synced = lac
            self._absorb()
        return self.last_add_synced

    def _absorb(self) -> None:
        ranges = self.ranges
        while ranges and ranges[0][0] <= self.last_add_synced + 1:
            first = ranges.pop(0)
            self.last_add_synced = max(self.last_add_synced, first[1])
