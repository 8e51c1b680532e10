"""Random churn against the controller and the FakeApiServer (tests/unit/controller/fake_apiserver.py),
and the invariants checked on what the server holds, for the property test in test_ctl_property.py.

The watch is driven like a real one can behave: late (events held back while the controller writes),
in batches or one at a time, interleaved across resources (each resource has its own watch, so their
relative order is arbitrary while each resource's own order is kept), replayed after a reconnect (the
last events again), and relists that lag behind the controller's own writes. Faults are injected on the
controller's writes (409, 404, 500) and leadership is lost in the middle of a pod's writes.

Invariants are read from the server's objects, never from the controller's own bookkeeping:
`audit_allocations` (no device in two claims, no overlapping MIG placements or whole-GPU-and-MIG, no
counter exceeded, no unreadable allocation), a released pod has all of its claims allocated, and, once
settled, no allocation is left for a pod that no longer exists; the final allocations are then created
as GPU instances in the NVML simulator, which refuses any placement real hardware would refuse.
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from ctl_helpers import claim, mem
from fake_apiserver import Harness

from api.constants import DeviceKind
from controller.kube.store import Event, object_key
from controller.kube.writer import ALLOCATED_FOR_ANNOTATION, CONDITION_TYPE
from controller.state.inventory import Inventory
from driver.nvml.sim import SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import NvmlError

NODES = {"a": ("A100-40GB", 2), "h": ("H100-80GB", 1)}  # small: bursts exhaust it, pods wait
MEMORIES = (4000, 9000, 19000, 30000, 39000, 70000)
FAULTS = (409, 404, 500)
Op = tuple[str, int, int, int]


class Churn:
    def __init__(self) -> None:
        self.h = Harness(NODES)
        self.n = 0
        self.pods: list[str] = []  # ns/name of pods created (some deleted since)
        self.claims: list[str] = []
        self.deleted: set[str] = set()  # keys the test deleted (claims: deallocated unless reserved)
        self.lists: list[list[Event]] = [self.h.api.lists()]  # relists as they were after each op
        self.leading = True
        self.writes_left: int | None = None  # leadership is lost after this many more writes
        original = self.h.writer.is_leader

        def leads() -> bool:
            if self.writes_left is not None:
                if self.writes_left <= 0:
                    self.leading = False
                self.writes_left -= 1
            return self.leading and original()

        self.h.writer.is_leader = leads
        self.h.ctl.is_leader = lambda: self.leading

    # --- the cluster's users --------------------------------------------------------------------------

    def add_pod(self, memory: int, count: int, claims: int) -> None:
        self.n += 1
        names = [f"c{self.n}-{i}" for i in range(claims)]
        for name in names:
            self.h.add_claim(claim(name, mem(memory), count=count))
            self.claims.append(f"ns/{name}")
        self.h.add_pod(f"p{self.n}", names)
        self.pods.append(f"ns/p{self.n}")

    def delete(self, resource: str, keys: list[str], index: int) -> None:
        live = [k for k in keys if k in self.h.api.objects[resource]]
        if live:
            key = live[index % len(live)]
            self.deleted.add(key)
            self.h.api.delete_object(resource, key)

    # --- the watch ------------------------------------------------------------------------------------

    def interleave(self, seed: int) -> None:
        """Deliver everything pending, resources interleaved at random, each resource in its order."""
        by_resource: dict[str, list[Event]] = defaultdict(list)
        for event in self.h.pending_watch():
            by_resource[event.resource].append(event)
        self.h.delivered = len(self.h.api.watch)
        rng = random.Random(seed)
        while by_resource:
            resource = rng.choice(sorted(by_resource))
            self.h.ctl.cache.events.put(by_resource[resource].pop(0))
            if not by_resource[resource]:
                del by_resource[resource]

    def replay(self, n: int) -> None:
        """A watch resumed from an older resourceVersion: the last `n` delivered events again."""
        for event in self.h.api.watch[max(0, self.h.delivered - n) : self.h.delivered]:
            self.h.ctl.cache.events.put(event)

    def stale_relist(self, back: int) -> None:
        """A relist served by a cache lagging `back` operations behind."""
        for event in self.lists[max(0, len(self.lists) - 1 - back)]:
            self.h.ctl.cache.events.put(event)

    # --- one step ---------------------------------------------------------------------------------------

    def do(self, op: Op) -> None:
        kind, a, b, c = op
        h = self.h
        self.leading, self.writes_left = True, None
        if kind == "pod":
            self.add_pod(MEMORIES[a % len(MEMORIES)], 1 + b % 2, 1 + c % 2)
        elif kind == "burst":  # many pods competing for the same kind of slot, seen in one batch
            for _ in range(2 + b % 6):
                self.add_pod(MEMORIES[a % len(MEMORIES)], 1, 1)
            h.deliver()
        elif kind == "delete-pod":
            self.delete("pods", self.pods, a)
        elif kind == "delete-claim":
            self.delete("resourceclaims", self.claims, a)
        elif kind == "deliver":
            h.deliver(1 + a % 4)
        elif kind == "trickle":  # a slow watch: one event at a time, the controller stepping between
            for _ in range(len(h.pending_watch())):
                h.deliver(1)
                h.cycle()
                self.check()
        elif kind == "interleave":
            self.interleave(a)
        elif kind == "replay":
            self.replay(1 + a % 12)
        elif kind == "stale-relist":
            self.stale_relist(1 + a % 4)
        elif kind == "fault":
            # the next allocation write, claim update, or pod patch (release or condition) fails
            method, suffix = (("PUT", "/status"), ("PUT", ""), ("PATCH", ""))[b % 3]
            h.api.fail.append((method, suffix, FAULTS[a % len(FAULTS)]))
        elif kind == "lose-leader":
            self.writes_left = a % 4
        h.cycle()
        self.lists.append(h.api.lists())
        self.check()

    def settle(self) -> None:
        """Leader again, the watch caught up and relisted fresh, until nothing changes."""
        self.leading, self.writes_left = True, None
        self.h.api.fail.clear()
        for _ in range(30):
            before = len(self.h.api.watch)
            self.h.deliver()
            self.h.ctl._last_resync = 0.0  # the periodic resync retries pods an injected 500 left
            self.h.cycle()
            if len(self.h.api.watch) == before and not self.h.pending_watch():
                break
        for event in self.h.api.lists():  # a fresh relist drops whatever a stale one brought back
            self.h.ctl.cache.events.put(event)
        for _ in range(30):
            self.h.deliver()
            self.h.ctl._last_resync = 0.0
            self.h.cycle()
            if not self.h.pending_watch():
                break
        self.check()

    # --- invariants, on the server's objects ----------------------------------------------------------------

    def check(self) -> None:
        api = self.h.api
        violations = api.audit()
        assert violations == [], "\n".join(str(v) for v in violations)
        claims = api.objects["resourceclaims"]
        for key, pod in api.objects["pods"].items():
            if self.h.gated(pod["metadata"]["name"]):
                continue
            for ref in pod["spec"]["resourceClaims"]:
                if f"ns/{ref['resourceClaimName']}" in self.deleted:
                    # Not reserved (no kube-scheduler here): a deleted claim is deallocated at once.
                    continue
                held = claims.get(f"ns/{ref['resourceClaimName']}")
                assert held is not None and (held.get("status") or {}).get("allocation"), (
                    f"pod {key} released without claim {ref['resourceClaimName']} allocated"
                )

    def check_settled(self) -> None:
        api = self.h.api
        pods = {p["metadata"]["uid"] for p in api.objects["pods"].values()}
        for key, held in api.objects["resourceclaims"].items():
            if (held.get("status") or {}).get("allocation"):
                owner = (held["metadata"].get("annotations") or {}).get(ALLOCATED_FOR_ANNOTATION)
                assert owner in pods, f"claim {key} still allocated for pod {owner}, which is gone"
        for key, pod in api.objects["pods"].items():
            if not self.h.gated(pod["metadata"]["name"]):
                continue
            refs = [f"ns/{r['resourceClaimName']}" for r in pod["spec"]["resourceClaims"]]
            if any(r not in api.objects["resourceclaims"] or r in self.deleted for r in refs):
                continue  # waiting for claims: nothing to place, nothing to say
            said = [c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == CONDITION_TYPE]
            assert said and said[0]["status"] == "False", f"pod {key} left gated without a stated reason"
        check_on_simulator(api.objects["resourceclaims"].values(), api.objects["resourceslices"].values())


def check_on_simulator(claims: Any, slices: Any) -> int:
    """Create every allocated MIG device as a GPU instance on a simulated node; NvmlError means the
    allocations are not realisable together. Returns how many instances were created."""
    inventory = Inventory(list(slices))
    wanted: dict[str, dict[int, list[tuple[str, int, str]]]] = defaultdict(lambda: defaultdict(list))
    for held in claims:
        for r in ((held.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
            dev = inventory.device((r["pool"], r["device"]))
            if dev is None or dev.kind is not DeviceKind.MIG or dev.gpu is None:
                continue
            assert dev.profile is not None and dev.start is not None
            wanted[dev.gpu.node][dev.gpu.gpu_index].append((dev.profile, dev.start, object_key(held)))
    created = 0
    with tempfile.TemporaryDirectory() as tmp:
        for node, gpus in wanted.items():
            model, count = NODES[node]
            path = Path(tmp) / f"{node}.json"
            init_sim_state(path, [SimGpuSpec(model) for _ in range(count)])
            nvml = open_sim(path)
            nvml.init()
            try:
                for index, devices in gpus.items():
                    ids = {p.nvml_name.removeprefix("MIG "): p.profile_id for p in nvml.gi_profiles(index)}
                    for profile, start, who in devices:
                        try:
                            nvml.create_gpu_instance(index, ids[profile], start)
                        except NvmlError as exc:
                            raise AssertionError(
                                f"{node}/gpu-{index}: {profile} at slice {start} for {who} cannot be "
                                f"created next to {devices}: {exc}"
                            ) from exc
                        created += 1
            finally:
                nvml.shutdown()
    return created
