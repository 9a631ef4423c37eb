"""Waiting for a state the test cannot be told about: one poll loop with one deadline.

``wait_until`` has its deadline on the loop's clock (``asyncio.timeout``), so it serves real
clusters, the in-process fakes and a virtual-time loop alike. ``every=0`` looks again on each
turn of the loop, which is what the fakes need: their state moves without any time passing.
``wait_until_sync`` is its twin for plain test functions watching child processes from a
thread with no event loop: the same arguments, its deadline on ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

What = str | Callable[[], str]


def _said(what: What) -> str:
    return what() if callable(what) else what


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    every: float = 0.05,
    what: What = "",
) -> None:
    """Return once ``condition()`` holds (awaited when it returns an awaitable).

    Fails the test with ``AssertionError`` when it does not hold within ``timeout`` seconds,
    naming ``what`` (a callable is asked at the deadline: say, for the output seen so far).
    """
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            while True:
                result = condition()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(every)
    except TimeoutError:
        if not deadline.expired():
            raise  # the condition's own timeout, not this deadline
        raise AssertionError(f"not within {timeout:g}s: {_said(what)}") from None


def wait_until_sync(
    condition: Callable[[], bool],
    *,
    timeout: float = 10.0,
    every: float = 0.05,
    what: What = "",
) -> None:
    """Return once ``condition()`` holds, looking every ``every`` seconds and once more at
    the deadline.

    Fails the test with ``AssertionError`` when it does not hold within ``timeout`` seconds,
    naming ``what`` (a callable is asked at the deadline). An assertion the condition itself
    makes (say, that the process it watches still runs) fails the test at once.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"not within {timeout:g}s: {_said(what)}")
        time.sleep(min(every, left))
