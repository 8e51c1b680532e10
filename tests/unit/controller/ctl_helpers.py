"""Simulated clusters as the controller sees them: slices published by the real slice builder."""

from __future__ import annotations

import dataclasses
from typing import Any

from api.constants import DRIVER_NAME
from controller.allocation.decide import Decider
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from driver.policy.allocator import PackingPolicy
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

CLASS = "mig.gpu.flexmig.dev"
CLASSES: dict[str, Any] = {
    CLASS: {
        "metadata": {"name": CLASS},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}],
            "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": {"from": "class"}}}],
        },
    }
}


def catalogs(model: str, n: int, node: str) -> list[GpuCatalog]:
    base = simulated_catalog(model)
    return [
        dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, index=i, uuid=f"GPU-{node}-{i}"))
        for i in range(n)
    ]


def node_slices(node: str, model: str, n: int) -> list[dict[str, Any]]:
    built = build_node_slices(
        catalogs(model, n, node), node, 1, NodeConfig(node, OperatingMode.MIG), dict.fromkeys(range(n), True)
    )
    return [s.body for s in built.slices]


def decider(nodes: dict[str, tuple[str, int]]) -> Decider:
    slices = [s for node, (model, n) in nodes.items() for s in node_slices(node, model, n)]
    inventory = Inventory(slices)
    return Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())


def claim(
    name: str,
    selector: str | None = None,
    count: int = 1,
    constraints: list[dict[str, Any]] | None = None,
    first_available: list[dict[str, Any]] | None = None,
    *,
    exactly: dict[str, Any] | None = None,
    config: list[dict[str, Any]] | None = None,
    request_name: str = "gpu",
) -> dict[str, Any]:
    """A claim with one request: `exactly` (default: CLASS, `count`, `selector`) or `first_available`."""
    if exactly is None:
        exactly = {"deviceClassName": CLASS, "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
    request: dict[str, Any] = {"name": request_name}
    if first_available is not None:
        request["firstAvailable"] = first_available
    else:
        request["exactly"] = exactly
    devices: dict[str, Any] = {"requests": [request], "constraints": constraints or []}
    if config is not None:
        devices["config"] = config
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def mem(mib: int) -> str:
    return f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("{mib}Mi")) >= 0'
