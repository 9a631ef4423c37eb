"""The fdatasync floors do the journal's disk work: overwrites of preallocated blocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiobk.bench import floors
from aiobk.bench.floors import BLOCK, fdatasync_floor, preallocated, quorum_fdatasync_floor


def test_preallocated_file_has_its_blocks(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    fd = preallocated(path, 3 * BLOCK + 100)
    try:
        info = os.fstat(fd)
        assert info.st_size == 3 * BLOCK + 100
        assert info.st_blocks * 512 >= info.st_size  # allocated, not a sparse hole
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
def test_floors_sync_without_growing_their_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every timed fdatasync finds its file at the size it was preallocated to: nothing but
    data to commit (a growing file's fdatasync writes its inode too, and the floor was that
    much more generous than the journal's own disk work)."""
    sizes: list[int] = []
    real = os.fdatasync

    def watched(fd: int) -> None:
        sizes.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(floors.os, "fdatasync", watched)
    single = fdatasync_floor(str(tmp_path), 20)
    assert single.get_total_count() == 20
    assert sizes == [20 * BLOCK] * 20
    sizes.clear()
    quorum = quorum_fdatasync_floor(str(tmp_path), writers=3, kth=2, count=10)
    assert quorum.get_total_count() == 10
    assert sizes == [10 * BLOCK] * 30
    assert list(tmp_path.iterdir()) == []  # the floors' files are gone
