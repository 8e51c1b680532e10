"""Published devices -> the GPUs the policy places on (catalog-equivalent profiles per GPU).

The controller never talks to NVML: everything it knows about a GPU is what the node published in its
ResourceSlices (kubeletplugin/publish/slices.py). Each MIG device carries its profile, GI profile id, placement
and capacities, so a GPU's catalog is rebuilt from its devices: a profile's placements are the starts
published for it on that GPU (the allowlist is already applied by the node), its memory is the
device's `memory` capacity (names: api/devicecontract.py). Identical GPUs share the same `MigProfile` objects, which keeps the memory
of a 1000-node inventory small and the policy's capacity memo effective.

Shareable GPUs of hami-core nodes (`gpu-<i>-shared`, allowMultipleAllocations) are kept apart in
`Inventory.shared`, with their published capacities and request policies (controller/shared/capacity.py); they
have no MIG catalog and are placed by driver/policy/shared.py.

Only complete pools are allocatable (every slice of the newest generation present), as in kube-scheduler.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import structlog

from api import devicecontract as dc
from api.constants import (
    DRIVER_NAME,
    MEMORY_SLICE_COUNTER_PREFIX,
    DeviceKind,
    counter_set_name,
    parse_device_name,
)
from controller.claims.cel import CelDevice
from controller.claims.quantity import QuantityError, parse_quantity, quantity_mib
from controller.shared.capacity import SharedGpuInfo
from driver.catalog.naming import GiProfileEnum, profile_suffix
from driver.catalog.types import GpuCatalog, MigProfile
from driver.nvml.types import Architecture, GpuInfo, Placement
from driver.placement.choice import size_key
from driver.policy.model import GpuRef

log = structlog.get_logger(__name__)

DeviceKey = tuple[str, str]  # (pool, device)

# The suffix is all the controller can see of a profile's NVML enum; it is what the occupancy's media
# engine exclusivity rules need (is_all_me / is_no_me).
_ENUM_BY_SUFFIX = {
    "+me.all": GiProfileEnum.SLICE_1_ALL_ME,
    "-me": GiProfileEnum.SLICE_1_NO_ME,
    "+me": GiProfileEnum.SLICE_1_REV1,
    "+gfx": GiProfileEnum.SLICE_1_GFX,
}


@dataclass(slots=True)
class PublishedDevice:
    pool: str
    name: str
    node: str | None
    raw: Mapping[str, Any]
    gpu: GpuRef | None = None
    kind: DeviceKind | None = None
    profile: str | None = None
    start: int | None = None
    size: int | None = None
    consumes: tuple[tuple[str, tuple[tuple[str, Fraction], ...]], ...] = ()
    _cel: CelDevice | None = None

    @property
    def cel(self) -> CelDevice:
        if self._cel is None:  # built on first use: most devices are never looked at by a selector
            self._cel = CelDevice.from_slice_device(DRIVER_NAME, self.raw)
        return self._cel

    def attribute(self, key: str) -> Any:
        """A plain attribute value by (optionally driver-qualified) key, or None."""
        short = key.removeprefix(DRIVER_NAME + "/")
        raw = (self.raw.get("attributes") or {}).get(short) or (self.raw.get("attributes") or {}).get(key)
        if not raw:
            return None
        return next(iter(raw.values()))


@dataclass(slots=True)
class InventoryGpu:
    ref: GpuRef
    pool: str
    catalog: GpuCatalog
    uuid: str
    mig_devices: dict[tuple[str, int], str] = field(default_factory=dict)  # (profile, start) -> device
    whole_device: str | None = None


@dataclass(slots=True)
class Pool:
    name: str
    node: str | None
    generation: int
    complete: bool
    devices: dict[str, PublishedDevice]
    counter_sets: dict[str, dict[str, Fraction]]


def _int_attr(dev: Mapping[str, Any], key: str) -> int | None:
    raw = (dev.get("attributes") or {}).get(key)
    value = raw.get("int") if isinstance(raw, Mapping) else None
    return value if isinstance(value, int) else None


def _str_attr(dev: Mapping[str, Any], key: str) -> str:
    raw = (dev.get("attributes") or {}).get(key)
    value = raw.get("string") if isinstance(raw, Mapping) else None
    return value if isinstance(value, str) else ""


def _cap_int(dev: Mapping[str, Any], key: str) -> int:
    raw = (dev.get("capacity") or {}).get(key)
    if not isinstance(raw, Mapping):
        return 0
    try:
        return quantity_mib(raw["value"]) if key == dc.CAP_MEMORY else int(parse_quantity(raw["value"]))
    except (QuantityError, KeyError):
        return 0


def _consumption(dev: Mapping[str, Any]) -> tuple[tuple[str, tuple[tuple[str, Fraction], ...]], ...]:
    out = []
    for c in dev.get("consumesCounters") or ():
        counters = tuple(
            (name, parse_quantity(v.get("value", "0"))) for name, v in (c.get("counters") or {}).items()
        )
        out.append((str(c.get("counterSet", "")), counters))
    return tuple(out)


class Inventory:
    """Every complete pool of the driver, its devices, and the GPUs rebuilt from them."""

    def __init__(self, slices: Iterable[Mapping[str, Any]], driver: str = DRIVER_NAME) -> None:
        self.pools: dict[str, Pool] = {}
        self.gpus: dict[GpuRef, InventoryGpu] = {}
        self.shared: dict[GpuRef, SharedGpuInfo] = {}
        self._profiles: dict[tuple[Any, ...], MigProfile] = {}
        by_pool: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("driver") == driver:
                by_pool[(spec.get("pool") or {}).get("name", "")].append(s)
        for name, pool_slices in by_pool.items():
            self._add_pool(name, pool_slices)

    def _add_pool(self, name: str, pool_slices: list[Mapping[str, Any]]) -> None:
        generation = max(int(s["spec"]["pool"].get("generation", 0)) for s in pool_slices)
        newest = [s for s in pool_slices if int(s["spec"]["pool"].get("generation", 0)) == generation]
        expected = int(newest[0]["spec"]["pool"].get("resourceSliceCount", 1))
        complete = len(newest) == expected
        node = newest[0]["spec"].get("nodeName")
        pool = Pool(name, node, generation, complete, {}, {})
        for s in newest:
            for cs in s["spec"].get("sharedCounters") or ():
                pool.counter_sets[cs["name"]] = {
                    k: parse_quantity(v.get("value", "0")) for k, v in (cs.get("counters") or {}).items()
                }
            for raw in s["spec"].get("devices") or ():
                dev = PublishedDevice(name, raw["name"], node, raw, consumes=_consumption(raw))
                pool.devices[dev.name] = dev
        self.pools[name] = pool
        if not complete:
            log.info("pool incomplete, not allocatable", pool=name, slices=len(newest), expected=expected)
            return
        if node is None:
            # flexmig's node agent always publishes node-local pools; anything else is not a MIG GPU.
            return
        self._add_gpus(pool, node)

    def _add_gpus(self, pool: Pool, node: str) -> None:
        migs: dict[int, list[PublishedDevice]] = defaultdict(list)
        wholes: dict[int, PublishedDevice] = {}
        for dev in pool.devices.values():
            try:
                parsed = parse_device_name(dev.name)
            except ValueError:
                continue
            dev.gpu = GpuRef(node, parsed.gpu_index)
            dev.kind = parsed.kind
            if parsed.kind is DeviceKind.WHOLE:
                wholes[parsed.gpu_index] = dev
                continue
            if parsed.kind is DeviceKind.SHARED:
                self.shared[dev.gpu] = SharedGpuInfo.parse(pool.name, dev.raw)
                continue
            dev.profile = _str_attr(dev.raw, dc.ATTR_PROFILE)
            dev.start = _int_attr(dev.raw, dc.ATTR_PLACEMENT_START)
            dev.size = _int_attr(dev.raw, dc.ATTR_PLACEMENT_SIZE)
            if not dev.profile or dev.start is None or dev.size is None:
                log.warning(
                    "MIG device without profile/placement attributes", pool=pool.name, device=dev.name
                )
                continue
            migs[parsed.gpu_index].append(dev)
        for index in sorted(set(migs) | set(wholes)):
            gpu = self._build_gpu(pool, node, index, migs.get(index, []), wholes.get(index))
            self.gpus[gpu.ref] = gpu

    def _profile(self, dev: Mapping[str, Any], placements: tuple[Placement, ...], compute: int) -> MigProfile:
        name = _str_attr(dev, dc.ATTR_PROFILE)
        compute_slices = _int_attr(dev, dc.ATTR_COMPUTE_SLICES) or 0
        memory_slices = _int_attr(dev, dc.ATTR_MEMORY_SLICES) or (placements[0].size if placements else 0)
        suffix = profile_suffix(name)
        # NVML's per-profile instance cap is not published; the placements and compute budget bound it,
        # and a "+me" profile owns the GPU's media engines, so at most one exists.
        limit = 1 if suffix in ("+me", "+me.all") else len(placements)
        if compute_slices:
            limit = min(limit, max(1, compute // compute_slices))
        key = (
            name,
            _int_attr(dev, dc.ATTR_GI_PROFILE_ID) or 0,
            compute_slices,
            memory_slices,
            _cap_int(dev, dc.CAP_MEMORY),
            placements,
            limit,
            tuple(_cap_int(dev, k) for k in dc.ENGINE_CAPACITIES),
        )
        hit = self._profiles.get(key)
        if hit is None:
            mp, ce, dec, enc, jpg, ofa = key[7]
            hit = MigProfile(
                name=name,
                gi_profile_id=key[1],
                enum_index=int(_ENUM_BY_SUFFIX.get(suffix, GiProfileEnum.SLICE_1)),
                compute_slices=compute_slices,
                memory_slices=memory_slices,
                memory_mib=key[4],
                multiprocessors=mp,
                copy_engines=ce,
                decoders=dec,
                encoders=enc,
                jpegs=jpg,
                ofas=ofa,
                instance_count=limit,
                placements=placements,
            )
            self._profiles[key] = hit
        return hit

    def _build_gpu(
        self,
        pool: Pool,
        node: str,
        index: int,
        migs: list[PublishedDevice],
        whole: PublishedDevice | None,
    ) -> InventoryGpu:
        first = whole.raw if whole is not None else migs[0].raw
        memory_slices = _int_attr(first, dc.ATTR_MEMORY_SLICES) if whole is not None else None
        compute_slices = _int_attr(first, dc.ATTR_COMPUTE_SLICES) if whole is not None else None
        if memory_slices is None:
            try:
                counters = pool.counter_sets.get(counter_set_name(index), {})
            except ValueError:  # an index too long for a counter-set name: no set can match it
                counters = {}
            memory_slices = sum(1 for k in counters if k.startswith(MEMORY_SLICE_COUNTER_PREFIX)) or max(
                ((d.start or 0) + (d.size or 0) for d in migs), default=0
            )
        if compute_slices is None:
            # Without the whole-GPU device (Ampere in MIG mode) the largest profile is the best bound.
            compute_slices = max((_int_attr(d.raw, dc.ATTR_COMPUTE_SLICES) or 0 for d in migs), default=0)
        by_profile: dict[tuple[str, int], list[PublishedDevice]] = defaultdict(list)
        for d in migs:
            by_profile[(d.profile or "", _int_attr(d.raw, dc.ATTR_GI_PROFILE_ID) or 0)].append(d)
        profiles = []
        mig_devices: dict[tuple[str, int], str] = {}
        for devs in by_profile.values():
            devs.sort(key=lambda d: d.start or 0)
            placements = tuple(Placement(d.start or 0, d.size or 0) for d in devs)
            profiles.append(self._profile(devs[0].raw, placements, compute_slices))
            for d in devs:
                mig_devices[(d.profile or "", d.start or 0)] = d.name
        ordered = tuple(sorted(profiles, key=size_key))
        uuid = _str_attr(first, dc.ATTR_UUID) or _str_attr(first, dc.ATTR_PARENT_UUID)
        arch = _str_attr(first, dc.ATTR_ARCHITECTURE)
        info = GpuInfo(
            index=index,
            uuid=uuid,
            name=_str_attr(first, dc.ATTR_PRODUCT_NAME),
            memory_total_mib=_cap_int(whole.raw, dc.CAP_MEMORY)
            if whole is not None
            else max((p.memory_mib for p in ordered), default=0),
            architecture=Architecture(arch)
            if arch in {a.value for a in Architecture}
            else Architecture.UNKNOWN,
            pci_device_id=0,
            minor_number=index,
            mig_capable=bool(migs),
        )
        catalog = GpuCatalog(
            gpu=info,
            model=_str_attr(first, dc.ATTR_MODEL) or info.name,
            memory_slices=memory_slices,
            compute_slices=compute_slices,
            profiles=ordered,
            all_profiles=ordered,
        )
        return InventoryGpu(
            GpuRef(node, index),
            pool.name,
            catalog,
            uuid,
            mig_devices,
            whole.name if whole is not None else None,
        )

    def device(self, key: DeviceKey) -> PublishedDevice | None:
        pool = self.pools.get(key[0])
        return None if pool is None else pool.devices.get(key[1])
