"""Settings from TOML and flags; the CLI's one-line errors; format."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from aiobk.bookie import BookieConfig, ConfigError
from tests.support.cli import aiobk_sync


def test_toml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('[bookie]\ndata_dir = "/d"\nport = 4000\njournal_max_group_wait = 1\n')
    config = BookieConfig.from_toml(str(path), port=5000, host=None)
    assert (config.data_dir, config.port, config.host) == ("/d", 5000, "127.0.0.1")
    assert config.journal_max_group_wait == 1.0
    assert config.journal_path == "/d/journal"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('data_dir = "/d"\nbogus = 1\n', "unknown setting 'bogus'"),
        ('data_dir = "/d"\nport = "x"\n', "port must be an integer"),
        ('data_dir = "/d"\njournal_write_data = 1\n', "true or false"),
        ('data_dir = "/d"\nflush_interval = "soon"\n', "number of seconds"),
        ("data_dir = 5\n", "must be a string"),
        ('data_dir = "/d"\nflush_interval = 0\n', "must be positive"),
        ("data_dir = [\n", "not valid TOML"),
        ("bookie = 3\n", "must be a table"),
        ('data_dir = "/d"\n[autorecovery]\ncolour = 1\n', "unknown setting 'autorecovery.colour'"),
        ('data_dir = "/d"\nautorecovery = 3\n', "autorecovery must be a table"),
        ('data_dir = "/d"\n[autorecovery]\nautorecovery_lease_ttl = "long"\n', "number of"),
        ('data_dir = "/d"\n[autorecovery]\nrereplication_retry_delay = 0\n', "must be positive"),
    ],
)
def test_bad_toml_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        BookieConfig.from_toml(str(path))


@pytest.mark.parametrize(
    "text",
    [
        'data_dir = "/d"\n[autorecovery]\nlost_bookie_recovery_delay = 5\n',
        '[bookie]\ndata_dir = "/d"\n[bookie.autorecovery]\nlost_bookie_recovery_delay = 5\n',
    ],
)
def test_the_autorecovery_table(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(text)
    config = BookieConfig.from_toml(str(path))
    assert config.autorecovery.lost_bookie_recovery_delay == 5.0
    assert config.autorecovery.autorecovery_poll_interval == 2.0  # the rest: defaults


def test_a_flat_autorecovery_key_reads_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('data_dir = "/d"\nlost_bookie_recovery_delay = 5\n')
    with pytest.warns(FutureWarning, match=r"autorecovery\.lost_bookie_recovery_delay"):
        config = BookieConfig.from_toml(str(path))
    assert config.autorecovery.lost_bookie_recovery_delay == 5.0


def test_an_autorecovery_key_both_flat_and_in_the_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(
        'data_dir = "/d"\nlost_bookie_recovery_delay = 5\n'
        "[autorecovery]\nlost_bookie_recovery_delay = 6\n"
    )
    with pytest.raises(ConfigError, match="both flat and under \\[autorecovery\\]"):
        BookieConfig.from_toml(str(path))


def test_flags_name_autorecovery_settings_flat_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('data_dir = "/d"\n[autorecovery]\nlost_bookie_recovery_delay = 5\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = BookieConfig.from_toml(
            str(path), lost_bookie_recovery_delay=7.0, autorecovery_poll_interval=None
        )
        bare = BookieConfig.from_mapping({}, data_dir="/d", autorecovery_lease_ttl=3.0)
    assert config.autorecovery.lost_bookie_recovery_delay == 7.0  # the flag wins
    assert config.autorecovery.autorecovery_poll_interval == 2.0  # None: not given
    assert bare.autorecovery.autorecovery_lease_ttl == 3.0


def test_index_full_snapshot_every_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('data_dir = "/d"\nindex_full_snapshot_every = 32\n')
    with pytest.warns(FutureWarning, match="index_full_snapshot_every is ignored .*: remove it"):
        config = BookieConfig.from_toml(str(path))
    assert config == BookieConfig(data_dir="/d")


def test_a_deprecated_key_is_a_one_line_cli_warning(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text("lost_bookie_recovery_delay = 5\nport = 0\nbogus = 1\n")
    result = aiobk_sync("bookie", "start", "--config", str(path), "--data-dir", str(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"aiobk: warning: {path}: the bookie setting 'lost_bookie_recovery_delay' is deprecated: "
        "set it under [autorecovery] (autorecovery.lost_bookie_recovery_delay)",
        f"aiobk: error: {path}: unknown setting 'bogus'",
    ], result.stderr


def test_an_unknown_autorecovery_key_is_a_one_line_cli_error(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text("[autorecovery]\ncolour = 1\n")
    result = aiobk_sync("bookie", "start", "--config", str(path), "--data-dir", str(tmp_path))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aiobk: error:")
    assert "unknown setting 'autorecovery.colour'" in lines[0]


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match="data_dir is required"):
        BookieConfig(data_dir="")
    with pytest.raises(ConfigError, match="port 70000"):
        BookieConfig(data_dir="/d", port=70000)
    with pytest.raises(ConfigError, match="negative"):
        BookieConfig(data_dir="/d", journal_max_group_wait=-1)
    with pytest.raises(ConfigError, match="max_frame_size must be in 1024"):
        BookieConfig(data_dir="/d", max_frame_size=10)
    # An add must fit one journal record, or replay would refuse it after it was acknowledged.
    with pytest.raises(ConfigError, match="max_frame_size must be in 1024"):
        BookieConfig(data_dir="/d", max_frame_size=64 * 1024 * 1024)
    with pytest.raises(ConfigError, match="above the low water mark"):
        BookieConfig(data_dir="/d", server_write_buffer_high_water_mark=1024)
    with pytest.raises(ConfigError, match="two max_frame_size"):
        BookieConfig(data_dir="/d", max_connection_memory=1024 * 1024)
    with pytest.raises(ConfigError, match="1 TiB"):
        BookieConfig(data_dir="/d", entry_log_max_size=2**41)
    with pytest.raises(ConfigError, match="cannot read"):
        BookieConfig.from_toml("/nonexistent/bookie.toml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bookie", "start", "--port", "99999", "--data-dir", "x"], "--port"),
        (["bookie", "start"], "--data-dir is required"),
        (["bookie", "start", "--config", "/nonexistent.toml"], "cannot read config file"),
        (["bookie", "bogus"], "No such command"),
        (["bookie", "format"], "Missing option '--data-dir'"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = aiobk_sync(*args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aiobk: error:")
    assert message in lines[0]


def test_format_refuses_to_wipe_without_force(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert aiobk_sync("bookie", "format", "--data-dir", str(data)).returncode == 0
    (data / "journal" / "0000000000000000.txn").write_bytes(b"x")
    result = aiobk_sync("bookie", "format", "--data-dir", str(data))
    assert result.returncode != 0
    assert "--force" in result.stderr
    assert (data / "journal" / "0000000000000000.txn").exists()
    assert aiobk_sync("bookie", "format", "--data-dir", str(data), "--force").returncode == 0
    assert list((data / "journal").iterdir()) == []


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = aiobk_sync("bookie", "start", "--port", str(port), "--data-dir", str(tmp_path))
    assert result.returncode != 0
    assert "cannot start bookie" in result.stderr.strip().splitlines()[-1]


def test_journal_less_mode_needs_a_metadata_store(tmp_path: Path) -> None:
    result = aiobk_sync(
        "bookie", "start", "--port", "0", "--data-dir", str(tmp_path), "--no-journal-write-data"
    )
    assert result.returncode != 0
    assert "BP-46" in result.stderr.strip().splitlines()[-1]


async def test_metrics_port_exports_counters(tmp_path: Path) -> None:
    import asyncio
    import urllib.request

    from aiobk.metadata import free_port
    from tests.support.procs import BookieProcess

    metrics = free_port()
    proc = BookieProcess(tmp_path / "data", None, "--metrics-port", str(metrics))
    await proc.start()
    try:
        url = f"http://127.0.0.1:{metrics}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert b"aiobk_bookie_journal_syncs_total" in text
    finally:
        proc.stop()


@pytest.mark.parametrize("made", [False, True], ids=["missing-dir", "empty-dir"])
def test_cookie_show_without_cookies_is_a_one_line_error(tmp_path: Path, made: bool) -> None:
    """`cookie show --data-dir /nonexistent` says there is no cookie and fails, rather than
    printing nulls and exiting 0."""
    data_dir = tmp_path / "never-started"
    if made:
        data_dir.mkdir()
    result = aiobk_sync("cookie", "show", "--data-dir", str(data_dir))
    assert result.returncode != 0, result.stdout
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aiobk: error: ")
    assert str(data_dir) in lines[0]
