"""Fixtures for the hostile suite (invariant I16, bounded under hostility:
docs/design/invariants.md).

``launch`` starts bookie processes with a settings file and stops them at the end of the test.
Setting ``HOSTILE_BOOKIE_SRC=DIR`` runs those bookies from source tree DIR (the tests
themselves still import this tree): that is how each test is shown to fail against the code
before the fix, e.g. ``git worktree add /tmp/hostile-before 328e5c4`` then
``HOSTILE_BOOKIE_SRC=/tmp/hostile-before pytest tests/hostile``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hostile.harness import SRC_ENV, BookieUnderTest
from tests.hostile.rawclient import RawConnection

Launch = Callable[..., Awaitable[BookieUnderTest]]
Connect = Callable[[BookieUnderTest], Awaitable[RawConnection]]


@pytest.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Launch]:
    """Start a bookie process: ``await launch(name="b", flush_interval=0.2, ...)``."""
    started: list[BookieUnderTest] = []
    src = os.environ.get(SRC_ENV) or None

    async def start(
        name: str = "bookie", args: tuple[str, ...] = (), **settings: Any
    ) -> BookieUnderTest:
        bookie = BookieUnderTest(tmp_path, settings, name=name, src=src, args=args)
        started.append(bookie)
        await bookie.start()
        return bookie

    yield start
    for bookie in started:
        bookie.stop()


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Open a raw connection to a bookie: ``await connect(bookie)``; all closed at the end,
    whatever the test left them doing."""
    opened: list[RawConnection] = []

    async def open_to(bookie: BookieUnderTest) -> RawConnection:
        conn = await RawConnection.open(bookie.host, bookie.port)
        opened.append(conn)
        return conn

    yield open_to
    for conn in opened:
        conn.abort()
    for conn in opened:  # each transport has seen its close
        with contextlib.suppress(OSError):
            await asyncio.wait_for(conn.writer.wait_closed(), 5)
