"""The A100 oracle: the layout enumeration, the placement model and the
NVML simulator must all agree with the 19 maximal layouts of an A100-40GB with {1g.5gb, 2g.10gb,
3g.20gb, 4g.20gb, 7g.40gb}, derived by hand from NVIDIA's `nvidia-smi mig -lgipp` placements (no shared
memory slice, at most 7 compute slices) and written out below.

Cost note: every simulated NVML call locks, loads and rewrites the state file (about 5 ms on tmpfs), so
creating all 7,823 creation orders of the 19 layouts through the simulator would take minutes. The
pure placement model is checked on *every* permutation; the simulator is checked on every permutation
of layouts with up to 3 instances and on 3 deterministic orders (by start, reversed, one seeded
shuffle) of the larger ones; the NVML-visible result is compared once per layout. The state file lives on /dev/shm when it
exists, to keep fsync cheap.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from driver.catalog.discover import discover
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.port import Nvml
from driver.nvml.sim import SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import NvmlError, NvmlErrorCode
from driver.placement.layouts import enumerate_layouts
from driver.placement.occupancy import Occupancy, PlacedProfile

SHORT = {"1g": "1g.5gb", "2g": "2g.10gb", "3g": "3g.20gb", "4g": "4g.20gb", "7g": "7g.40gb"}

# The 19 maximal layouts, written out as "profile@start[,start...]" terms joined by " + ".
ORACLE_TEXT = (
    "7g@0",
    "4g@0 + 3g@4",
    "4g@0 + 2g@4 + 1g@6",
    "4g@0 + 1g@4,5,6",
    "3g@0 + 3g@4",
    "3g@0 + 2g@4 + 1g@6",
    "3g@0 + 1g@4,5,6",
    "2g@0 + 2g@2 + 3g@4",
    "2g@0 + 1g@2,3 + 3g@4",
    "1g@0,1 + 2g@2 + 3g@4",
    "1g@0,1,2,3 + 3g@4",
    "2g@0,2,4 + 1g@6",
    "2g@0,2 + 1g@4,5,6",
    "2g@0,4 + 1g@2,3,6",
    "2g@2,4 + 1g@0,1,6",
    "2g@0 + 1g@2,3,4,5,6",
    "2g@2 + 1g@0,1,4,5,6",
    "2g@4 + 1g@0,1,2,3,6",
    "1g@0,1,2,3,4,5,6",
)


def parse(text: str) -> frozenset[tuple[str, int]]:
    items: set[tuple[str, int]] = set()
    for term in text.split(" + "):
        short, starts = term.split("@")
        items.update((SHORT[short], int(s)) for s in starts.split(","))
    return frozenset(items)


ORACLE = [parse(t) for t in ORACLE_TEXT]


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[Nvml, GpuCatalog]]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    tmp = tempfile.mkdtemp(prefix="flexmig-oracle-", dir=base)
    try:
        path = os.path.join(tmp, "state.json")
        init_sim_state(path, [SimGpuSpec(sku="A100-40GB")])
        with open_sim(path) as nvml:
            yield nvml, discover(nvml, 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def oracle_profiles(catalog: GpuCatalog) -> list[MigProfile]:
    found = [catalog.profile(name) for name in SHORT.values()]
    assert all(p is not None for p in found)
    return [p for p in found if p is not None]


def test_oracle_is_well_formed() -> None:
    assert len(ORACLE) == 19 and len(set(ORACLE)) == 19
    # The reference: the 19 collapse to 14 distinct multisets.
    multisets = {tuple(sorted(name for name, _ in layout)) for layout in ORACLE}
    assert len(multisets) == 14


def test_exactly_the_19_maximal_layouts(sim: tuple[Nvml, GpuCatalog]) -> None:
    _, catalog = sim
    layouts = enumerate_layouts(catalog.memory_slices, catalog.compute_slices, oracle_profiles(catalog))
    assert len(layouts) == 19
    assert {layout.as_set() for layout in layouts} == set(ORACLE)
    # Deterministic order, largest instance first.
    assert str(layouts[0]) == "7g.40gb@0"
    assert str(layouts[-1]) == " + ".join(f"1g.5gb@{s}" for s in range(7))
    # Layouts 5-7 of the reference use only 6 compute slices.
    six = {layout.as_set() for layout in layouts if layout.compute_slices_used == 6}
    assert six == {ORACLE[4], ORACLE[5], ORACLE[6]}


def _instances(catalog: GpuCatalog, layout: frozenset[tuple[str, int]]) -> list[PlacedProfile]:
    by_name = {p.name: p for p in oracle_profiles(catalog)}
    return sorted((PlacedProfile(by_name[n], s) for n, s in layout), key=lambda i: (i.start, i.profile.name))


def test_placement_model_accepts_every_permutation(sim: tuple[Nvml, GpuCatalog]) -> None:
    _, catalog = sim
    profiles = oracle_profiles(catalog)
    orders = 0
    for layout in ORACLE:
        for order in itertools.permutations(_instances(catalog, layout)):
            occ = Occupancy(catalog.memory_slices, catalog.compute_slices, profiles)
            for inst in order:
                occ = occ.place(inst.profile, inst.start)
            orders += 1
        # The final state does not depend on the order: check maximality once per layout.
        assert occ.is_maximal
    assert orders == 7823


def _orders(instances: list[PlacedProfile], seed: int) -> list[tuple[PlacedProfile, ...]]:
    if len(instances) <= 3:
        return list(itertools.permutations(instances))
    shuffled = tuple(random.Random(seed).sample(instances, len(instances)))
    return list(dict.fromkeys([tuple(instances), tuple(reversed(instances)), shuffled]))


def test_simulator_accepts_every_layout_in_many_orders(sim: tuple[Nvml, GpuCatalog]) -> None:
    nvml, catalog = sim
    assert nvml.gpu_instances(0) == []
    created_orders = 0
    for index, layout in enumerate(ORACLE):
        for number, order in enumerate(_orders(_instances(catalog, layout), seed=index)):
            gi_ids = []
            for inst in order:
                gi = nvml.create_gpu_instance(0, inst.profile.gi_profile_id, inst.start)
                assert gi.placement == inst.placement
                gi_ids.append(gi.gi_id)
            if number == 0:
                # Listing every GI costs a dozen simulated calls: compare what NVML reports once.
                realised = {
                    (catalog_name(catalog, gi.profile_id), gi.placement.start) for gi in nvml.gpu_instances(0)
                }
                assert realised == layout
            for gi_id in gi_ids:
                nvml.destroy_gpu_instance(0, gi_id)
            created_orders += 1
    assert nvml.gpu_instances(0) == []
    assert created_orders > 19 * 2


def catalog_name(catalog: GpuCatalog, profile_id: int) -> str:
    return next(p.name for p in catalog.all_profiles if p.gi_profile_id == profile_id)


def test_simulator_rejects_every_overlapping_pair(sim: tuple[Nvml, GpuCatalog]) -> None:
    nvml, catalog = sim
    candidates = [PlacedProfile(p, pl.start) for p in oracle_profiles(catalog) for pl in p.placements]
    assert len(candidates) == 14
    rejected = accepted = 0
    for first in candidates:
        gi = nvml.create_gpu_instance(0, first.profile.gi_profile_id, first.start)
        for second in candidates:
            if first.placement.overlaps(second.placement):
                with pytest.raises(NvmlError) as info:
                    nvml.create_gpu_instance(0, second.profile.gi_profile_id, second.start)
                assert info.value.code is NvmlErrorCode.INSUFFICIENT_RESOURCES
                rejected += 1
            else:
                # No two disjoint placements exceed 7 compute slices together, so NVML accepts them.
                other = nvml.create_gpu_instance(0, second.profile.gi_profile_id, second.start)
                nvml.destroy_gpu_instance(0, other.gi_id)
                accepted += 1
        nvml.destroy_gpu_instance(0, gi.gi_id)
    assert nvml.gpu_instances(0) == []
    assert rejected + accepted == 14 * 14 and rejected > 0 and accepted > 0
