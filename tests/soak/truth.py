"""What the soak's invariants are judged on, read from the sources of truth only: every ResourceClaim's
`status.allocation` and the ResourceSlices from the API server, the soak's pods, the simulator's real
GPU instances (`SimAdmin.snapshot`, the state file the plugins' NVML calls change), each node's plugin
checkpoint file, and which controller replica says it leads (its `flexmig_leader` metric).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.constants import DRIVER_NAME, DeviceKind, parse_device_name
from controller.kube.rest import request
from driver.nvml.sim import SimAdmin
from tests.e2e.scenario import SimNode

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Alloc:
    """One allocation result of our driver in one claim."""

    claim: str  # namespace/name
    claim_uid: str
    pool: str
    device: str
    kind: DeviceKind
    gpu: int
    consumed: Mapping[str, str]
    share_id: str
    finalized: bool  # the claim carries the flexmig controller's finalizer
    reserved_for: tuple[str, ...]  # pod uids


@dataclass(frozen=True, slots=True)
class Instance:
    node: str
    gpu: int
    start: int
    size: int
    profile: str


@dataclass
class Truth:
    at: float
    claims: list[Obj]
    slices: list[Obj]
    pods: list[Obj]
    instances: dict[str, list[Instance]]  # node -> GPU instances on its simulated GPUs
    checkpoints: dict[str, set[str]]  # node -> claim uids in the plugin's checkpoint
    leaders: list[str]
    allocs: list[Alloc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.allocs = list(_allocs(self.claims))

    def slice_devices(self) -> dict[tuple[str, str], Obj]:
        out: dict[tuple[str, str], Obj] = {}
        for s in self.slices:
            pool = s["spec"]["pool"]["name"]
            for d in s["spec"].get("devices") or ():
                out[(pool, d["name"])] = d
        return out

    def counter_sets(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        out: dict[tuple[str, str], Mapping[str, Any]] = {}
        for s in self.slices:
            pool = s["spec"]["pool"]["name"]
            for cs in s["spec"].get("sharedCounters") or ():
                out[(pool, cs["name"])] = cs.get("counters") or {}
        return out

    def complete_pools(self) -> set[str]:
        """Nodes whose slices of one generation are all there (what kube-scheduler would use)."""
        by_pool: dict[str, list[Obj]] = {}
        for s in self.slices:
            by_pool.setdefault(s["spec"]["pool"]["name"], []).append(s)
        done = set()
        for pool, items in by_pool.items():
            gens = {(i["spec"]["pool"]["generation"], i["spec"]["pool"]["resourceSliceCount"]) for i in items}
            if len(gens) == 1 and next(iter(gens))[1] == len(items):
                done.add(pool)
        return done

    def pod_by_uid(self) -> dict[str, Obj]:
        return {p["metadata"]["uid"]: p for p in self.pods}


def _allocs(claims: Iterable[Obj]) -> Iterable[Alloc]:
    for c in claims:
        meta = c["metadata"]
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        reserved = tuple(r.get("uid", "") for r in status.get("reservedFor") or ())
        finalized = any(f.startswith("gpu.flexmig.dev/") for f in meta.get("finalizers") or ())
        for r in results:
            if r.get("driver") != DRIVER_NAME:
                continue
            try:
                name = parse_device_name(r["device"])
            except ValueError:
                continue  # reported by the checker as an unknown device
            yield Alloc(
                f"{meta['namespace']}/{meta['name']}", meta["uid"], r["pool"], r["device"], name.kind,
                name.gpu_index, dict(r.get("consumedCapacity") or {}), str(r.get("shareID") or ""),
                finalized, reserved,
            )  # fmt: skip


def read_checkpoint(path: Path) -> set[str]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    return set((doc.get("claims") or {}).keys()) if isinstance(doc, dict) else set()


def read_instances(node: SimNode) -> list[Instance]:
    snap = SimAdmin(node.nd.sim_state).snapshot()
    return [
        Instance(node.name, g.index, gi.start, gi.size, gi.profile_name)
        for g in snap.gpus
        for gi in g.gpu_instances
    ]


def gather(api: Any, namespace: str, nodes: Mapping[str, SimNode], leaders: Callable[[], list[str]]) -> Truth:
    claims = request(api, "GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]
    query = [("fieldSelector", f"spec.driver={DRIVER_NAME}")]
    slices = request(api, "GET", "/apis/resource.k8s.io/v1/resourceslices", query=query)["items"]
    pods = request(api, "GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return Truth(
        time.monotonic(),
        claims,
        slices,
        pods,
        {n: read_instances(node) for n, node in nodes.items()},
        {n: read_checkpoint(node.nd.checkpoint) for n, node in nodes.items()},
        leaders(),
    )
