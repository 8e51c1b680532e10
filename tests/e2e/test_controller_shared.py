"""The controller allocating shares of HAMi-core GPUs against a real kube-apiserver + kube-scheduler.

A hami-core node's `gpu-<i>-shared` devices are published by hand, exactly as contract C1 describes
(the plugin's own publication is tested in test_plugin_hamicore.py). Claims of the shapes the
compatibility shim writes (contract C3: hami-core with MiB and cores, with a memory percentage, and
`any` with a MIG alternative first) are allocated with a shareID and consumedCapacity per result
(contract C2), which the API server must accept; kube-scheduler binds the released pods; a pod asking
for more than is left waits with the reason and is placed once the earlier pod's claim is freed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.leader import LeaderElector
from controller.loop import Controller
from controller.quantity import parse_quantity
from controller.rest import request
from controller.watchcache import WatchCache
from controller.writer import CONDITION_TYPE, Writer

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node, heartbeat_node
from .objects import pod_body
from .test_controller_allocation import eventually

pytestmark = pytest.mark.e2e
MEMORY_MIB = (16384, 40960)
SPLIT = 4
RESOURCE = "/apis/resource.k8s.io/v1"


def _shared_device(index: int, memory_mib: int) -> dict[str, Any]:
    total = f"{memory_mib}Mi"
    return {
        "name": f"gpu-{index}-shared",
        "allowMultipleAllocations": True,
        "attributes": {
            "type": {"string": "hami-core"},
            "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "model": {"string": "A100-40GB"},
            "architecture": {"string": "ampere"},
            "index": {"int": index},
            "splitCount": {"int": SPLIT},
        },
        "capacity": {
            "memory": {
                "value": total,
                "requestPolicy": {"default": total, "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
            },
            "shares": {"value": str(SPLIT), "requestPolicy": {"default": "1", "validValues": ["1"]}},
        },
    }


def _class(name: str, kind: str) -> dict[str, Any]:
    expr = f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].type == "{kind}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    with control_plane.api_client() as api:
        node = f"ctl-hami-{suffix}"
        create_ready_node(api, node)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER_NAME}-shared"},
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [_shared_device(i, m) for i, m in enumerate(MEMORY_MIB)],
            },
        }
        request(api, "POST", f"{RESOURCE}/resourceslices", body)
        hami, mig = f"hami-{suffix}.{DRIVER_NAME}", f"mig-{suffix}.{DRIVER_NAME}"
        request(api, "POST", f"{RESOURCE}/deviceclasses", _class(hami, "hami-core"))
        request(api, "POST", f"{RESOURCE}/deviceclasses", _class(mig, "mig"))
        namespace = f"ctl-hami-{suffix}"
        create_namespace(api, namespace)
        stop = threading.Event()

        def heartbeats() -> None:
            while not stop.wait(5):
                heartbeat_node(api, node)

        threading.Thread(target=heartbeats, daemon=True).start()
        elector = LeaderElector(api, namespace, f"e2e-{suffix}", lease_s=6, renew_deadline_s=4, retry_s=1)
        elector.start()
        controller = Controller(WatchCache.for_api(api), Writer(api), is_leader=elector.is_leader)
        runner = threading.Thread(target=controller.run, args=(stop.is_set,), daemon=True)
        runner.start()
        yield {"api": api, "node": node, "hami": hami, "mig": mig, "ns": namespace, "elector": elector}
        stop.set()
        elector.stop_event.set()
        runner.join(timeout=10)
        resource: Any = k8s.ResourceV1Api(api)
        k8s.CoreV1Api(api).delete_namespace(namespace)
        resource.delete_device_class(hami)
        resource.delete_device_class(mig)
        resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
        k8s.CoreV1Api(api).delete_node(node)


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
    request(api, "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim)
    pod = pod_body(name, claim["metadata"]["name"], gates=[ALLOCATION_GATE])
    request(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod)


def _allocation(env: dict[str, Any], claim: str) -> dict[str, Any] | None:
    body = request(env["api"], "GET", f"{RESOURCE}/namespaces/{env['ns']}/resourceclaims/{claim}")
    return (body.get("status") or {}).get("allocation")


def _bound(env: dict[str, Any], pod: str) -> str | None:
    core: Any = k8s.CoreV1Api(env["api"])
    name: str | None = core.read_namespaced_pod(pod, env["ns"]).spec.node_name
    return name


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
