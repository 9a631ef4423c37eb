"""Where a small read the page cache cannot serve waits for the disk: on the event loop, or on a
reader thread.

Theory of operation. A read handed to a thread costs a hop there and back -- a queue, a wake-up,
a callback into the loop -- on top of the disk's own time; on this project's 2-core machine the
hop alone measured 80-86 us while a cold 4 KiB pread took 50-80 us, so a cold entry read spent
more time travelling than reading (measured in process at 3,000,000 entries: 146 us through a
thread against 66 us for the pread itself). Reading on the loop saves the hop but stops the loop
for as long as the disk takes, which is only a good trade when the disk is fast.

So the route is measured, not configured: every read records its disk time (the ``pread``
alone) and every read on a thread also records its hop (its whole wait less its disk time),
each as a moving average. A read inline is not first asked of the page cache (a probe costs a
system call and, for a page not cached, a raised error: 7-9 us of a cold read here), so some
of them are page-cache hits; those say nothing of the disk and are not counted
(``cached_below_us``). A read goes inline while the disk's average is below both the hop's
and ``max_inline_us`` (a bound on how long one read may hold the loop, whatever a hop costs);
one read in ``probe_every`` still goes the slow way (the page cache asked first, then a
thread if it must wait), so the hop's figure stays current. A fast disk
(NVMe, a cached virtual disk) then reads inline; a slow one (a spinning disk, milliseconds)
always on threads; a disk that turns slow moves its reads back to threads within a few reads.

Pure: fed durations in nanoseconds, answers booleans; ``bookie.disk`` does the timing and the I/O.
"""

from __future__ import annotations


class ReadRoute:
    """Decides per read; see the module docstring."""

    __slots__ = (
        "_count",
        "cached_below_ns",
        "disk_ns",
        "hop_ns",
        "max_inline_ns",
        "probe_every",
        "weight",
    )

    def __init__(
        self,
        *,
        probe_every: int = 32,
        max_inline_us: float = 250.0,
        weight: float = 0.125,
        cached_below_us: float = 10.0,
    ) -> None:
        self.probe_every = probe_every
        self.max_inline_ns = max_inline_us * 1000
        self.weight = weight
        # An inline read quicker than this came from the page cache (a 16 KiB copy takes a
        # few microseconds; the quickest flash, tens), and is left out of the disk's figure.
        self.cached_below_ns = cached_below_us * 1000
        self.disk_ns: float | None = None  # a small read's own time, moving average
        self.hop_ns: float | None = None  # a thread's round trip beyond the read, moving average
        self._count = 0

    def inline(self) -> bool:
        """Whether the next small cold read should block the loop instead of taking a thread."""
        disk, hop = self.disk_ns, self.hop_ns
        if disk is None or hop is None:
            return False  # nothing measured yet: a thread, which measures both
        self._count += 1
        if self._count % self.probe_every == 0:
            return False
        return disk < hop and disk < self.max_inline_ns

    def read_inline(self, disk_ns: int) -> None:
        if disk_ns >= self.cached_below_ns:
            self.disk_ns = self._average(self.disk_ns, disk_ns)

    def read_on_thread(self, total_ns: int, disk_ns: int) -> None:
        self.disk_ns = self._average(self.disk_ns, disk_ns)
        self.hop_ns = self._average(self.hop_ns, max(0, total_ns - disk_ns))

    def _average(self, average: float | None, sample: int) -> float:
        if average is None:
            return float(sample)
        return average + self.weight * (sample - average)


__all__ = ["ReadRoute"]
