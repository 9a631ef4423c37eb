"""``aiobk bench scale``'s floor: every pread of the floor file reads a page no pread of the run
read before, across phases -- a cache under a virtual disk keeps the pages read, and a floor
that re-read them measured a third of a cold read (bench/cold_reads.py, ``Floor``)."""

from __future__ import annotations

from pathlib import Path

from aiobk.bench.cold_reads import FLOOR_PAGES, ColdPreads, Floor


def test_the_floor_hands_out_every_page_once_in_a_random_order() -> None:
    floor = Floor.of("floor.bin")
    offsets = [floor.take() for _ in range(FLOOR_PAGES)]
    assert sorted(offsets) == [page * 4096 for page in range(FLOOR_PAGES)]
    assert offsets[:100] != sorted(offsets[:100])  # not in file order (no readahead helps)
    assert Floor.of("floor.bin").pages == Floor.of("floor.bin").pages  # the same run to run


def test_two_phases_of_cold_preads_never_read_a_page_twice(tmp_path: Path) -> None:
    path = tmp_path / "floor.bin"
    with open(path, "wb") as out:
        out.truncate(FLOOR_PAGES * 4096)  # sparse: the offsets matter here, not the disk
    floor = Floor.of(str(path))
    taken: list[int] = []
    take = floor.take

    def recording() -> int:
        taken.append(take())
        return taken[-1]

    floor.take = recording  # type: ignore[method-assign]
    for _phase in range(2):  # the request-path reads' floor, then the storage reads'
        preads = ColdPreads(floor)
        for _ in range(500):
            preads.sample()
        assert preads.close() >= 1
    assert len(taken) == len(set(taken)) == 1000
