"""Placement over failure domains (docs/design/placement.md): pure, seeded, no sockets."""

from __future__ import annotations

import itertools
import random

import pytest

from aiobk.client.config import ClientConfig
from aiobk.client.errors import NotEnoughBookiesError
from aiobk.client.placement import (
    Spread,
    choose_ensemble,
    choose_replacement,
    read_order,
    shortfall,
    spread_of,
    write_sets,
)
from aiobk.metadata import BookieServiceInfo, check_rack, zone_of


def racks_of(layout: dict[str, int]) -> dict[str, str]:
    """``{"/z/r": n}`` -> n bookies in each rack, named after it."""
    return {f"{rack}#{i}": rack for rack, count in layout.items() for i in range(count)}


def test_write_sets_wrap_round_a_striped_ensemble() -> None:
    assert write_sets(3, 3) == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert write_sets(5, 2) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]


def test_one_rack_places_exactly_as_a_cluster_without_racks() -> None:
    """The simulator's traces and every seeded run stay the same where nothing is labelled."""
    bookies = [f"b{i}" for i in range(7)]
    for seed in range(20):
        plain = choose_ensemble(bookies, 3, {"b1"}, random.Random(seed))
        spread = choose_ensemble(
            bookies, 3, {"b1"}, random.Random(seed), write_quorum=2, spread=Spread()
        )
        assert plain == spread
        assert choose_replacement(bookies, plain, (), random.Random(seed)) == choose_replacement(
            bookies, plain, (), random.Random(seed), slot=0, write_quorum=3, spread=Spread()
        )


@pytest.mark.parametrize(
    ("layout", "size", "quorum"),
    [
        ({"/a/1": 3, "/b/2": 3, "/c/3": 3}, 3, 3),
        ({"/a/1": 3, "/b/2": 3, "/c/3": 3}, 3, 2),
        ({"/a/1": 2, "/a/2": 2, "/b/3": 2}, 6, 2),  # wrapping write sets, every bookie used
        ({"/a/1": 3, "/b/2": 3, "/c/3": 3}, 5, 3),
        ({"/a/1": 5, "/b/2": 1}, 3, 3),  # one bookie in the second rack is enough
        ({"/a/1": 4, "/b/2": 4}, 4, 2),
        ({"/a/1": 2, "/b/2": 2, "/c/3": 2, "/d/4": 2}, 7, 3),
    ],
)
def test_every_write_set_spans_the_racks_asked_for(
    layout: dict[str, int], size: int, quorum: int
) -> None:
    racks = racks_of(layout)
    spread = Spread(racks, min_racks=2)
    for seed in range(40):
        ensemble = choose_ensemble(
            sorted(racks), size, (), random.Random(seed), write_quorum=quorum, spread=spread
        )
        assert len(set(ensemble)) == size
        assert spread_of(ensemble, quorum, spread)[0] >= 2, ensemble
        assert shortfall(ensemble, quorum, spread) is None


def test_the_greedy_choice_finds_a_spread_whenever_one_exists() -> None:
    """Every small layout, checked against all orderings of its bookies."""
    for racks_count, per_rack, size in itertools.product(range(2, 4), range(1, 3), range(2, 6)):
        racks = racks_of({f"/z{r % 2}/r{r}": per_rack for r in range(racks_count)})
        if len(racks) < size:
            continue
        for quorum in range(2, size + 1):
            spread = Spread(racks, min_racks=3)
            best = max(
                spread_of(list(order), quorum, spread)
                for order in itertools.permutations(sorted(racks), size)
            )
            for seed in range(5):
                ensemble = choose_ensemble(
                    sorted(racks), size, (), random.Random(seed), write_quorum=quorum, spread=spread
                )
                assert spread_of(ensemble, quorum, spread) >= (*best[:1], 0), (racks, ensemble)


def test_racks_spread_over_zones_too() -> None:
    racks = racks_of({"/east/1": 2, "/east/2": 2, "/west/3": 2, "/west/4": 2})
    spread = Spread(racks, min_racks=2)
    for seed in range(30):
        ensemble = choose_ensemble(
            sorted(racks), 3, (), random.Random(seed), write_quorum=3, spread=spread
        )
        assert spread_of(ensemble, 3, spread) == (3, 2)


def test_a_replacement_keeps_the_write_sets_through_its_slot_spread() -> None:
    racks = racks_of({"/a/1": 3, "/b/2": 3, "/c/3": 3})
    spread = Spread(racks, min_racks=3)
    ensemble = ["/a/1#0", "/b/2#0", "/c/3#0"]
    for seed in range(30):
        chosen = choose_replacement(
            sorted(racks), ensemble, {"/c/3#0"}, random.Random(seed),
            slot=2, write_quorum=3, spread=spread,
        )  # fmt: skip
        assert racks[chosen] == "/c/3"


def test_a_placement_that_cannot_spread_is_refused_when_enforced_and_reported_when_not() -> None:
    racks = racks_of({"/a/1": 4, "/b/2": 1})
    enforced = Spread(racks, min_racks=2, enforce=True)
    with pytest.raises(NotEnoughBookiesError, match="min_racks_per_write_quorum=2") as caught:
        choose_ensemble(sorted(racks), 4, (), random.Random(1), write_quorum=2, spread=enforced)
    assert "\n" not in str(caught.value)
    loose = Spread(racks, min_racks=2)
    ensemble = choose_ensemble(sorted(racks), 4, (), random.Random(1), write_quorum=2, spread=loose)
    assert "spans 1 rack(s)" in (shortfall(ensemble, 2, loose) or "")
    one_rack = Spread({"x": "/a/1", "y": "/a/1"}, min_racks=2, enforce=True)
    with pytest.raises(NotEnoughBookiesError, match="enforce_min_racks"):
        choose_ensemble(["x", "y"], 2, (), random.Random(1), write_quorum=2, spread=one_rack)
    assert shortfall(["x", "y"], 2, Spread({"x": "/a/1", "y": "/a/1"})) is None  # nothing to span


def test_racks_are_checked_and_stored_with_a_registration() -> None:
    assert check_rack("/zone/rack") == "/zone/rack"
    assert zone_of("/zone/rack") == "/zone"
    assert zone_of("/rack") == "/default-zone"
    for bad in ("", "rack", "/", "/a/", "//b", "/a/b/c", "/a b/c"):
        with pytest.raises(ValueError, match="expected /ZONE/RACK"):
            check_rack(bad)
    info = BookieServiceInfo("b:1", "b:1", rack="/z/r")
    assert BookieServiceInfo.from_json(info.to_json()).rack == "/z/r"
    old = b'{"format":1,"bookie_id":"b:1","address":"b:1","state":"writable"}'
    assert BookieServiceInfo.from_json(old).rack == "/default-zone/default-rack"
    with pytest.raises(ValueError, match="min_racks_per_write_quorum"):
        ClientConfig(min_racks_per_write_quorum=0)
    with pytest.raises(ValueError, match="expected /ZONE/RACK"):
        ClientConfig(rack="nowhere")


def test_a_reader_asks_its_own_rack_then_its_zone_first() -> None:
    spread = Spread({"a": "/z1/r1", "b": "/z2/r2", "c": "/z1/r3", "d": "/z1/r1"})
    assert read_order(["b", "c", "a"], "/z1/r1", spread) == ["a", "c", "b"]
    assert read_order(["b", "c", "d", "a"], "/z1/r9", spread) == ["c", "d", "a", "b"]
    assert read_order(["b", "c", "a"], None, spread) == ["b", "c", "a"]
