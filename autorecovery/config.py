"""Autorecovery settings: ``AutoRecoveryConfig`` (defined in
``aiobk.metadata.autorecovery_config``, the layer the bookie's config can import too: a
bookie's TOML holds the same settings as its ``[autorecovery]`` table), and what the auditor
publishes of them.
"""

from __future__ import annotations

from aiobk.metadata.autorecovery_config import AutoRecoveryConfig

# What the auditor publishes of its settings (``AuditorStatus.settings``): what an explanation
# needs to say when a wait ends.
PUBLISHED = (
    "lost_bookie_recovery_delay",
    "open_ledger_rereplication_grace_period",
    "rereplication_max_bytes_per_second",
    "rereplication_retry_delay",
    "autorecovery_poll_interval",
    "min_racks_per_write_quorum",
)


def published_settings(config: AutoRecoveryConfig) -> dict[str, float]:
    return {name: float(getattr(config, name)) for name in PUBLISHED}


__all__ = ["PUBLISHED", "AutoRecoveryConfig", "published_settings"]
