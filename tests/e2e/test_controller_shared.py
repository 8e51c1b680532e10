"""The controller allocating shares of HAMi-core GPUs against a real kube-apiserver + kube-scheduler.

A hami-core node's `gpu-<i>-shared` devices (contract C1, docs/architecture.md) are published by hand, as the plugin's own
slice builder makes them (the plugin publishing them is tested in test_plugin_hamicore.py). Claims of the shapes the
compatibility shim writes (contract C3: hami-core with MiB and cores, with a memory percentage, and
`any` with a MIG alternative first) are allocated with a shareID and consumedCapacity per result
(contract C2), which the API server must accept; kube-scheduler binds the released pods; a pod asking
for more than is left waits with the reason and is placed once the earlier pod's claim is freed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.claims.quantity import parse_quantity
from controller.kube.rest import request
from controller.kube.writer import CONDITION_TYPE
from kubeletplugin.settings.nodeconfig import OperatingMode

from .cluster import ControlPlane
from .controller_env import (
    RESOURCE,
    bound_node,
    controller_env,
    create,
    device_class_body,
    eventually,
    gpu_catalogs,
    published_slices,
    type_is,
)
from .objects import pod_body

pytestmark = pytest.mark.e2e
MEMORY_MIB = (16384, 40960)
SPLIT = 4


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    node = f"ctl-hami-{suffix}"
    # A 16 GiB GPU (no A100 has that) next to a 40 GiB one: best fit shows in where shares land.
    catalogs = gpu_catalogs("A100-40GB", len(MEMORY_MIB), memory_mib=MEMORY_MIB)
    slices = {node: published_slices(node, catalogs, OperatingMode.HAMI_CORE, split_count=SPLIT)}
    hami, mig = f"hami-{suffix}.{DRIVER_NAME}", f"mig-{suffix}.{DRIVER_NAME}"
    classes = [device_class_body(hami, type_is("hami-core")), device_class_body(mig, type_is("mig"))]
    with (
        control_plane.api_client() as api,
        controller_env(api, f"ctl-hami-{suffix}", slices, classes) as ctl,
    ):
        yield {
            "api": api,
            "node": node,
            "hami": hami,
            "mig": mig,
            "ns": ctl.namespace,
            "elector": ctl.elector,
        }


def _hami(cls: str, count: int, memory_mib: int | None, cores: int) -> dict[str, Any]:
    requests = {"cores": str(cores)} | ({"memory": f"{memory_mib}Mi"} if memory_mib is not None else {})
    return {"deviceClassName": cls, "count": count, "capacity": {"requests": requests}}


def _claim(name: str, request_body: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpus", **request_body}], **devices}},
    }


def _run_pod(env: dict[str, Any], name: str, claim: dict[str, Any]) -> None:
    api, ns = env["api"], env["ns"]
    create(api, ns, "resourceclaims", claim)
    create(api, ns, "pods", pod_body(name, claim["metadata"]["name"], gates=[ALLOCATION_GATE]))


def _allocation(env: dict[str, Any], claim: str) -> dict[str, Any] | None:
    body = request(env["api"], "GET", f"{RESOURCE}/namespaces/{env['ns']}/resourceclaims/{claim}")
    return (body.get("status") or {}).get("allocation")


def _bound(env: dict[str, Any], pod: str) -> str | None:
    return bound_node(env["api"], env["ns"], pod)


def test_shares_on_distinct_gpus_are_allocated_and_the_pod_bound(env: dict[str, Any]) -> None:
    eventually(env["elector"].is_leader, 30, "the controller to win the leader election")
    distinct = [{"requests": ["gpus"], "distinctAttribute": f"{DRIVER_NAME}/uuid"}]
    _run_pod(env, "two", _claim("two", {"exactly": _hami(env["hami"], 2, 4000, 30)}, constraints=distinct))
    allocation = eventually(lambda: _allocation(env, "two"), 60, "claim two to be allocated")
    results = allocation["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0-shared", "gpu-1-shared"]
    for r in results:
        assert r["pool"] == env["node"] and r["request"] == "gpus"
        assert uuid.UUID(r["shareID"]).version == 4
        assert r["consumedCapacity"] == {"memory": "4000Mi", "cores": "30", "shares": "1"}
    assert eventually(lambda: _bound(env, "two"), 60, "kube-scheduler to bind pod two") == env["node"]


def test_percent_and_mixed_shapes(env: dict[str, Any]) -> None:
    eventually(env["elector"].is_leader, 30, "leadership")
    config = [
        {
            "requests": ["gpus"],
            "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": f"{DRIVER_NAME}/v1alpha1",
                    "kind": "SharedGpuRequest",
                    "memoryPercentage": 25,
                },
            },
        }
    ]
    _run_pod(env, "pct", _claim("pct", {"exactly": _hami(env["hami"], 1, None, 0)}, config=config))
    allocation = eventually(lambda: _allocation(env, "pct"), 60, "claim pct to be allocated")
    (result,) = allocation["devices"]["results"]
    # 25% of the GPU it landed on (best fit: the 16 GiB one still has room).
    total = MEMORY_MIB[int(result["device"].split("-")[1])]
    # The API server keeps quantities in canonical form ("4096Mi" comes back as "4Gi").
    assert parse_quantity(result["consumedCapacity"]["memory"]) == total * 25 // 100 * 2**20
    assert allocation["devices"]["config"][0]["opaque"]["parameters"]["memoryPercentage"] == 25

    expr = f'device.capacity["{DRIVER_NAME}"].memory.compareTo(quantity("2000Mi")) >= 0'
    mig_alt = {
        "name": "mig",
        "deviceClassName": env["mig"],
        "count": 1,
        "selectors": [{"cel": {"expression": expr}}],
    }
    hami_alt = {"name": "hami-core", **_hami(env["hami"], 1, 2000, 10)}
    _run_pod(env, "any", _claim("any", {"firstAvailable": [mig_alt, hami_alt]}))
    allocation = eventually(lambda: _allocation(env, "any"), 60, "claim any to be allocated")
    (result,) = allocation["devices"]["results"]
    assert result["request"] == "gpus/hami-core"  # no MIG device is published here
    assert result["consumedCapacity"] == {"memory": "2000Mi", "cores": "10", "shares": "1"}
    assert eventually(lambda: _bound(env, "any"), 60, "pod any bound") == env["node"]


def test_a_pod_waits_for_memory_and_is_placed_once_it_is_freed(env: dict[str, Any]) -> None:
    eventually(env["elector"].is_leader, 30, "leadership")
    core: Any = k8s.CoreV1Api(env["api"])
    # Whatever the earlier tests left, 30000 MiB fits only the 40 GiB GPU, and only once.
    _run_pod(env, "big-1", _claim("big-1", {"exactly": _hami(env["hami"], 1, 30000, 0)}))
    eventually(lambda: _bound(env, "big-1"), 60, "big-1 bound")
    _run_pod(env, "big-2", _claim("big-2", {"exactly": _hami(env["hami"], 1, 30000, 0)}))

    def condition() -> Any:
        status = core.read_namespaced_pod("big-2", env["ns"]).status
        conds = [c for c in status.conditions or [] if c.type == CONDITION_TYPE]
        return conds[0] if conds and conds[0].status == "False" else None

    cond = eventually(condition, 60, "big-2 to be reported unplaceable")
    assert cond.reason == "AllPlacementsTaken" and "memory" in cond.message
    core.delete_namespaced_pod("big-1", env["ns"], grace_period_seconds=0)
    eventually(
        lambda: True if _allocation(env, "big-1") is None else None, 60, "big-1's claim to be deallocated"
    )
    assert eventually(lambda: _bound(env, "big-2"), 60, "big-2 bound after release") == env["node"]


def test_one_container_with_shares_from_two_claims_is_refused(env: dict[str, Any]) -> None:
    eventually(env["elector"].is_leader, 30, "leadership")
    api, ns = env["api"], env["ns"]
    core: Any = k8s.CoreV1Api(api)
    for name in ("two-a", "two-b"):
        create(api, ns, "resourceclaims", _claim(name, {"exactly": _hami(env["hami"], 1, 1000, 0)}))
    pod = pod_body("two-claims", "two-a", gates=[ALLOCATION_GATE])
    pod["spec"]["resourceClaims"].append({"name": "second", "resourceClaimName": "two-b"})
    pod["spec"]["containers"][0]["resources"]["claims"].append({"name": "second"})
    create(api, ns, "pods", pod)

    def condition() -> Any:
        status = core.read_namespaced_pod("two-claims", ns).status
        conds = [c for c in status.conditions or [] if c.type == CONDITION_TYPE]
        return conds[0] if conds and conds[0].status == "False" else None

    cond = eventually(condition, 60, "the pod to be refused")
    assert (
        cond.reason == "InvalidRequest" and "more than one claim" in cond.message and "main" in cond.message
    )
    # Nothing half-done: neither claim was allocated, the pod stays gated.
    assert _allocation(env, "two-a") is None and _allocation(env, "two-b") is None
    core.delete_namespaced_pod("two-claims", ns, grace_period_seconds=0)
