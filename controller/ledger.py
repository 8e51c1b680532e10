"""Which published devices are in use, by whom, and what that leaves: occupancies and counters.

Every device named in any claim's `status.allocation` of our driver counts as used, whoever allocated
it (kube-scheduler in `scheduler` mode, another controller replica, us). The ledger turns those into
each GPU's `Occupancy` inside one `ClusterState` (the policy's view, kept current incrementally) and
sums counter consumption per (pool, counter set) exactly as kube-scheduler does, as an independent check
that no allocation we write could exceed a counter.

Allocations the controller has decided but not yet seen come back from the API are *assumed* (as in
kube-scheduler's assume cache): a stale watch event that still shows the claim unallocated must not
free the devices again, or the next pod could be given the same placement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction

import structlog

from api.constants import DeviceKind
from controller.inventory import DeviceKey, Inventory, PublishedDevice
from driver.placement.occupancy import Occupancy, OccupancyError
from driver.policy.cluster import ClusterState
from driver.policy.model import GpuRef, GpuState

log = structlog.get_logger(__name__)


class Ledger:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.claims: dict[str, tuple[DeviceKey, ...]] = {}
        self.owners: dict[DeviceKey, str] = {}
        self.assumed: set[str] = set()
        self.consumed: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(dict)
        # GPUs whose published state contradicts the allocations (should never happen): kept out.
        self.conflicts: dict[GpuRef, str] = {}
        gpus = [
            GpuState(g.ref, g.catalog, Occupancy.for_catalog(g.catalog))
            for g in inventory.gpus.values()
            if g.catalog.profiles
        ]
        self.cluster = ClusterState(gpus)
        self._in_cluster = {g.ref for g in gpus}

    def rebuilt(self, inventory: Inventory) -> Ledger:
        """The same allocations over a new inventory (slices changed)."""
        new = Ledger(inventory)
        for uid, devices in self.claims.items():
            new._apply(uid, devices)
        new.assumed = set(self.assumed) & set(new.claims)
        return new

    # --- claims -------------------------------------------------------------------------------------

    def observe(self, uid: str, devices: Iterable[DeviceKey]) -> None:
        """A claim as the API shows it now (empty = not allocated)."""
        devs = tuple(sorted(devices))
        if uid in self.assumed:
            if not devs:
                return  # stale view from before our write landed
            self.assumed.discard(uid)
        if self.claims.get(uid, ()) == devs:
            return
        self.forget(uid)
        if devs:
            self._apply(uid, devs)

    def assume(self, uid: str, devices: Iterable[DeviceKey]) -> None:
        """We are writing this allocation: count it as used until the API confirms or we give up."""
        self.forget(uid)
        self._apply(uid, tuple(sorted(devices)))
        self.assumed.add(uid)

    def forget(self, uid: str) -> None:
        """The claim is gone, deallocated, or our write failed."""
        self.assumed.discard(uid)
        for key in self.claims.pop(uid, ()):
            if self.owners.get(key) != uid:
                continue
            del self.owners[key]
            dev = self.inventory.device(key)
            if dev is not None:
                self._count(dev, -1)
                self._occupy(dev, add=False)

    def _apply(self, uid: str, devices: tuple[DeviceKey, ...]) -> None:
        self.claims[uid] = devices
        for key in devices:
            other = self.owners.get(key)
            if other is not None and other != uid:
                # Two claims name one device: only possible through an outside writer. Keep the first.
                log.error("device allocated to two claims", device=key, claims=[other, uid])
                continue
            self.owners[key] = uid
            dev = self.inventory.device(key)
            if dev is not None:
                self._count(dev, +1)
                self._occupy(dev, add=True)

    # --- derived state ------------------------------------------------------------------------------

    def _count(self, dev: PublishedDevice, sign: int) -> None:
        for counter_set, counters in dev.consumes:
            used = self.consumed[(dev.pool, counter_set)]
            for name, value in counters:
                used[name] = used.get(name, Fraction(0)) + sign * value

    def _occupy(self, dev: PublishedDevice, add: bool) -> None:
        ref = dev.gpu
        if ref is None or ref not in self._in_cluster:
            return
        state = self.cluster.gpu(ref)
        if dev.kind is DeviceKind.WHOLE:
            self.cluster.set_occupancy(ref, state.occupancy, whole_gpu_taken=add)
            return
        profile = next((p for p in state.catalog.profiles if p.name == dev.profile), None)
        if profile is None or dev.start is None:
            return
        try:
            occ = (
                state.occupancy.place(profile, dev.start)
                if add
                else state.occupancy.remove(profile, dev.start)
            )
        except OccupancyError as exc:
            log.error("allocations contradict the GPU's placement rules", gpu=str(ref), error=str(exc))
            self.conflicts[ref] = str(exc)
            self.cluster.set_occupancy(ref, state.occupancy, whole_gpu_taken=True)
            return
        self.cluster.set_occupancy(ref, occ)

    def counters_allow(self, devices: Iterable[PublishedDevice]) -> str | None:
        """None if every counter still covers these extra devices (kube-scheduler's rule), else why not."""
        extra: dict[tuple[str, str], dict[str, Fraction]] = defaultdict(dict)
        for dev in devices:
            for counter_set, counters in dev.consumes:
                bucket = extra[(dev.pool, counter_set)]
                for name, value in counters:
                    bucket[name] = bucket.get(name, Fraction(0)) + value
        for (pool_name, counter_set), wanted in extra.items():
            pool = self.inventory.pools.get(pool_name)
            available = pool.counter_sets.get(counter_set) if pool is not None else None
            if available is None:
                return f"counter set {counter_set} of pool {pool_name} is not published"
            used = self.consumed.get((pool_name, counter_set), {})
            for name, value in wanted.items():
                if used.get(name, Fraction(0)) + value > available.get(name, Fraction(0)):
                    return f"counter {name} of {pool_name}/{counter_set} would be exceeded"
        return None

    def is_used(self, key: DeviceKey) -> bool:
        return key in self.owners
