"""One log format for every command (``--log-level``, ``log_level`` in a bookie's config)."""

from __future__ import annotations

import logging

LOG_LEVELS = ("debug", "info", "warning", "error")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str) -> None:
    """One format for every command; each layer logs under its own name (``aiobk.bookie.*``,
    ``aiobk.client.*``, ``aiobk.metadata.*``), so ``logging.getLogger("aiobk.client")`` tunes
    one of them."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
