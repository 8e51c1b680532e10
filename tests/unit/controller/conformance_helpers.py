"""Builders for test_ctl_upstream_conformance.py: upstream allocator test cases translated onto
flexmig's published devices (A100-40GB MIG devices, whole GPUs, hami-core shares).

Each case registers its upstream name and how flexmig's answer compares (`OUTCOMES`):
- "same": the same outcome (allocated with equivalent devices, or not allocated / refused, as upstream);
- "refused": upstream allocates, flexmig refuses with a message naming the field;
- "different": any other answer (a defect, or a documented deliberate difference).
docs/native-claims.md reports the counts; a test keeps the two equal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from ctl_helpers import CLASS, mem, node_slices

from api.constants import DRIVER_NAME
from controller.allocation.decide import Decider, Decision
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.policy.allocator import PackingPolicy

OUTCOMES: dict[str, str] = {}
F = TypeVar("F", bound=Callable[..., None])

OTHER = "other.example.com"  # a class selecting another driver's devices: nothing of ours matches
CLASS_B = "class-b"
WHOLE = "gpu.flexmig.dev"  # whole GPUs (published next to the MIG devices of a Hopper GPU)
CLASSES: dict[str, Any] = {
    WHOLE: {
        "metadata": {"name": WHOLE},
        "spec": {"selectors": [{"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].type == "gpu"'}}]},
    },
    CLASS: {
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    },
    CLASS_B: {
        "metadata": {"name": CLASS_B},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{OTHER}"'}}]},
    },
}


def upstream(name: str, outcome: str) -> Callable[[F], F]:
    """Register the test as the translation of upstream case `name` with `outcome`."""
    assert outcome in ("same", "refused", "different") and name not in OUTCOMES

    def register(fn: F) -> F:
        OUTCOMES[name] = outcome
        return fn

    return register


def decider(
    gpus: int = 1,
    nodes: tuple[str, ...] = ("node-1",),
    taints: dict[int, list[Any]] | None = None,
    model: str = "A100-40GB",
) -> Decider:
    """Nodes of `model` GPUs (A100-40GB: MIG devices only; H100-80GB: whole GPUs as well), `gpus` each;
    `taints` puts taints on every device of GPU i."""
    slices = [copy.deepcopy(s) for n in nodes for s in node_slices(n, model, gpus)]
    for s in slices:
        for dev in s["spec"].get("devices") or ():
            for i, ts in (taints or {}).items():
                if dev["name"].startswith(f"gpu-{i}-") or dev["name"] == f"gpu-{i}":
                    dev["taints"] = ts
    return from_slices(slices)


def from_slices(slices: list[dict[str, Any]]) -> Decider:
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())


def ex(name: str, count: int = 1, sel: str | None = None, cls: str = CLASS, **extra: Any) -> dict[str, Any]:
    """An `exactly` request."""
    body: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if sel:
        body["selectors"] = [{"cel": {"expression": sel}}]
    return {"name": name, "exactly": body}


def sub(name: str, count: int = 1, sel: str | None = None, cls: str = CLASS, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "deviceClassName": cls, "count": count, **extra}
    if sel:
        body["selectors"] = [{"cel": {"expression": sel}}]
    return body


def fa(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    """A `firstAvailable` request."""
    return {"name": name, "firstAvailable": list(subs)}


def claim(
    name: str,
    *requests: dict[str, Any],
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints is not None:
        devices["constraints"] = constraints
    if config is not None:
        devices["config"] = config
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def opaque(tag: str, requests: list[str] | None = None) -> dict[str, Any]:
    """A claim config for another driver (flexmig's own decoder is strict about its own configs)."""
    out: dict[str, Any] = {"opaque": {"driver": OTHER, "parameters": {"tag": tag}}}
    if requests is not None:
        out["requests"] = requests
    return out


def requests_of(decision: Decision) -> list[str]:
    return [r["request"] for a in decision.allocations for r in a.results]


def commit(d: Decider, decision: Decision) -> None:
    assert decision.ok, decision.message
    for alloc in decision.allocations:
        d.ledger.assume(alloc.uid, alloc.keys)


def fill(d: Decider, mib: int, times: int) -> None:
    """Allocate `times` devices of at least `mib` MiB to other claims (allocatedDevices upstream)."""
    for i in range(times):
        commit(d, d.decide([claim(f"busy-{mib}-{i}", ex("r", sel=mem(mib)))], CLASSES))


TAINT_NO_SCHEDULE = {"key": "example.com/taint", "value": "tainted", "effect": "NoSchedule"}
TAINT_NO_EXECUTE = {"key": "example.com/taint", "value": "tainted-2", "effect": "NoExecute"}
TAINT_NONE = {"key": "example.com/taint", "value": "tainted", "effect": "None"}
TOL_NO_SCHEDULE = {"operator": "Exists", "key": "example.com/taint", "effect": "NoSchedule"}
TOL_NO_EXECUTE = {
    "operator": "Equal",
    "key": "example.com/taint",
    "value": "tainted-2",
    "effect": "NoExecute",
}
