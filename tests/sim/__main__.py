"""``make sim`` / ``python -m tests.sim``: one seed replayed with its trace, or a campaign.

    python -m tests.sim --seed 398            # replay one run, print its trace
    python -m tests.sim --seeds 10000         # a campaign from --first (default 0)
    python -m tests.sim --seeds 500 --off recovery_reads_fence --profile race
    python -m tests.sim --seeds 100 --profile offload

Exit code 0 when every run held every invariant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import fields

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tests.sim.nemesis import PROFILES
from tests.sim.run import SimOptions, run_seed, run_seeds
from tests.sim.world import Switches

SWITCHES = [f.name for f in fields(Switches)]


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Set iteration order must not vary between a campaign and its replay.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.sim", *(argv or sys.argv[1:])])
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    parser.add_argument("--seeds", type=int, default=300, help="campaign length")
    parser.add_argument("--first", type=int, default=0, help="first seed of the campaign")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="mixed")
    parser.add_argument(
        "--off",
        action="append",
        default=[],
        choices=SWITCHES,
        help="switch a protection off (repeatable) to see the checker catch it",
    )
    parser.add_argument("--journal-less", choices=("seed", "yes", "no"), default="seed")
    args = parser.parse_args(argv)  # fmt: skip
    options = SimOptions(
        switches=Switches(**dict.fromkeys(args.off, False)),
        profile=args.profile,
        journal_less={"seed": None, "yes": True, "no": False}[args.journal_less],
    )
    console = Console()
    if args.seed is not None:
        result = run_seed(args.seed, options)
        console.print(result.report(), markup=False, highlight=False)
        return 0 if result.ok else 1
    failed = []
    started = time.monotonic()
    acknowledged = refused = unknown = faults = gc_ledgers = gc_logs = gc_moved = 0
    states_loaded = 0
    repairs: dict[str, int] = {}
    produced: dict[str, int] = {}
    offloaded: dict[str, int] = {}
    kinds: dict[str, int] = {}
    with Progress(
        TextColumn("seeds"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"), console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("sim", total=args.seeds, status="")
        for result in run_seeds(range(args.first, args.first + args.seeds), options):
            seed = result.seed
            acknowledged += result.acknowledged
            refused += result.refused
            unknown += result.unknown
            gc_ledgers += result.gc_ledgers
            gc_logs += result.gc_logs
            gc_moved += result.gc_moved
            states_loaded += result.states_loaded
            faults += sum(result.faults.values())
            for name, count in result.repairs.items():
                repairs[name] = repairs.get(name, 0) + count
            for name, count in result.producers.items():
                produced[name] = produced.get(name, 0) + count
            for name, count in result.offload.items():
                offloaded[name] = offloaded.get(name, 0) + count
            for kind, count in result.faults.items():
                kinds[kind] = kinds.get(kind, 0) + count
            if not result.ok:
                failed.append(result)
                progress.console.print(
                    f"seed {seed}: {result.violations[0]}", markup=False, highlight=False
                )
            progress.update(task, advance=1, status=f"{len(failed)} failing")
    elapsed = time.monotonic() - started
    console.print(
        f"{args.seeds} seeds in {elapsed:.0f}s ({60 * args.seeds / elapsed:.0f} seeds/min): "
        f"appends {acknowledged} ok, {refused} failed, {unknown} unknown; {faults} faults; "
        f"gc dropped {gc_ledgers} ledger copies and {gc_logs} entry logs, moving {gc_moved} "
        f"entries; {states_loaded} ledger states read back from the index; {len(failed)} failing",
        highlight=False,
    )
    if repairs:  # the loss profiles
        console.print(
            "autorecovery: " + ", ".join(f"{name} {count}" for name, count in repairs.items()),
            highlight=False,
        )
        console.print(
            "faults: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())),
            highlight=False,
        )
    if produced:  # the producers profile
        console.print(
            "producer appends: " + ", ".join(f"{name} {n}" for name, n in produced.items()),
            highlight=False,
        )
    if offloaded:  # the offload profile: ledger states at the end, and the store's faults
        console.print(
            "offload: " + ", ".join(f"{name} {n}" for name, n in offloaded.items()),
            highlight=False,
        )
    for result in failed[:3]:
        console.print(result.report(), markup=False, highlight=False)
    if failed:
        console.print("replay one with: make sim SEED=" + str(failed[0].seed), highlight=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
