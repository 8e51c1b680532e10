"""A share sized by a `SharedGpuRequest` memoryPercentage config prepares the same limit whoever
allocated the claim: flexmig's controller (controller mode: consumedCapacity carries the size) or
kube-scheduler (scheduler mode: consumedCapacity is the request policy's default, the whole GPU, and
the config is copied into the allocation). The node reads the config in both (shareconfig.py).

The controller-mode allocation comes from the real Decider over the slice this node's builder
publishes; the scheduler-mode one is what upstream's allocator writes for the same claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from controller.allocation.decide import Decider
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger
from driver.catalog.discover import discover_all
from driver.nvml.sim import SimGpuSpec
from driver.policy.allocator import PackingPolicy
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import claim_view_from_dict
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

NODE = "hami-node"
HAMI = "hami-core.gpu.flexmig.dev"
UID = "0b4c3a3e-9f5e-4c9e-8a59-1d2c3b4a5f61"
HAMI_CLASS = {
    "metadata": {"name": HAMI},
    "spec": {
        "selectors": [
            {"cel": {"expression": f'device.attributes["{DRIVER_NAME}"].type == "hami-core"'}},
        ]
    },
}


def _percent(percent: int, requests: list[str] | None = None) -> dict[str, Any]:
    params = {
        "apiVersion": "gpu.flexmig.dev/v1alpha1",
        "kind": "SharedGpuRequest",
        "memoryPercentage": percent,
    }
    out: dict[str, Any] = {"opaque": {"driver": DRIVER_NAME, "parameters": params}}
    if requests is not None:
        out["requests"] = requests
    return out


def _claim(config: list[dict[str, Any]], request: dict[str, Any] | None = None) -> dict[str, Any]:
    req = request or {"name": "gpus", "exactly": {"deviceClassName": HAMI, "count": 1}}
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": UID},
        "spec": {"devices": {"requests": [req], "config": config}},
    }


def _node(tmp_path: Path) -> tuple[SimNode, dict[str, Any]]:
    node = make_node(
        tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=False)], api=FakeApi(), hami_library=True
    )
    config = NodeConfig(NODE, OperatingMode.HAMI_CORE, device_split_count=10)
    (published,) = build_node_slices(discover_all(node.nvml), NODE, 1, config, {}).slices
    return node, published.body


def _controller_allocation(slice_body: dict[str, Any], claim: dict[str, Any]) -> dict[str, Any]:
    inventory = Inventory([slice_body])
    decider = Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())
    decision = decider.decide([claim], {HAMI: HAMI_CLASS})
    assert decision.ok, decision.message
    alloc = decision.allocations[0]
    return {"devices": {"results": alloc.results, "config": alloc.config}}


def _scheduler_allocation(
    slice_body: dict[str, Any], claim: dict[str, Any], result_request: str
) -> dict[str, Any]:
    """What upstream's allocator writes: the request policy defaults as consumed capacity, a share id,
    and the claim's configs that apply (FromClaim)."""
    dev = next(d for d in slice_body["spec"]["devices"] if d["name"] == "gpu-0-shared")
    consumed = {name: cap["requestPolicy"]["default"] for name, cap in dev["capacity"].items()}
    result = {
        "request": result_request,
        "driver": DRIVER_NAME,
        "pool": NODE,
        "device": "gpu-0-shared",
        "shareID": "5b0e3c1a-7d3f-4a51-9b8e-2a4c6e8f0a12",
        "consumedCapacity": consumed,
    }
    configs = [{"source": "FromClaim", **c} for c in claim["spec"]["devices"]["config"]]
    return {"devices": {"results": [result], "config": configs}}


def _prepared_limit(node: SimNode, claim: dict[str, Any], allocation: dict[str, Any]) -> str:
    full = {
        **claim,
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]},
    }
    node.api.claims[("ns", "c")] = claim_view_from_dict(full)
    result = node.preparer.prepare([ClaimRef(namespace="ns", uid=UID, name="c")])[UID]
    assert result.error == ""
    env = [e for d in node.spec(UID)["devices"] for e in d["containerEdits"]["env"]]
    node.preparer.close()
    return next(e for e in env if e.startswith("CUDA_DEVICE_MEMORY_LIMIT_0="))


@pytest.mark.parametrize(
    ("config", "request_body", "result_request"),
    [
        ([_percent(25, ["gpus"])], None, "gpus"),
        ([_percent(40)], None, "gpus"),  # a config naming no request applies to all
        (
            [_percent(10, ["gpus/share"])],
            {"name": "gpus", "firstAvailable": [{"name": "share", "deviceClassName": HAMI}]},
            "gpus/share",
        ),
    ],
)
def test_both_modes_prepare_the_same_share_size(
    tmp_path: Path, config: list[dict[str, Any]], request_body: dict[str, Any] | None, result_request: str
) -> None:
    claim = _claim(config, request_body)
    node, body = _node(tmp_path / "controller")
    controller = _prepared_limit(node, claim, _controller_allocation(body, claim))
    node, body = _node(tmp_path / "scheduler")
    scheduler = _prepared_limit(node, claim, _scheduler_allocation(body, claim, result_request))
    total = node.nvml.gpu(0).memory_total_mib
    percent = config[0]["opaque"]["parameters"]["memoryPercentage"]
    assert controller == scheduler == f"CUDA_DEVICE_MEMORY_LIMIT_0={total * percent // 100}m"


def test_a_config_for_another_request_leaves_the_consumed_capacity(tmp_path: Path) -> None:
    claim = _claim([_percent(25, ["other"])])
    node, body = _node(tmp_path)
    limit = _prepared_limit(node, claim, _scheduler_allocation(body, claim, "gpus"))
    assert limit == f"CUDA_DEVICE_MEMORY_LIMIT_0={node.nvml.gpu(0).memory_total_mib}m"


def test_an_unreadable_config_of_ours_fails_the_prepare_naming_it(tmp_path: Path) -> None:
    bad = {
        "opaque": {
            "driver": DRIVER_NAME,
            "parameters": {"apiVersion": "gpu.flexmig.dev/v1alpha1", "kind": "Nope"},
        }
    }
    claim = _claim([bad])
    node, body = _node(tmp_path)
    allocation = _scheduler_allocation(body, claim, "gpus")
    full = {
        **claim,
        "status": {"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]},
    }
    node.api.claims[("ns", "c")] = claim_view_from_dict(full)
    result = node.preparer.prepare([ClaimRef(namespace="ns", uid=UID, name="c")])[UID]
    node.preparer.close()
    assert "status.allocation.devices.config[0].opaque.parameters.kind: 'Nope'" in result.error
