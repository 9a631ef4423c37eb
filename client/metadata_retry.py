"""Riding out an unreachable metadata store.

A writer that must change its ensemble, or close, while etcd restarts or elects a leader should
not fail its ledger for a blip: a ``MetadataStoreError`` is retried with capped exponential
backoff until ``ClientConfig.metadata_retry_timeout`` has passed since the operation began, then
re-raised. Only store unavailability is retried here; a lost compare-and-set
(``MetadataVersionError``) is the caller's business (re-read, decide), as before. A retried
compare-and-set whose first attempt did land comes back as a version error, which the callers
already resolve by reading the metadata again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiobk.client.config import ClientConfig
from aiobk.protocol.errors import MetadataStoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF_MIN = 0.05  # seconds before the first retry
BACKOFF_MAX = 1.0  # ... doubling up to this


def next_backoff(backoff: float) -> float:
    return min(backoff * 2, BACKOFF_MAX)


class MetadataRetry:
    """One operation's retry budget: every ``call`` shares the deadline set at construction."""

    def __init__(self, config: ClientConfig, what: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = config.metadata_retry_timeout
        self._deadline = self._loop.time() + self._timeout
        self._backoff = BACKOFF_MIN
        self._what = what

    async def call(self, step: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()``, again after a backoff for as long as the store is unreachable and the
        deadline has not passed; then the last ``MetadataStoreError``."""
        while True:
            try:
                return await fn()
            except MetadataStoreError as exc:
                left = self._deadline - self._loop.time()
                if left <= 0:
                    raise MetadataStoreError(
                        f"{self._what}: metadata store unreachable for "
                        f"{self._timeout:g}s (metadata_retry_timeout) at {step}: {exc}"
                    ) from exc
                log.warning(
                    "%s: metadata store unreachable at %s (%s); retrying for %.1fs more",
                    self._what, step, exc, left,
                )  # fmt: skip
                await asyncio.sleep(min(self._backoff, left))
                self._backoff = next_backoff(self._backoff)
