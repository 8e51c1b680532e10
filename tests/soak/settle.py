"""Invariants that hold only once the churn has stopped and every component caught up.

`settled(t)` is empty when: every MIG device allocated to a claim reserved by a running pod has its
GPU instance on that node's simulated GPU (same GPU, start and size); every GPU instance belongs to an
allocated claim's MIG device; every checkpoint entry belongs to an allocated claim; every node
publishes a complete set of ResourceSlices; every scheduled pod runs. `final(t)` is empty when nothing
is left: no claim in the soak namespace, no allocation of ours anywhere, no GPU instance, no checkpoint
entry. The caller polls until a check comes back empty or its window ends, and reports what is left.
"""

from __future__ import annotations

from api.constants import DeviceKind

from .invariants import Violation, _pod_key, stated_reason
from .truth import Instance, Truth


def _placement(t: Truth, pool: str, device: str) -> tuple[int, int] | None:
    d = t.slice_devices().get((pool, device))
    if d is None:
        return None
    attrs = d.get("attributes") or {}
    if "placementStart" not in attrs:
        return None
    return int(attrs["placementStart"]["int"]), int(attrs["placementSize"]["int"])


def settled(t: Truth, nodes: list[str]) -> list[Violation]:
    out: list[Violation] = []
    pods = t.pod_by_uid()
    running = {u for u, p in pods.items() if (p.get("status") or {}).get("phase") == "Running"}
    expected: dict[tuple[str, int, int, int], str] = {}  # (node, gpu, start, size) -> claim (prepared)
    allocated: dict[tuple[str, int, int, int], str] = {}  # any allocated MIG device
    for a in t.allocs:
        if a.kind is not DeviceKind.MIG:
            continue
        placement = _placement(t, a.pool, a.device)
        if placement is None:
            continue
        key = (a.pool, a.gpu, *placement)
        allocated[key] = a.claim
        if any(u in running for u in a.reserved_for):
            expected[key] = a.claim
    actual: dict[tuple[str, int, int, int], Instance] = {
        (i.node, i.gpu, i.start, i.size): i for node in t.instances.values() for i in node
    }
    for key, claim in sorted(expected.items()):
        if key not in actual:
            out.append(Violation("prepared-without-instance", claim,
                                 "its pod runs but the GPU has no instance at the allocated placement",
                                 f"expected {key}; instances on {key[0]}: {t.instances.get(key[0])}"))  # fmt: skip
    for key, inst in sorted(actual.items()):
        if key not in allocated:
            out.append(Violation("instance-without-claim", f"{inst.node}/gpu-{inst.gpu}/{inst.start}",
                                 f"GPU instance {inst.profile} at start {inst.start} belongs to no allocated claim",
                                 f"allocated MIG placements on {inst.node}: "
                                 f"{sorted(k for k in allocated if k[0] == inst.node)}"))  # fmt: skip
    allocated_uids = {a.claim_uid for a in t.allocs}
    for node, uids in sorted(t.checkpoints.items()):
        for uid in sorted(uids - allocated_uids):
            out.append(Violation("checkpoint-without-claim", f"{node}/{uid}",
                                 "checkpoint entry for a claim that is not allocated", f"checkpoint uids {sorted(uids)}"))  # fmt: skip
    for node in sorted(set(nodes) - t.complete_pools()):
        out.append(Violation("node-silent", node, "publishes no complete set of ResourceSlices",
                             f"pools present: {sorted(t.complete_pools())}"))  # fmt: skip
    for p in t.pods:
        if p["metadata"].get("deletionTimestamp") or not p["spec"].get("nodeName"):
            continue
        if (p.get("status") or {}).get("phase") != "Running":
            out.append(Violation("scheduled-not-running", _pod_key(p), f"bound to {p['spec']['nodeName']} but not running",
                                 f"reason: {stated_reason(p)}"))  # fmt: skip
    return out


def final(t: Truth, namespace: str) -> list[Violation]:
    out: list[Violation] = []
    for c in t.claims:
        if c["metadata"]["namespace"] == namespace:
            out.append(Violation("left-claim", f"{namespace}/{c['metadata']['name']}", "claim left after all pods went",
                                 f"finalizers={c['metadata'].get('finalizers')} "
                                 f"allocated={bool((c.get('status') or {}).get('allocation'))}"))  # fmt: skip
    for a in t.allocs:
        out.append(
            Violation(
                "left-allocation", a.claim, "allocation left after all pods went", f"{a.pool}/{a.device}"
            )
        )
    for node, insts in sorted(t.instances.items()):
        for i in insts:
            out.append(Violation("left-instance", f"{node}/gpu-{i.gpu}/{i.start}", f"GPU instance {i.profile} left",
                                 str(i)))  # fmt: skip
    for node, uids in sorted(t.checkpoints.items()):
        if uids:
            out.append(
                Violation("left-checkpoint", node, f"{len(uids)} checkpoint entries left", str(sorted(uids)))
            )
    for p in t.pods:
        out.append(
            Violation(
                "left-pod",
                _pod_key(p),
                "pod left after deletion",
                str(p["metadata"].get("deletionTimestamp")),
            )
        )
    return out
