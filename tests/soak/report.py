"""The soak's report: JSON (everything: every series, the timeline) and a text summary."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.soak.checks import Growth
from tests.soak.run import SoakResult, grouped

MIB = 2**20
POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the summary shows each series


def percentile(ordered: Sequence[int], share: float) -> int:
    """Nearest-rank percentile of a sorted sequence (0 when empty)."""
    if not ordered:
        return 0
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def per_minute(result: SoakResult) -> list[dict[str, Any]]:
    rows = []
    for minute, latencies in sorted(result.history.latency_by_minute.items()):
        ordered = sorted(latencies)
        rows.append({
            "minute": minute,
            "appends": len(ordered),
            "p50_ms": round(percentile(ordered, 0.50) / 1000, 2),
            "p99_ms": round(percentile(ordered, 0.99) / 1000, 2),
            "max_ms": round(ordered[-1] / 1000, 2) if ordered else 0.0,
        })  # fmt: skip
    return rows


def overall_latency(result: SoakResult) -> dict[str, float]:
    ordered = sorted(v for values in result.history.latency_by_minute.values() for v in values)
    return {
        "p50_ms": round(percentile(ordered, 0.50) / 1000, 2),
        "p99_ms": round(percentile(ordered, 0.99) / 1000, 2),
        "p999_ms": round(percentile(ordered, 0.999) / 1000, 2),
        "max_ms": round(ordered[-1] / 1000, 2) if ordered else 0.0,
    }


def to_json(result: SoakResult) -> dict[str, Any]:
    verdict = result.log_verdict
    seconds = max(result.ended - result.started, 1e-9)
    return {
        "verdict": "pass" if result.passed else "fail",
        "failures": result.failures,
        "settings": result.settings.as_dict(),
        "started": result.started,
        "seconds": round(result.ended - result.started, 1),
        "base": result.base,
        "appends": {
            "called": result.history.called,
            "acknowledged": result.history.acked,
            "failed": len(result.history.failed),
            "unresolved": len(result.history.unresolved),
            "rate_per_s": round(result.history.acked / seconds, 1),
            "latency": overall_latency(result),
            "per_minute": per_minute(result),
        },
        "log": {
            "reads": verdict.reads if verdict else 0,
            "failed_but_present": verdict.failed_present if verdict else 0,
            "violations": verdict.counts if verdict else {},
            "examples": verdict.examples if verdict else {},
            "reader_errors": result.history.reader_errors,
        },
        "writer": {"failures": [list(failure) for failure in result.writer_failures]},
        "service_events": result.service_events,
        "faults": {**result.faults, "ledgers_truncated": result.truncated_ledgers},
        "churn": result.churn,
        "growth": {g.name: _growth(g) for g in result.growth},
        "memory": dict(sorted(result.memory.items())),
        "disk": dict(sorted(result.disk.items())),
        "errors": result.errors,
        "timeline": result.timeline,
    }


def _growth(g: Growth) -> dict[str, Any]:
    return {"earlier_peak": g.earlier_peak, "later_peak": g.later_peak, "allowed": g.allowed,
            "ok": g.ok}  # fmt: skip


def write_json(result: SoakResult, path: Path) -> None:
    path.write_text(json.dumps(to_json(result), indent=1) + "\n")


def _at(samples: Sequence[tuple[float, int]], t: float) -> int | None:
    """The sample nearest to time ``t``."""
    if not samples:
        return None
    return min(samples, key=lambda sample: abs(sample[0] - t))[1]


def _series_table(
    title: str, kind: str, series: dict[str, list[tuple[float, int]]], result: SoakResult
) -> list[str]:
    end = result.ended - result.started
    growth = {g.name: g for g in result.growth}
    marks = "".join(f"{f'{p * end / 60:.1f}m':>9}" for p in POINTS)
    lines = [f"{title} (MiB; at {', '.join(f'{p:.0%}' for p in POINTS)} of the run; peak)",
             f"  {'':10}{marks}{'peak':>9}  second half"]  # fmt: skip
    for name, samples in sorted(series.items()):
        in_run = [s for s in samples if s[0] <= end] or samples
        values = "".join(
            f"{(v / MIB if (v := _at(in_run, p * end)) is not None else math.nan):9.1f}"
            for p in POINTS
        )
        peak = max(v for _t, v in in_run) / MIB
        g = growth.get(f"{kind} {name}")
        judged = (
            f"{'ok' if g.ok else 'GROWING'} {g.growth / MIB:+.1f} (allowed {g.allowed / MIB:.1f})"
            if g is not None
            else "not judged"
        )
        lines.append(f"  {name:10}{values}{peak:9.1f}  {judged}")
    return lines


def summary(result: SoakResult) -> str:
    data = to_json(result)
    appends = data["appends"]
    lines = [
        f"soak: {data['seconds'] / 60:.1f} min of load, {appends['called']} appends called, "
        f"{appends['acknowledged']} acknowledged ({appends['rate_per_s']}/s), "
        f"{appends['failed']} failed, {appends['unresolved']} unresolved; "
        f"{data['log']['reads']} records read",
        f"append latency overall: p50 {appends['latency']['p50_ms']} ms, p99 "
        f"{appends['latency']['p99_ms']} ms, p99.9 {appends['latency']['p999_ms']} ms, max "
        f"{appends['latency']['max_ms']} ms",
        "",
        "minute  appends   p50 ms   p99 ms   max ms",
    ]
    lines += [
        f"{row['minute']:6} {row['appends']:8} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} "
        f"{row['max_ms']:8.1f}"
        for row in appends["per_minute"]
    ]
    lines.append("")
    lines += _series_table("memory (RSS)", "memory", result.memory, result)
    lines.append("")
    lines += _series_table("data directories", "disk", result.disk, result)
    lines.append("")
    faults = ", ".join(f"{k} {v}" for k, v in sorted(data["faults"].items()))
    churn = data["churn"]
    lines.append(f"faults and operations: {faults}")
    lines.append(
        f"churn: {churn.get('created', 0)} ledgers created, {churn.get('deleted', 0)} deleted, "
        f"{churn.get('errors', 0)} errors" + (f" (last: {churn['last_error']})"
                                              if churn.get("last_error") else "")
    )  # fmt: skip
    lines.append(
        f"services: {len(result.service_events)} events; writer: {len(result.writer_failures)} "
        f"failed appends; reader: opened again {len(result.history.reader_errors)} times, "
        f"{data['log']['failed_but_present']} failed appends found in the log"
    )
    lines += [f"  {event}" for event in grouped(result.service_events)]
    lines += [f"  reader: {error}" for error in grouped(result.history.reader_errors)]
    lines.append("")
    if result.passed:
        lines.append("verdict: PASS")
    else:
        lines.append(f"verdict: FAIL ({len(result.failures)})")
        lines += [f"  ! {failure}" for failure in result.failures]
    return "\n".join(lines)
