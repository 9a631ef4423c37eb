"""Waiting for a state the test cannot be told about: one poll loop with one deadline.

The deadline is on the loop's clock (``asyncio.timeout``), so the same helper serves real
clusters, the in-process fakes and a virtual-time loop. ``every=0`` looks again on each turn
of the loop, which is what the fakes need: their state moves without any time passing.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 10.0,
    every: float = 0.05,
    what: str = "",
) -> None:
    """Return once ``condition()`` holds (awaited when it returns an awaitable).

    Fails the test with ``AssertionError`` when it does not hold within ``timeout`` seconds.
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
        raise AssertionError(f"not within {timeout:g}s: {what}") from None
