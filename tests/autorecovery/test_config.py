"""Autorecovery's settings: the bookie's TOML takes each under the same name and default (the
two dataclasses sit in layers that cannot import each other), and bad values are refused."""

from __future__ import annotations

import dataclasses

import pytest

from aiobk.autorecovery import AutoRecoveryConfig
from aiobk.bookie import BookieConfig, ConfigError


def test_every_setting_is_a_bookie_setting_with_the_same_default() -> None:
    bookie = {f.name: f.default for f in dataclasses.fields(BookieConfig)}
    for f in dataclasses.fields(AutoRecoveryConfig):
        assert f.name in bookie, f.name
        assert bookie[f.name] == f.default, f.name
    assert bookie["autorecovery_enabled"] is True


def test_a_bookies_settings_hand_over_whole() -> None:
    config = BookieConfig(
        data_dir="/d", lost_bookie_recovery_delay=5.0, rereplication_entries_in_flight=8
    )
    handed = AutoRecoveryConfig.from_settings(config)
    assert handed.lost_bookie_recovery_delay == 5.0
    assert handed.rereplication_entries_in_flight == 8


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
        BookieConfig(data_dir="/d", **{name: value})
