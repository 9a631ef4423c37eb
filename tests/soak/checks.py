"""The soak's judgements, pure: over the history of the log, and over the resource series.

The log's history, for one writer whose ``append`` calls carry increasing sequence numbers
(the checks of the simulator's history checker, tests/sim/checker.py, over a real run):

- every acknowledged record is read, exactly once, at the position its acknowledgement gave
  (lost, duplicated, misplaced);
- the reader's positions strictly increase (it never goes back or repeats one);
- in position order the sequences increase: the log holds the records in the order of the
  writer's calls (reordered; each inversion is shown with the records around it);
- every record read is one the writer sent, intact (phantom, damaged). A record whose append
  failed may be in the log or not (its outcome is unknown), at most once and in its place.

The resources: a series (memory of a process, size of a directory) keeps growing when its peak
over the last eighth of the run passes its peak over the eighth after the middle by more than
``share`` of that peak plus ``floor``. Only the second half is judged: the first is warm-up
(caches filling, the first entry logs and journal files), and a bound on absolute size would
judge the machine, not the trend. Peaks, not means: a restarted process starts low and the
bookies' disk falls at each GC pass, so a restart can hide growth but never fake it. With the
defaults (a tenth and a few MiB) a series that doubles over the run is caught; one that grows
by a fifth, within the noise of restarts and GC, is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.soak.history import History

EXAMPLES = 5  # shown per kind of violation
CONTEXT = 3  # records shown before an inversion (and CONTEXT - 1 after)


@dataclass
class LogVerdict:
    reads: int = 0
    acked: int = 0
    failed: int = 0
    failed_present: int = 0  # failed appends found in the log anyway (allowed)
    counts: dict[str, int] = field(default_factory=dict)  # kind of violation -> how many
    examples: dict[str, list[str]] = field(default_factory=dict)
    places: int = 0  # where the reordered records are: runs of them, one at each roll say

    def note(self, kind: str, example: str | None) -> None:
        """One violation of ``kind``; ``example`` shown unless enough are (None: counted only,
        an example given covers it)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        shown = self.examples.setdefault(kind, [])
        if example is not None and len(shown) < EXAMPLES:
            shown.append(example)

    @property
    def violations(self) -> list[str]:
        lines = []
        for kind, count in sorted(self.counts.items()):
            where = f" at {self.places} places" if kind == "reordered" else ""
            lines.append(f"{kind}: {count}{where} ({'; '.join(self.examples.get(kind, []))})")
        return lines


def check_log(history: History) -> LogVerdict:
    verdict = LogVerdict(reads=len(history.read_seq), acked=history.acked)
    verdict.failed = len(history.failed)
    sent = history.called if history.called is not None else len(history.ack_ledger)
    sent = max(sent, len(history.ack_ledger), max(history.failed, default=-1) + 1)
    times_read = bytearray(sent)
    previous: tuple[int, int] | None = None
    previous_seq = -1
    last_inversion = -CONTEXT - 1
    damaged = set(history.damaged)
    for index, sequence in enumerate(history.read_seq):
        at = (history.read_ledger[index], history.read_entry[index])
        where = f"{sequence} at {at[0]}:{at[1]}"
        if index in damaged:
            verdict.note("damaged", f"read #{index}: {where}")
        if previous is not None and at <= previous:
            verdict.note("reader went back", f"{previous[0]}:{previous[1]} then {at[0]}:{at[1]}")
        previous = at
        if not 0 <= sequence < sent:
            verdict.note("phantom", f"read #{index}: {where}, never appended")
            continue
        if times_read[sequence] == 1:
            verdict.note("duplicated", where)
        times_read[sequence] = min(255, times_read[sequence] + 1)
        acked = history.acked_position(sequence)
        if acked is not None and acked != at:
            verdict.note("misplaced", f"{where}, acknowledged at {acked[0]}:{acked[1]}")
        elif acked is None and sequence in history.failed and times_read[sequence] == 1:
            verdict.failed_present += 1
        if sequence < previous_seq:
            # One example per place: the records after the first inversion there follow it.
            place = index - last_inversion > CONTEXT
            verdict.places += place
            verdict.note("reordered", _around(history, index) if place else None)
            last_inversion = index
        previous_seq = max(previous_seq, sequence)
    for sequence in range(len(history.ack_ledger)):
        if history.ack_ledger[sequence] >= 0 and times_read[sequence] == 0:
            verdict.note(
                "lost",
                f"{sequence} acknowledged at {history.ack_ledger[sequence]}:"
                f"{history.ack_entry[sequence]}",
            )
    return verdict


def _around(history: History, index: int) -> str:
    """The reads around ``index`` as (sequence, ledger:entry): where the order broke."""
    first = max(0, index - CONTEXT)
    last = min(len(history.read_seq), index + CONTEXT)
    return " ".join(
        f"({history.read_seq[i]}, {history.read_ledger[i]}:{history.read_entry[i]})"
        for i in range(first, last)
    )


@dataclass(frozen=True, slots=True)
class Growth:
    name: str
    earlier_peak: int  # over [1/2, 5/8) of the run
    later_peak: int  # over [7/8, 1]
    allowed: int  # how much the later may pass the earlier

    @property
    def growth(self) -> int:
        return self.later_peak - self.earlier_peak

    @property
    def ok(self) -> bool:
        return self.growth <= self.allowed


def judge_growth(
    name: str,
    samples: Sequence[tuple[float, int]],
    start: float,
    end: float,
    share: float,
    floor: int,
) -> Growth | None:
    """The growth of a series of (time, value) over the second half of [start, end] (see the
    module doc); None when a window has no sample (the process was down throughout)."""
    eighth = (end - start) / 8
    earlier = [value for t, value in samples if start + 4 * eighth <= t < start + 5 * eighth]
    later = [value for t, value in samples if start + 7 * eighth <= t <= end]
    if not earlier or not later:
        return None
    peak = max(earlier)
    return Growth(name, peak, max(later), round(share * peak) + floor)
