"""Which published devices are in use, by whom, and what that leaves: occupancies and counters.

Every device named in any claim's `status.allocation` of our driver counts as used (an adminAccess
result excepted: it watches a device without holding it, as upstream), whoever allocated it (kube-scheduler in `scheduler` mode, another controller replica, us). The ledger turns those into
each GPU's `Occupancy` inside one `ClusterState` (the policy's view, kept current incrementally) and
sums counter consumption per (pool, counter set) exactly as kube-scheduler does, as an independent check
that no allocation we write could exceed a counter.

Shared (HAMi-core) GPUs are different: many claims hold one device, each result with its own `shareID`
and `consumedCapacity`. A claim's holding of such a device is a `ShareUse` (pool, device, share id and
amounts), and the ledger sums them per GPU over every claim, whoever allocated it; a result without
consumedCapacity counts at the published request-policy defaults (the full memory, 0 cores, 1 share).

Allocations the controller has decided but not yet seen come back from the API are *assumed* (as in
kube-scheduler's assume cache): a stale watch event that still shows the claim unallocated must not
free the devices again, or the next pod could be given the same placement. An assumption records the
resourceVersion the watch must show (that of our write once it landed); it ends only when a version at
least that new is observed (ours, or someone else's newer one), or the claim is forgotten (deleted,
rolled back). Without comparable versions, only an allocated view ends it.

A device named by two claims at once (only an outside writer, or a write whose outcome we could not
know, can cause it) stays taken until the last of them lets go: `owners` names the holder it is counted
for, `more_holders` the others. Freeing it when the first holder went would hand it to a third claim
while the second still holds it. Each such double hold is queued in `double_holds` for the controller
to report (an Event and a metric) and kept in `held_twice` while it lasts.

Lifetime hints: `expect_end` records when the pod holding a claim is expected to end (the
controller reads it from the pod, controller/allocation/lifetime.py); the claim's MIG instances carry
that end in the `ClusterState` for the policy's co-location term, from the moment the claim is
allocated, and again after a restart or an inventory rebuild. The hint outlives allocation changes of
the claim (a rollback re-applies it) and goes only with `expect_end(uid, None)`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any, NamedTuple

import structlog

from api.constants import DRIVER_NAME, DeviceKind, parse_device_name
from controller.shared.capacity import ShareRequestError, consumed_amount
from controller.state.inventory import DeviceKey, Inventory, PublishedDevice
from driver.placement.occupancy import Occupancy, OccupancyError
from driver.policy.cluster import ClusterState
from driver.policy.model import GpuRef, GpuState
from driver.policy.placer import mig_cost
from driver.policy.sharemodel import ZERO, ShareAmount, SharedGpuState
from driver.policy.wholemodel import IdleGpu, IdleGpus

log = structlog.get_logger(__name__)


class ShareUse(NamedTuple):
    """One share of a shared device held by a claim; memory_mib None = the published default."""

    pool: str
    device: str
    share_id: str
    memory_mib: int | None
    cores: int | None
    shares: int | None


Held = DeviceKey | ShareUse
"""What a claim holds: a whole/MIG device (pool, device), or one share of a shared device."""


def _order(held: Held) -> tuple[str, str, str]:
    """A total order over holdings (amounts may be None, so tuples themselves are not comparable)."""
    return (held[0], held[1], held.share_id if isinstance(held, ShareUse) else "")


def _is_shared(result: Mapping[str, Any]) -> bool:
    try:
        return parse_device_name(str(result.get("device"))).kind is DeviceKind.SHARED
    except ValueError:
        return False


def claim_holdings(claim: Mapping[str, Any] | None) -> list[Held]:
    """Every device of our driver a claim's status.allocation holds (shares with what they consume);
    adminAccess results hold nothing, so they are neither counted nor ever a double hold."""
    results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results"
    ) or ()
    out: list[Held] = []
    for i, r in enumerate(results):
        if r.get("driver") != DRIVER_NAME or r.get("adminAccess"):
            continue  # an adminAccess result does not hold its device (upstream), whoever allocated it
        if r.get("shareID") is None and r.get("consumedCapacity") is None and not _is_shared(r):
            out.append((str(r["pool"]), str(r["device"])))
            continue
        amount = consumed_amount(r, None) if r.get("consumedCapacity") else None
        consumed = r.get("consumedCapacity") or {}
        has = {str(k).removeprefix(DRIVER_NAME + "/") for k in consumed}
        uid = ((claim or {}).get("metadata") or {}).get("uid", "")
        out.append(
            ShareUse(
                str(r["pool"]),
                str(r["device"]),
                str(r.get("shareID") or f"{uid}#{i}"),
                amount.memory_mib if amount is not None and "memory" in has else None,
                amount.cores if amount is not None and "cores" in has else None,
                amount.shares if amount is not None and "shares" in has else None,
            )
        )
    return out


class Ledger:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.claims: dict[str, tuple[Held, ...]] = {}
        self.owners: dict[Held, str] = {}
        # Every further claim holding a device `owners` already counts, in the order they came.
        self.more_holders: dict[Held, list[str]] = {}
        # Double holds found since the controller last took them (device, every holder), to report.
        self.double_holds: list[tuple[Held, tuple[str, ...]]] = []
        # Per shared GPU: what every share held on it consumes, in sum, and what each share added.
        self.shared_used: dict[GpuRef, ShareAmount] = {}
        self._share_amounts: dict[ShareUse, tuple[GpuRef, ShareAmount]] = {}
        # The share policy's view, kept current by _share/_unshare (a decision and every publish read
        # it; rebuilding it per read cost a pass over every shared GPU). Capacities are computed once.
        self._shared_states: dict[GpuRef, SharedGpuState] = {
            ref: SharedGpuState(ref, info.total()) for ref, info in inventory.shared.items()
        }
        self._shared_view = MappingProxyType(self._shared_states)
        # Published request-policy defaults, computed when a share without consumedCapacity needs them.
        self._defaults: dict[GpuRef, ShareAmount] = {}
        # uid -> resourceVersion the API must show before the assumption ends (None: any allocated one)
        self.assumed: dict[str, int | None] = {}
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
        self.expected_ends: dict[str, float] = {}  # claim uid -> expected end of its pod (epoch s)

    def rebuilt(self, inventory: Inventory) -> Ledger:
        """The same allocations over a new inventory (slices changed)."""
        new = Ledger(inventory)
        new.expected_ends = dict(self.expected_ends)
        for uid, devices in self.claims.items():
            new._apply(uid, devices)
        # Those found anew above are the same ones again: the controller reports each (device, holders) once.
        new.double_holds = self.double_holds + new.double_holds
        new.assumed = {uid: rv for uid, rv in self.assumed.items() if uid in new.claims}
        return new

    # --- claims -------------------------------------------------------------------------------------

    def observe(self, uid: str, devices: Iterable[Held], resource_version: int | None = None) -> None:
        """A claim as the API shows it now (empty = not allocated), at `resource_version` if known."""
        devs = tuple(sorted(devices, key=_order))
        if uid in self.assumed:
            wanted = self.assumed[uid]
            if wanted is not None and resource_version is not None:
                if resource_version < wanted:
                    return  # older than our own write: a stale view
            elif not devs:
                return  # not comparable: only an allocated view can end the assumption
            del self.assumed[uid]
        if self.claims.get(uid, ()) == devs:
            return
        self.forget(uid)
        if devs:
            self._apply(uid, devs)

    def assume(self, uid: str, devices: Iterable[Held], resource_version: int | None = None) -> None:
        """We are writing this allocation: count it as used until the API shows a version at least
        `resource_version` (None: any allocated version), or we give up (`forget`)."""
        self.forget(uid)
        self._apply(uid, tuple(sorted(devices, key=_order)))
        self.assumed[uid] = resource_version

    def written(self, uid: str, devices: Iterable[Held], resource_version: int | None) -> None:
        """Our allocation write landed as `resource_version`: still assumed until the watch shows it."""
        devs = tuple(sorted(devices, key=_order))
        if self.claims.get(uid, ()) != devs:
            self.forget(uid)
            self._apply(uid, devs)
        self.assumed[uid] = resource_version

    def expect_end(self, uid: str, end: float | None) -> None:
        """The claim's pod is expected to end at `end` (epoch seconds); None: no (more) hint."""
        if end is None:
            if self.expected_ends.pop(uid, None) is None:
                return
        elif self.expected_ends.get(uid) == end:
            return
        else:
            self.expected_ends[uid] = end
        self._mark_ends(uid)

    def _mark_ends(self, uid: str) -> None:
        """Give the claim's MIG instances in the cluster state its expected end (or none)."""
        end = self.expected_ends.get(uid)
        for key in self.claims.get(uid, ()):
            if isinstance(key, ShareUse) or self.owners.get(key) != uid:
                continue
            dev = self.inventory.device(key)
            if dev is None or dev.kind is not DeviceKind.MIG or dev.start is None:
                continue
            ref = dev.gpu
            if ref is None or ref not in self._in_cluster or ref in self.conflicts:
                continue
            try:
                self.cluster.set_expected_end(ref, dev.start, end)
            except ValueError:  # not placed (its profile is not in the catalog): nothing to mark
                continue

    @property
    def held_twice(self) -> int:
        """How many devices more than one claim holds right now."""
        return len(self.more_holders)

    def holders(self, key: Held) -> tuple[str, ...]:
        owner = self.owners.get(key)
        return () if owner is None else (owner, *self.more_holders.get(key, ()))

    def forget(self, uid: str) -> None:
        """The claim is gone, deallocated, or our write failed."""
        self.assumed.pop(uid, None)
        for key in self.claims.pop(uid, ()):
            more = self.more_holders.get(key)
            if self.owners.get(key) != uid:
                if more is not None and uid in more:
                    more.remove(uid)
                    if not more:
                        del self.more_holders[key]
                continue
            if more:  # another claim still holds it: it stays taken, now counted for that one
                self.owners[key] = heir = more.pop(0)
                if not more:
                    del self.more_holders[key]
                if heir in self.expected_ends:
                    self._mark_ends(heir)
                continue
            del self.owners[key]
            if isinstance(key, ShareUse):
                self._unshare(key)
                continue
            dev = self.inventory.device(key)
            if dev is not None:
                self._count(dev, -1)
                self._occupy(dev, add=False)

    def _apply(self, uid: str, devices: tuple[Held, ...]) -> None:
        self.claims[uid] = devices
        for key in devices:
            other = self.owners.get(key)
            if other is not None and other != uid:
                # Two claims name one device. Counted once, freed only when both have let go.
                more = self.more_holders.setdefault(key, [])
                if uid not in more:
                    more.append(uid)
                log.error("device allocated to two claims", device=key, claims=[other, *more])
                self.double_holds.append((key, (other, *more)))
                continue
            self.owners[key] = uid
            if isinstance(key, ShareUse):
                self._share(key)
                continue
            dev = self.inventory.device(key)
            if dev is not None:
                self._count(dev, +1)
                self._occupy(dev, add=True)
        if uid in self.expected_ends:
            self._mark_ends(uid)

    # --- derived state ------------------------------------------------------------------------------

    def _share(self, use: ShareUse) -> None:
        dev = self.inventory.device((use.pool, use.device))
        ref = dev.gpu if dev is not None else None
        if ref is None or ref not in self._shared_states:
            return  # not published (any more), or published badly: nothing to count against
        if use.memory_mib is not None and use.cores is not None and use.shares is not None:
            amount = ShareAmount(use.memory_mib, use.cores, use.shares)
        else:
            default = self._default(ref)
            if default is None:
                return
            amount = ShareAmount(
                default.memory_mib if use.memory_mib is None else use.memory_mib,
                default.cores if use.cores is None else use.cores,
                default.shares if use.shares is None else use.shares,
            )
        self._share_amounts[use] = (ref, amount)
        self._add_used(ref, amount)

    def _default(self, ref: GpuRef) -> ShareAmount | None:
        """What a share without consumedCapacity holds on `ref`; None (device dropped) if unknowable."""
        default = self._defaults.get(ref)
        if default is not None:
            return default
        info = self.inventory.shared[ref]
        try:
            default = info.default_amount()
        except ShareRequestError as exc:
            # The slice publishes a request-policy default above the capacity (a plugin bug): what its
            # shares hold is unknown, so nothing more is placed on it until it is published again.
            log.warning(
                "shared device publishes an impossible default; not placing shares on it",
                pool=info.pool,
                device=info.device,
                error=str(exc),
            )
            del self._shared_states[ref]
            return None
        self._defaults[ref] = default
        return default

    def _add_used(self, ref: GpuRef, amount: ShareAmount) -> None:
        used = self.shared_used.get(ref, ZERO) + amount
        self.shared_used[ref] = used
        state = self._shared_states.get(ref)
        if state is not None:
            self._shared_states[ref] = SharedGpuState(ref, state.capacity, used)

    def _unshare(self, use: ShareUse) -> None:
        hit = self._share_amounts.pop(use, None)
        if hit is not None:
            ref, amount = hit
            self._add_used(ref, ZERO - amount)

    def shared_states(self) -> Mapping[GpuRef, SharedGpuState]:
        """Every shareable GPU with its capacity and what all claims' shares use of it.

        A read-only live view, kept current as claims come and go (copy it to keep a snapshot)."""
        return self._shared_view

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

    def idle_gpus(self) -> IdleGpus:
        """Every GPU whose whole device may be allocated now: published, not held by any claim, no MIG
        instance held on it and no conflict; each with the MIG capacity its loss destroys."""
        idle = []
        for gpu in self.inventory.gpus.values():
            if gpu.whole_device is None or (gpu.pool, gpu.whole_device) in self.owners:
                continue
            if gpu.ref in self.conflicts:
                continue
            if gpu.ref in self._in_cluster:
                state = self.cluster.gpu(gpu.ref)
                if state.whole_gpu_taken or not state.occupancy.is_empty:
                    continue
            idle.append(gpu.ref)
        costs = mig_cost(self.cluster, idle)
        return IdleGpus(IdleGpu(ref, costs[ref]) for ref in idle)

    def is_used(self, key: DeviceKey) -> bool:
        """Whether a device is held exclusively (a shared device is never: see `shared_used`)."""
        return key in self.owners
