"""A held lease's keep-alive loop: whatever a refresh raises, the loop goes on or reports the
lease lost -- it never ends unheard, leaving the holder to believe in a lease that lapsed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiobk.metadata.kv import KV
from aiobk.metadata.lease import HeldLease


class _Refreshes:
    """keep_alive answers, in order: an exception is raised, a number is the remaining TTL."""

    def __init__(self, *answers: float | BaseException) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.third = asyncio.Event()  # set at the third refresh

    async def keep_alive(self, lease: int) -> float:
        self.calls += 1
        if self.calls == 3:
            self.third.set()
        answer = self.answers.pop(0) if self.answers else 30.0
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_an_unexpected_refresh_error_is_retried_not_the_end_of_the_loop() -> None:
    kv = _Refreshes(RuntimeError("a channel closed under the call"), 30.0, 30.0)
    lease = HeldLease(cast(KV, cast(Any, kv)), 7, 0.3, "test")
    await asyncio.wait_for(kv.third.wait(), 5)  # a refresh every 0.1 s, the first failed
    assert not lease.lost.is_set()
    await lease.abandon()


async def test_refreshes_failing_past_the_ttl_lose_the_lease() -> None:
    kv = _Refreshes(*[RuntimeError("down")] * 100)
    lease = HeldLease(cast(KV, cast(Any, kv)), 7, 0.3, "test")
    await asyncio.wait_for(lease.lost.wait(), 2.0)
