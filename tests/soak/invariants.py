"""The soak's invariants, each a function of a `Truth` (truth.py) returning violations with evidence.

Continuous (`continuous`): no device in two claims (a shared device: its claims' consumed capacity
within what the slice offers); no two allocated devices on one GPU overlapping (MIG placements,
whole GPU vs anything) and no counter of a counter set used beyond its value; every allocation of
ours written by the flexmig controller (its finalizer: a pod admitted ungated would be allocated by
kube-scheduler instead); no HAMi resource left on a stored pod (admitted without the webhook's
rewrite); at most one controller replica leading. `Reasons` tracks pods that wait without a stated
reason. Settled (`settled`, churn paused): GPU instances == prepared claims, checkpoint entries only
for allocated claims, every node publishing, every scheduled pod running. Final (`final`): nothing left.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from api.constants import ALLOCATION_GATE, DeviceKind
from controller.claims.quantity import parse_quantity
from controller.kube.writer import CONDITION_TYPE
from tests.e2e.kubelet_pods import PREPARED_CONDITION

from .truth import Alloc, Obj, Truth


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    subject: str  # what it is about; (kind, subject) identifies a violation across checks
    message: str
    evidence: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)

    def render(self) -> str:
        return f"VIOLATION [{self.kind}] {self.subject}: {self.message}\n    evidence: {self.evidence}"


def _q(value: Any) -> int:
    return int(parse_quantity(str(value)))


def _ev(allocs: Iterable[Alloc]) -> str:
    return "; ".join(
        f"{a.claim} (uid {a.claim_uid[:8]}) -> {a.pool}/{a.device} {dict(a.consumed)}" for a in allocs
    )


# --- continuous -----------------------------------------------------------------------------------


def exclusive_devices(t: Truth) -> list[Violation]:
    out: list[Violation] = []
    by_dev: dict[tuple[str, str], list[Alloc]] = defaultdict(list)
    for a in t.allocs:
        by_dev[(a.pool, a.device)].append(a)
    devices = t.slice_devices()
    for (pool, dev), allocs in sorted(by_dev.items()):
        subject = f"{pool}/{dev}"
        if allocs[0].kind is not DeviceKind.SHARED:
            if len(allocs) > 1:
                out.append(
                    Violation("double-allocation", subject, f"in {len(allocs)} allocations", _ev(allocs))
                )
            continue
        published = devices.get((pool, dev))
        if published is None:
            continue  # the node is republishing; capacity is checked once it is back
        for key, cap in (published.get("capacity") or {}).items():
            if key == "shares":
                used = sum(_q(a.consumed.get("shares", "1")) for a in allocs)
            else:
                used = sum(_q(a.consumed[key]) for a in allocs if key in a.consumed)
            if used > _q(cap["value"]):
                out.append(
                    Violation(
                        "shared-over-capacity", f"{subject}/{key}", f"{used} > {cap['value']}", _ev(allocs)
                    )
                )
    return out


def gpu_geometry(t: Truth) -> list[Violation]:
    """Per GPU: MIG placements disjoint, a whole GPU alone, counters within their values."""
    out: list[Violation] = []
    devices, counter_sets = t.slice_devices(), t.counter_sets()
    per_gpu: dict[tuple[str, int], dict[str, Alloc]] = defaultdict(dict)
    for a in t.allocs:
        per_gpu[(a.pool, a.gpu)].setdefault(a.device, a)  # each device once (double use is reported above)
    for (pool, gpu), allocs in sorted(per_gpu.items()):
        subject = f"{pool}/gpu-{gpu}"
        kinds = {a.kind for a in allocs.values()}
        if DeviceKind.WHOLE in kinds and len(allocs) > 1:
            out.append(Violation("whole-gpu-overlap", subject, "a whole GPU allocated beside other devices",
                                 _ev(allocs.values())))  # fmt: skip
        cells: dict[int, str] = {}
        used: dict[tuple[str, str], int] = defaultdict(int)
        for dev, a in sorted(allocs.items()):
            d = devices.get((pool, dev))
            if d is None:
                continue
            attrs = d.get("attributes") or {}
            if a.kind is DeviceKind.MIG and "placementStart" in attrs:
                start, size = attrs["placementStart"]["int"], attrs["placementSize"]["int"]
                for cell in range(start, start + size):
                    if cell in cells:
                        out.append(Violation("mig-overlap", f"{subject}/slice-{cell}",
                                             f"{cells[cell]} and {dev} overlap", _ev(allocs.values())))  # fmt: skip
                    cells[cell] = dev
            for consumed in d.get("consumesCounters") or ():
                for name, c in (consumed.get("counters") or {}).items():
                    used[(consumed["counterSet"], name)] += _q(c["value"])
        for (cset, name), value in sorted(used.items()):
            cap = (counter_sets.get((pool, cset)) or {}).get(name)
            if cap is not None and value > _q(cap["value"]):
                out.append(Violation("counter-over-use", f"{pool}/{cset}/{name}", f"{value} > {cap['value']}",
                                     _ev(allocs.values())))  # fmt: skip
    return out


def admission(t: Truth) -> list[Violation]:
    out: list[Violation] = []
    for a in t.allocs:
        if not a.finalized:
            out.append(Violation("allocated-not-by-flexmig", a.claim,
                                 "allocated without the flexmig controller's finalizer (pod admitted ungated?)",
                                 _ev([a])))  # fmt: skip
    for p in t.pods:
        for c in (p["spec"].get("containers") or []) + (p["spec"].get("initContainers") or []):
            res = c.get("resources") or {}
            hami = sorted(
                {
                    k
                    for part in ("limits", "requests")
                    for k in res.get(part) or {}
                    if k.startswith("nvidia.com/")
                }
            )
            if hami:
                out.append(Violation("admitted-unrewritten", _pod_key(p),
                                     f"stored with {hami}: the webhook did not rewrite it",
                                     f"gates={p['spec'].get('schedulingGates')}"))  # fmt: skip
    return out


def leaders(t: Truth) -> list[Violation]:
    if len(t.leaders) > 1:
        return [Violation("two-leaders", "controller", "more than one replica reports flexmig_leader 1",
                          f"leading: {t.leaders}")]  # fmt: skip
    return []


def continuous(t: Truth) -> list[Violation]:
    return exclusive_devices(t) + gpu_geometry(t) + admission(t) + leaders(t)


def _pod_key(p: Obj) -> str:
    return f"{p['metadata']['namespace']}/{p['metadata']['name']}"


def _conditions(p: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (p.get("status") or {}).get("conditions") or ()}


def gated(p: Obj) -> bool:
    return any(g.get("name") == ALLOCATION_GATE for g in p["spec"].get("schedulingGates") or ())


def stated_reason(p: Obj) -> str | None:
    """Why a pod that does not run waits, as the pod itself says it (None: it does not say)."""
    conds = _conditions(p)
    for ctype in (CONDITION_TYPE, "PodScheduled", PREPARED_CONDITION):
        c = conds.get(ctype)
        if c and c.get("status") == "False" and (c.get("message") or c.get("reason")):
            return f"{ctype}: {c.get('reason')}: {(c.get('message') or '')[:160]}"
    return None


class Reasons:
    """Pods that wait (gated, unscheduled or unprepared) with no stated reason for longer than `grace_s`."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: dict[str, float] = {}

    def reset(self) -> None:
        """After a fault the clock restarts: the controller may not have been able to say anything."""
        self._since.clear()

    def check(self, t: Truth) -> list[Violation]:
        out, seen = [], set()
        for p in t.pods:
            uid = p["metadata"]["uid"]
            if p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") == "Running":
                continue
            if stated_reason(p) is not None:
                continue
            seen.add(uid)
            first = self._since.setdefault(uid, t.at)
            if t.at - first > self.grace_s:
                where = "gated" if gated(p) else f"node={p['spec'].get('nodeName') or '-'}"
                out.append(Violation("waits-without-reason", _pod_key(p),
                                     f"not running for {t.at - first:.0f}s with no stated reason ({where})",
                                     f"conditions={list(_conditions(p).values())}"))  # fmt: skip
        for uid in set(self._since) - seen:
            del self._since[uid]
        return out
