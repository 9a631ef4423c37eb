"""``make soak``: python -m tests.soak --minutes 60 [--report PATH]

Runs the soak (see the package doc) for ``--minutes`` of load, writes the JSON report to
``--report`` and prints the summary; exits 1 when any check failed. Ctrl-C (or SIGTERM) ends
the load early and judges what ran; a second one abandons the run. The processes' data goes
to a new directory under ``--dir`` (default: the system's temporary directory), removed at the
end; a failed run leaves the logs there (``--keep``: the data too).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
from pathlib import Path

import uvloop

from tests.soak.report import summary, write_json
from tests.soak.run import SoakResult, run_soak
from tests.soak.settings import SoakSettings


async def soak(settings: SoakSettings, base: Path, keep: bool) -> SoakResult:
    """The run. A first SIGINT or SIGTERM ends the load early (the end and the judgement
    still run, the report is written); a second one cancels it (the teardown still runs)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    finish = asyncio.Event()

    def interrupted() -> None:
        if finish.is_set():
            task.cancel()
        else:
            print("soak: finishing early (again to abandon the run)", file=sys.stderr)
            finish.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, interrupted)
    return await run_soak(settings, base, keep=keep, finish=finish)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak")
    parser.add_argument("--minutes", type=float, default=5.0, help="of load (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--report", type=Path, default=Path(tempfile.gettempdir()) / "aiobk-soak-report.json"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the run's directory goes")
    parser.add_argument("--keep", action="store_true", help="keep the data directories")
    parser.add_argument("--rate", type=float, default=None, help="appends per second (400)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    changes = {"seed": args.seed} | ({"rate": args.rate} if args.rate else {})
    settings = SoakSettings.scaled(args.minutes * 60, **changes)
    base = Path(tempfile.mkdtemp(prefix="aiobk-soak-", dir=args.dir))
    print(f"soak: {args.minutes:g} min in {base}; report to {args.report}", flush=True)
    try:
        result = uvloop.run(soak(settings, base, args.keep))
    except asyncio.CancelledError:
        print("soak: interrupted", file=sys.stderr)
        return 2
    write_json(result, args.report)
    print(summary(result))
    if not result.passed:
        print(f"logs: {base}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
