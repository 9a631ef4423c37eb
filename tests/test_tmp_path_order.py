"""A test's temporary directory outlives every fixture the test asks for: the suite removes a
passing test's ``tmp_path`` (``tmp_path_retention_policy = "failed"``), and a fixture that still
has bookies running on it when the directory goes finds their files gone as they stop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def held_dirs() -> Iterator[list[Path]]:
    """Set up before ``tmp_path`` (asked for first) and needing it until its own teardown ends,
    as the tests' cluster lists do."""
    dirs: list[Path] = []
    yield dirs
    for path in dirs:
        assert (path / "data").read_bytes() == b"still here", path


@pytest.mark.timeout(10)
def test_tmp_path_is_removed_after_a_fixture_asked_for_before_it(
    held_dirs: list[Path], tmp_path: Path
) -> None:
    (tmp_path / "data").write_bytes(b"still here")
    held_dirs.append(tmp_path)
