"""Hami-core nodes as the controller sees them: `gpu-<i>-shared` devices as the plugin's slice builder
publishes them (contract C1), claims of contract C3 shapes (both in docs/architecture.md), and a mixed MIG + hami-core cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

from ctl_helpers import catalogs, node_slices
from ctl_helpers import claim as ctl_claim

from api.constants import DRIVER_NAME
from controller.allocation.decide import Decider, Decision
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.shim.templates import LABEL_SHIM_TEMPLATE, SHIM_TEMPLATE_VERSION
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.policy.allocator import PackingPolicy
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

MIG = "mig.gpu.flexmig.dev"
HAMI = "hami-core.gpu.flexmig.dev"


def _class(name: str, kind: str) -> dict[str, Any]:
    expr = f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].type == "{kind}"'
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


CLASSES: dict[str, Any] = {MIG: _class(MIG, "mig"), HAMI: _class(HAMI, "hami-core")}


def shared_slice(node: str, memories: list[int], split: int = 10) -> dict[str, Any]:
    """The slice the kubelet plugin's builder publishes for a hami-core node whose GPU i has
    `memories[i]` MiB (A100s otherwise; sizes no A100 has make packing choices visible)."""
    cats = [
        dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, memory_total_mib=m))
        for c, m in zip(catalogs("A100-40GB", len(memories), node), memories, strict=True)
    ]
    config = NodeConfig(node, OperatingMode.HAMI_CORE, device_split_count=split)
    (published,) = build_node_slices(cats, node, 1, config, {}).slices
    return published.body


def decider(
    hami: dict[str, list[int]], mig: dict[str, tuple[str, int]] | None = None, split: int = 10
) -> Decider:
    slices = [shared_slice(node, mems, split) for node, mems in hami.items()]
    slices += [s for node, (model, n) in (mig or {}).items() for s in node_slices(node, model, n)]
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())


def hami_body(
    memory: int | None = None, cores: int | None = None, count: int = 1, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if memory is not None:
        requests["memory"] = f"{memory}Mi"
    if cores is not None:
        requests["cores"] = str(cores)
    requests |= extra or {}
    body: dict[str, Any] = {"deviceClassName": HAMI, "count": count}
    if requests:
        body["capacity"] = {"requests": requests}
    return body


def mig_body(memory: int, count: int = 1) -> dict[str, Any]:
    expr = f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("{memory}Mi")) >= 0'
    return {"deviceClassName": MIG, "count": count, "selectors": [{"cel": {"expression": expr}}]}


def percent_config(percent: Any, request: str = "gpus", **extra: Any) -> dict[str, Any]:
    params = {
        "apiVersion": "gpu.flexmig.dev/v1alpha1",
        "kind": "SharedGpuRequest",
        "memoryPercentage": percent,
    }
    return {"requests": [request], "opaque": {"driver": DRIVER_NAME, "parameters": params | extra}}


def claim(
    name: str,
    exactly: dict[str, Any] | None = None,
    first_available: list[dict[str, Any]] | None = None,
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A claim of the shim's shape: one request named `gpus`, labelled as generated from a shim
    template (the strand-least firstAvailable rule applies to those only)."""
    out = ctl_claim(
        name,
        constraints=constraints,
        first_available=first_available,
        exactly=exactly,
        config=config or [],
        request_name="gpus",
    )
    out["metadata"]["labels"] = {LABEL_SHIM_TEMPLATE: SHIM_TEMPLATE_VERSION}
    return out


def any_claim(name: str, mig_memory: int, hami: dict[str, Any], distinct: bool = False) -> dict[str, Any]:
    """Contract C3 mode any: firstAvailable [mig, hami-core]."""
    subs = [{"name": "mig", **mig_body(mig_memory, hami.get("count", 1))}, {"name": "hami-core", **hami}]
    constraints = (
        [{"requests": ["gpus/hami-core"], "distinctAttribute": f"{DRIVER_NAME}/uuid"}] if distinct else []
    )
    return claim(name, first_available=subs, constraints=constraints)


def commit(d: Decider, decision: Decision) -> None:
    assert decision.ok, decision.message
    for alloc in decision.allocations:
        d.ledger.assume(alloc.uid, alloc.keys)


def used(d: Decider, node: str, index: int) -> tuple[int, int, int]:
    from driver.policy.model import GpuRef

    st = d.ledger.shared_states()[GpuRef(node, index)]
    return st.used.memory_mib, st.used.cores, st.used.shares
