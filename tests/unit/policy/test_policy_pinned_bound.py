"""driver/policy/pinned.py: the repacking bound in which only movable pods may move."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

import pytest

from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.placement.occupancy import Occupancy
from driver.policy.bound import RepackingBound
from driver.policy.model import GpuRef
from driver.policy.pinned import PinnedBound, Slot


def _gpus(model: str, count: int) -> list[tuple[GpuRef, GpuCatalog]]:
    catalog = simulated_catalog(model)
    return [(GpuRef(f"n{i // 2}", i % 2), catalog) for i in range(count)]


def _stream(seed: int, pods: int, menu: list[int]) -> list[tuple[str, tuple[int, ...], float, float]]:
    """(name, sizes, arrival, end): a busy stream, so that admissions need the program."""
    rng = random.Random(seed)
    now, out = 0.0, []
    for i in range(pods):
        now += rng.expovariate(1.0)
        sizes = (rng.choice(menu),) * (2 if rng.random() < 0.15 else 1)
        out.append((f"p{i}", sizes, now, now + rng.expovariate(1 / 6)))
    return out


def _replay(
    stream: list[tuple[str, tuple[int, ...], float, float]],
    admit: Callable[[str, tuple[int, ...]], bool],
    release: Callable[[str], None],
) -> list[bool]:
    live: dict[str, float] = {}
    decisions = []
    for name, sizes, arrival, end in stream:
        for gone in [n for n, e in live.items() if e <= arrival]:
            release(gone)
            del live[gone]
        ok = admit(name, sizes)
        decisions.append(ok)
        if ok:
            live[name] = end
    return decisions


@pytest.mark.parametrize("model", ["A100-40GB", "H100-80GB"])
def test_every_pod_movable_decides_like_the_full_bound(model: str) -> None:
    gpus = _gpus(model, 3)
    catalog = gpus[0][1]
    menu = sorted({p.memory_mib - 100 for p in catalog.profiles})
    for seed in range(3):
        stream = _stream(seed, 150, menu)
        full = RepackingBound([c for _, c in gpus])
        pinned = PinnedBound(gpus)
        expected = _replay(stream, full.admit, full.release)
        got = _replay(stream, partial(pinned.admit, movable=True), pinned.release)
        assert got == expected
        assert 0 < sum(got) < len(got)  # some refused: the stream tests the bound, not an empty cluster
        assert pinned.programs_run > 0 and pinned.replaced > 0


def test_no_pod_movable_never_moves_a_running_pod() -> None:
    gpus = _gpus("A100-40GB", 4)
    pinned = PinnedBound(gpus)
    where: dict[str, tuple[Slot, ...]] = {}

    def admit(name: str, sizes: tuple[int, ...]) -> bool:
        ok = pinned.admit(name, sizes, False)
        if ok:
            where[name] = pinned.placement(name)
        for other, slots in where.items():
            assert pinned.placement(other) == slots, other
        return ok

    def release(name: str) -> None:
        pinned.release(name)
        del where[name]

    decisions = _replay(_stream(7, 200, [4000, 9000, 19000, 39000]), admit, release)
    assert pinned.replaced == 0 and not all(decisions) and any(decisions)
    # Every placement held is a legal MIG layout: the pinned instances of each GPU coexist.
    for position, (_, catalog) in enumerate(gpus):
        held = [s[1] for slots in where.values() for s in slots if s[0] == position]
        Occupancy.for_catalog(catalog, held)


@pytest.mark.parametrize("movable", [True, False])
def test_a_pinned_pod_blocks_a_placement_the_full_bound_makes_by_moving_it(movable: bool) -> None:
    gpus = _gpus("A100-40GB", 1)
    bound = PinnedBound(gpus)
    # Seven 1g pods fill the GPU; keep the two at slices 1 and 5: a 3g.20gb (slices 0-3 or 4-7)
    # then has no placement around them, though 1g + 1g + 3g fit one GPU once the 1g pods move.
    assert all(bound.admit(f"p{i}", [4000], movable) for i in range(7))
    starts = {name: bound.placement(name)[0][1].start for name in (f"p{i}" for i in range(7))}
    assert sorted(starts.values()) == list(range(7))
    kept = sorted(name for name, start in starts.items() if start in (1, 5))
    for name in starts:
        if name not in kept:
            bound.release(name)
    full = RepackingBound([gpus[0][1]])
    assert all(full.admit(name, [4000]) for name in kept) and full.admit("big", [19000])

    assert bound.admit("big", [19000], False) is movable
    if movable:
        assert bound.replaced >= 1
        assert {bound.placement(name)[0][1].start for name in kept} & {1, 5} != {1, 5}
    else:
        assert [bound.placement(name)[0][1].start for name in kept] == [starts[n] for n in kept]
