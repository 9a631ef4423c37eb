"""What the benchmarks share about their command line, their targets and their results.

A benchmark is a measurement, not a test: it prints each target it checks as PASS or MISS and
ends with one line that says how many were missed, and it exits 0 either way (a shared 2-core
machine misses latency targets for reasons of its own). ``--fail-on-miss`` makes a missed
target exit 1, for a script that wants to gate on it.

Each writes its report as JSON (``write_report``: under ``bench/results/`` unless ``--json``
names a file) and runs as ``python -m aiobk.bench.NAME`` through ``module_main``, the same
click command as ``aiobk bench NAME``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from aiobk.commands.common import run_group, with_log_level

MISSED_EXIT_CODE = 1  # with --fail-on-miss
F = TypeVar("F", bound=Callable[..., Any])


def positive_numbers(
    kind: Callable[[str], float], what: str, *, required: bool = False
) -> Callable[[click.Context | None, click.Parameter | None, str], list[float]]:
    """A click callback: ``--rates 400,2000`` as a list of positive numbers ('' for none,
    unless ``required``)."""

    def parse(
        _ctx: click.Context | None, _param: click.Parameter | None, value: str
    ) -> list[float]:
        try:
            numbers = [kind(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise click.BadParameter(f"expected a comma list of {what}, got {value!r}") from None
        if (required and not numbers) or any(not number > 0 for number in numbers):
            raise click.BadParameter(f"expected positive {what}, got {value!r}")
        return numbers

    return parse


# ``--in-flight 1,64,512``: positive ints (a click callback).
parse_levels = positive_numbers(int, "integers", required=True)


def load_options(levels: str, what: str) -> Callable[[F], F]:
    """``--seconds``, ``--entry-size`` and ``--in-flight``, as every load benchmark takes them
    (``levels``: the default in-flight levels; ``what``: what is kept in flight)."""
    seconds = click.option(
        "--seconds", type=click.FloatRange(min=0, min_open=True), default=5.0,
        show_default=True, help="Per in-flight level.",
    )  # fmt: skip
    entry_size = click.option(
        "--entry-size", type=click.IntRange(1), default=1024, show_default=True, help="Bytes."
    )
    in_flight = click.option(
        "--in-flight", "levels", default=levels, show_default=True, callback=parse_levels,
        help=f"Comma list of {what} kept in flight, one level after the other.",
    )  # fmt: skip

    def decorate(function: F) -> F:
        return seconds(entry_size(in_flight(function)))

    return decorate


def entries_option(default: int = 10) -> Callable[[F], F]:
    return click.option(
        "--entries", type=click.IntRange(min=1), default=default, show_default=True,
        help="Entries per ledger.",
    )  # fmt: skip


def dir_option(what: str, default: str = "a temporary directory") -> Callable[[F], F]:
    """``--dir``: where a run's files (``what``) go."""
    return click.option(
        "--dir", "directory", type=click.Path(file_okay=False), default=None,
        help=f"Where {what} go (default: {default}).",
    )  # fmt: skip


def json_option(name: str) -> Callable[[F], F]:
    """``--json``: where ``write_report`` puts benchmark ``name``'s report."""
    return click.option(
        "--json", "json_path", type=click.Path(dir_okay=False), default=None,
        help=f"Result file (default bench/results/{name}-TIMESTAMP.json).",
    )  # fmt: skip


def fail_on_miss_option() -> Callable[[F], F]:
    return click.option(
        "--fail-on-miss",
        is_flag=True,
        help="Exit 1 when a target is missed (by default a benchmark reports and exits 0).",
    )


def summary(checks: list[dict[str, Any]], fail_on_miss: bool = False) -> str:
    """The last line of a benchmark's output."""
    missed = sum(1 for check in checks if not check["pass"])
    if not checks:
        return "no target checked at these in-flight levels"
    if not missed:
        return f"all {len(checks)} targets met" if len(checks) > 1 else "the target was met"
    noun = "target" if len(checks) == 1 else "targets"
    why = "--fail-on-miss: exit 1" if fail_on_miss else "a benchmark reports, it does not fail"
    return f"{missed} of {len(checks)} {noun} missed ({why})"


def report_checks(console: Console, checks: list[dict[str, Any]], fail_on_miss: bool) -> int:
    """Print each check, then the summary line last; the exit code."""
    for check in checks:
        mark = "[green]PASS[/green]" if check["pass"] else "[red]MISS[/red]"
        detail = {k: v for k, v in check.items() if k not in ("target", "pass")}
        console.print(f"{mark} {escape(str(check['target']))}: {escape(str(detail))}")
    console.print(escape(summary(checks, fail_on_miss)))
    missed = any(not check["pass"] for check in checks)
    return MISSED_EXIT_CODE if missed and fail_on_miss else 0


def write_report(name: str, report: dict[str, Any], json_path: str | None) -> str:
    """``report`` as JSON at ``json_path``, by default ``bench/results/NAME-<local time>.json``
    (its directory made if missing); the path written."""
    path = json_path or os.path.join(
        "bench", "results", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        json.dump(report, handle, indent=2)
    return path


class ModuleMain(Protocol):
    def __call__(self, argv: list[str] | None = None) -> None: ...


def module_main(command: click.Command, name: str) -> ModuleMain:
    """The ``main`` of ``python -m aiobk.bench.NAME``: ``command`` (given ``--log-level``, as
    every long-running aiobk command) with that program name."""
    with_log_level(command)

    def main(argv: list[str] | None = None) -> None:
        run_group(command, f"python -m aiobk.bench.{name}", argv)

    main.__doc__ = f"``python -m aiobk.bench.{name}``: the same command as ``aiobk bench``'s."
    return main
