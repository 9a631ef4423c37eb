"""``make chaos``: real-process chaos runs, with the journal and without.

python -m tests.chaos --seconds 60 --faults 30 --wipes 2

``--wipes N``: at most N kill-and-wipe-forever faults per run (a bookie SIGKILLed, its
directory deleted, a new one started in its place; the next only once autorecovery has
repaired the last), 0 for none.
"""

from __future__ import annotations

import argparse
import sys

import uvloop

from tests.chaos.run import run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wipes", type=int, default=2)
    parser.add_argument("--mode", choices=("both", "journal", "journal-less"), default="both")
    args = parser.parse_args()
    modes = {"both": (False, True), "journal": (False,), "journal-less": (True,)}[args.mode]
    failed = False
    for journal_less in modes:
        result = uvloop.run(
            run_chaos(args.seconds, args.faults, journal_less=journal_less,
                      bookies=args.bookies, seed=args.seed, wipes=args.wipes)
        )  # fmt: skip
        print(result.summary())
        for violation in result.violations[:20]:
            print("  !", violation)
        if result.violations:
            failed = True
            print("\n".join(result.log))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
