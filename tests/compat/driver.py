"""One side of a compatibility test: a script of client steps, run with the public API only.

The same code runs on two versions. The tests import ``run_steps`` and run it in their own
process against this tree's client; as a program, with ``PYTHONPATH`` set to a release's source
tree, it runs the release's client::

    PYTHONPATH=/tmp/release-0.1.0 PYTHONSAFEPATH=1 python tests/compat/driver.py < script.json

The script is a JSON object ``{"metadata": URI, "config": {ClientConfig fields},
"steps": [...]}``; the program prints ``{"results": [...]}`` (one result per step run) as JSON
on stdout, plus ``"failed"`` (the step's index) and ``"error"`` when a step raised. A step with
``"expect_error": true`` records its exception as its result and the script goes on.

It imports nothing but the names of the public contract (``aiobk.BookKeeper``,
``ClientConfig``, ``Durability``, ``LogPosition``), so it stays runnable on older releases.
Payloads are ASCII text, so results compare as strings.

Steps (``op``; handles are named by ``as`` and looked up by ``ledger`` / ``handle``):

- ``create``: ``as``, ``ensemble`` [E, WQ, AQ], ``durability`` (persistent | volatile),
  ``password``, ``custom`` (custom metadata) -> ``ledger_id``
- ``append``: ``ledger``, ``payloads`` (appended concurrently, in call order) -> ``entry_ids``
- ``force``: ``ledger`` -> ``lac``;  ``close``: ``ledger`` (a handle from create or open)
- ``open``: ``as``, ``ledger_id`` (or ``ledger``: a handle's), ``password``, ``recovery``
  -> ``ledger_id``, ``closed``, ``lac``
- ``read``: ``handle``, ``first`` (default 0), ``last`` (default the LAC) -> ``data``
- ``read_lac``: ``handle`` -> ``lac``
- ``log_write``: ``log``, ``records`` (``data`` and optional ``key``, ``headers``),
  ``options`` (open_log_writer's keywords), ``close`` (default true; when false, the writer
  is kept open, and the step waits as ``await_lac`` does) -> ``positions``
- ``log_read``: ``log``, ``start`` ([ledger, entry], default the earliest) -> ``records``
- ``log_truncate``: ``log``, ``before`` [ledger, entry] -> ``deleted``
- ``await_lac``: ``ledger``, ``password``: until the bookies report the LAC of every entry
  appended (an idle writer's explicit LAC), or the ledger is closed past it -> ``lac``
- ``exit``: end the process at once, closing nothing (a client that dies mid-work)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from typing import Any

from aiobk import BookKeeper, ClientConfig, Durability, LogPosition

SETTLE_TIMEOUT = 20.0  # seconds for an idle writer's explicit LAC to reach the bookies
Step = dict[str, Any]
Result = dict[str, Any]


class ScriptError(Exception):
    """A step raised; ``results`` holds those of the steps before it."""

    def __init__(self, index: int, step: Step, cause: BaseException, results: list[Result]):
        super().__init__(f"step {index} ({step['op']}): {type(cause).__name__}: {cause}")
        self.index = index
        self.results = results


def _text(data: bytes) -> str:
    return data.decode("ascii")


def _position(pair: list[int] | None) -> LogPosition:
    return LogPosition.EARLIEST if pair is None else LogPosition(pair[0], pair[1])


class _Runner:
    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk
        self.handles: dict[str, Any] = {}

    async def create(self, step: Step) -> Result:
        ensemble, write_quorum, ack_quorum = step.get("ensemble", (3, 3, 2))
        handle = await self.bk.create_ledger(
            ensemble,
            write_quorum,
            ack_quorum,
            password=step.get("password", "").encode(),
            durability=Durability[step.get("durability", "persistent").upper()],
            custom_metadata={k: v.encode() for k, v in step.get("custom", {}).items()},
        )
        self.handles[step["as"]] = handle
        return {"ledger_id": handle.ledger_id}

    async def append(self, step: Step) -> Result:
        handle = self.handles[step["ledger"]]
        ids = await asyncio.gather(*(handle.append(p.encode()) for p in step["payloads"]))
        return {"entry_ids": list(ids)}

    async def force(self, step: Step) -> Result:
        return {"lac": await self.handles[step["ledger"]].force()}

    async def close(self, step: Step) -> Result:
        await self.handles[step["ledger"]].close()
        return {}

    async def open(self, step: Step) -> Result:
        ledger_id = step.get("ledger_id")
        if ledger_id is None:
            ledger_id = self.handles[step["ledger"]].ledger_id
        handle = await self.bk.open_ledger(
            ledger_id,
            password=step.get("password", "").encode(),
            recovery=step.get("recovery", True),
        )
        self.handles[step["as"]] = handle
        return {
            "ledger_id": ledger_id,
            "closed": handle.is_closed,
            "lac": handle.last_add_confirmed,
        }

    async def read(self, step: Step) -> Result:
        handle = self.handles[step["handle"]]
        last = step.get("last", handle.last_add_confirmed)
        entries = await handle.read(step.get("first", 0), last) if last >= 0 else []
        return {"data": [_text(entry.data) for entry in entries]}

    async def read_lac(self, step: Step) -> Result:
        return {"lac": await self.handles[step["handle"]].read_last_add_confirmed()}

    async def await_lac(self, step: Step) -> Result:
        handle = self.handles[step["ledger"]]
        password = step.get("password", "").encode()
        return {"lac": await self._settled(handle.ledger_id, password, handle.last_add_pushed)}

    async def _settled(self, ledger_id: int, password: bytes, last: int) -> int:
        """Until ``last`` is confirmed to a reader that does not fence: the bookies report it as
        the ledger's LAC (an idle writer sends it on its own, the explicit LAC), or the ledger
        was closed at or after it (a log writer rolls as soon as a ledger is full)."""
        async with asyncio.timeout(SETTLE_TIMEOUT):
            while True:
                reader = await self.bk.open_ledger(ledger_id, password=password, recovery=False)
                try:
                    if reader.is_closed:
                        lac = reader.last_add_confirmed
                    else:
                        lac = await reader.read_last_add_confirmed()
                finally:
                    await reader.close()
                if lac >= last:
                    return lac
                await asyncio.sleep(0.02)

    async def log_write(self, step: Step) -> Result:
        writer = await self.bk.open_log_writer(step["log"], **step.get("options", {}))
        positions = []
        for record in step["records"]:
            extra: dict[str, Any] = {}
            if "key" in record:
                extra["key"] = record["key"].encode()
            if "headers" in record:
                extra["headers"] = {k: v.encode() for k, v in record["headers"].items()}
            position = await writer.append(record["data"].encode(), **extra)
            positions.append([position.ledger_id, position.entry_id])
        if step.get("close", True):
            await writer.close()
        else:
            self.handles[step["log"]] = writer  # kept open, never closed
            last = positions[-1]
            await self._settled(last[0], b"", last[1])
        return {"positions": positions}

    async def log_read(self, step: Step) -> Result:
        reader = await self.bk.open_log_reader(
            step["log"], _position(step.get("start")), follow=False
        )
        records = []
        async for record in reader:
            key = record.key
            records.append(
                {
                    "position": [record.position.ledger_id, record.position.entry_id],
                    "data": _text(record.data),
                    "key": None if key is None else _text(key),
                    "headers": {k: _text(v) for k, v in record.headers.items()},
                }
            )
        return {"records": records}

    async def log_truncate(self, step: Step) -> Result:
        deleted = await self.bk.truncate_log(step["log"], _position(step["before"]))
        return {"deleted": list(deleted)}


async def run_steps(bk: BookKeeper, steps: list[Step]) -> list[Result]:
    """Run ``steps`` with client ``bk``; their results (``ScriptError`` when one raises)."""
    runner = _Runner(bk)
    results: list[Result] = []
    for index, step in enumerate(steps):
        try:
            results.append(await getattr(runner, step["op"])(step))
        except Exception as exc:
            if not step.get("expect_error"):
                raise ScriptError(index, step, exc, results) from exc
            results.append({"error": type(exc).__name__, "message": str(exc)})
    return results


def _emit(output: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(output) + "\n")
    sys.stdout.flush()


async def _main(script: dict[str, Any]) -> int:
    steps: list[Step] = script["steps"]
    config = ClientConfig(**script.get("config", {}))
    exits = [i for i, step in enumerate(steps) if step["op"] == "exit"]
    if exits:
        steps = steps[: exits[0]]
    bk = await BookKeeper.connect(script["metadata"], config=config)
    try:
        results = await run_steps(bk, steps)
    except ScriptError as exc:
        _emit({"results": exc.results, "failed": exc.index, "error": str(exc)})
        traceback.print_exc()
        return 1
    _emit({"results": results})
    if exits:
        os._exit(0)  # no close of anything: the handles and writers stay open in the metadata
    await bk.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(json.loads(sys.stdin.read()))))
