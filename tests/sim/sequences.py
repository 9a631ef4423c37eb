"""I17 (each sequence once) over one log the producers profile wrote (tests.sim.producers):
what the checker finds in the log against what each producer sent and saw acknowledged. Pure,
so that a test can hand it a log with each anomaly.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from aiobk.client.log.position import LogRecord
from tests.sim.history import History


def spans(entries: list[int]) -> str:
    """Ascending numbers as ranges: ``0-3,7``."""
    out: list[tuple[int, int]] = []
    for entry in entries:
        if out and out[-1][1] + 1 == entry:
            out[-1] = (out[-1][0], entry)
        else:
            out.append((entry, entry))
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def check_producers(
    history: History, name: str, found: Mapping[tuple[int, int], LogRecord]
) -> None:
    """I17 over one log its producers wrote (``found``: every record by position). For each
    producer -- one that never skips a sequence -- each sequence at most once, none missing
    below the highest present, positions rising with sequences; every sequence whose append
    was acknowledged (a position, or None for one the writer already had) in the log, at
    the position given; nothing in it the producers never sent."""
    sent = {(op.producer, op.sequence): op.value for op in history.producer_appends
            if op.log == name}  # fmt: skip
    where: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for position, record in sorted(found.items()):
        producer, sequence = record.producer_id, record.sequence
        if producer is None or sequence is None or sent.get((producer, sequence)) != record.data:
            history.violations.append(
                f"I17 log {name}: {record.data!r} at {position} (producer "
                f"{record.producer_id}, sequence {record.sequence}) was never sent as that"
            )
            continue
        where.setdefault(producer, {}).setdefault(sequence, []).append(position)
    for producer, sequences in sorted(where.items()):
        twice = sorted(s for s, at in sequences.items() if len(at) > 1)
        if twice:
            history.violations.append(
                f"I17 log {name}: {producer} has sequences {spans(twice)} more than once "
                f"(sequence {twice[0]} at {sequences[twice[0]]})"
            )
        top = max(sequences)
        missing = sorted(set(range(top)) - set(sequences))
        if missing:
            history.violations.append(
                f"I17 log {name}: {producer} lacks sequences {spans(missing)}, below {top} "
                "which it holds"
            )
        firsts = sorted((at[0], s) for s, at in sequences.items())
        behind = [(a, b) for a, b in itertools.pairwise(firsts) if b[1] < a[1]]
        if behind:
            (earlier, s), (later, t) = behind[0]
            history.violations.append(
                f"I17 log {name}: {producer} sequences out of order {len(behind)} time(s): "
                f"{s} at {earlier}, then {t} at {later}"
            )
    lost: dict[str, list[int]] = {}
    for op in history.producer_appends:
        if op.log != name or not op.acknowledged:
            continue
        held = where.get(op.producer, {}).get(op.sequence)
        if not held:
            lost.setdefault(op.producer, []).append(op.sequence)
        elif op.position is not None and op.position not in held:
            history.violations.append(
                f"I17 log {name}: {op.producer} sequence {op.sequence} was acknowledged at "
                f"{op.position} but is at {held}"
            )
    for producer, missed in sorted(lost.items()):
        history.violations.append(
            f"I17 log {name}: {producer} sequences {spans(sorted(set(missed)))} were "
            "acknowledged but are not in the log"
        )
