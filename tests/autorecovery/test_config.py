"""Autorecovery's settings: one class, which the bookie's config holds whole (its
``[autorecovery]`` table), and bad values are refused by both."""

from __future__ import annotations

import pytest

from aiobk.autorecovery import AutoRecoveryConfig
from aiobk.bookie import BookieConfig, ConfigError
from aiobk.metadata.autorecovery import AutoRecoveryConfig as DefinedBelowBoth


def test_one_class_held_whole_by_the_bookie_config() -> None:
    assert AutoRecoveryConfig is DefinedBelowBoth
    config = BookieConfig(data_dir="/d")
    assert config.autorecovery == AutoRecoveryConfig()
    assert config.autorecovery_enabled is True


def test_a_bookies_settings_hand_over_whole() -> None:
    config = BookieConfig.from_mapping(
        {}, data_dir="/d", lost_bookie_recovery_delay=5.0, rereplication_entries_in_flight=8
    )
    assert config.autorecovery.lost_bookie_recovery_delay == 5.0
    assert config.autorecovery.rereplication_entries_in_flight == 8


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("lost_bookie_recovery_delay", -1.0),
        ("rereplication_entries_in_flight", 0),
        ("autorecovery_poll_interval", 0.0),
        ("auditor_ledger_verification_percentage", 101.0),
    ],
)
def test_bad_values_are_refused_by_both(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        AutoRecoveryConfig(**{name: value})
    with pytest.raises(ConfigError, match=name):
        BookieConfig.from_mapping({}, data_dir="/d", **{name: value})
    with pytest.raises(ConfigError, match=name):
        BookieConfig.from_mapping({"data_dir": "/d", "autorecovery": {name: value}})
