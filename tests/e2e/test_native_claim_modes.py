"""Native claims on the real control plane in both allocation modes (issue 24, point 3): the same claim
allocated by kube-scheduler (`allocationMode: scheduler`) and by flexmig's controller prepares the same
thing on the node, the share size of a `SharedGpuRequest` config included; adminAccess claims
(controller mode) watch an instance another claim holds without creating, holding or destroying it;
and a DeviceTaintRule keeps untolerating pods off the devices it selects until it is deleted.

One Helm release (scenario.py) with a MIG node (H100-80GB) and a hami-core node (A100-40GB with
HAMi-core's library); pods are gated by the test in controller mode (no webhook).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.claims.quantity import parse_quantity
from controller.kube.rest import MERGE_PATCH, request
from controller.kube.writer import CONDITION_TYPE
from driver.cdi import spec_file_name

from .cluster import ControlPlane, wait_until
from .objects import pod_body
from .scenario import SCENARIO_LABEL, NodeSpec, Scenario, SimNode, run_for_module

MIG_CLASS = "mig.gpu.flexmig.dev"
HAMI_CLASS = "hami-core.gpu.flexmig.dev"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
PERCENT = 25


@pytest.fixture(scope="module")
def sc(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    nodes = [
        NodeSpec("ncm-mig", ("H100-80GB",), mode="mig"),
        NodeSpec("ncm-hami", ("A100-40GB",), mode="hami-core", hami_core_library=True),
    ]
    s = Scenario(control_plane, nodes)
    yield from run_for_module(s, request)


def _node(sc: Scenario, mode: str) -> SimNode:
    return next(n for n in sc.nodes.values() if n.spec.mode == mode)


def _template(
    sc: Scenario, ns: str, name: str, exactly: dict[str, Any], config: list[Any] | None = None
) -> None:
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if config:
        devices["config"] = config
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }
    sc.create(ns, "resourceclaimtemplates", body)


def _pod(sc: Scenario, ns: str, name: str, tmpl: str, *, gated: bool, node: SimNode) -> dict[str, Any]:
    body = pod_body(name, {"resourceClaimTemplateName": tmpl}, gates=[ALLOCATION_GATE] if gated else ())
    body["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix, "kubernetes.io/hostname": node.name}
    sc.create(ns, "pods", body)
    return sc.wait_running(ns, name)


def _env(node: SimNode, claim_uid: str) -> list[str]:
    spec = json.loads((Path(node.nd.cdi_dir) / spec_file_name(claim_uid)).read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env") or ()] + list(
        (spec.get("containerEdits") or {}).get("env") or ()
    )


def _share(sc: Scenario, ns: str, name: str, gated: bool, hami: SimNode) -> tuple[str, dict[str, Any]]:
    """The memory limit the node prepared for the pod's share, and its claim's one result."""
    pod = _pod(sc, ns, name, "quarter", gated=gated, node=hami)
    [claim] = sc.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    limit = next(e for e in _env(hami, claim["metadata"]["uid"]) if e.startswith("CUDA_DEVICE_MEMORY_LIMIT_"))
    sc.delete_pod(ns, name)
    return limit, result


def test_a_percent_share_prepares_the_same_limit_in_both_modes(sc: Scenario) -> None:
    ns = sc.test_namespace("ncm-share")
    hami = _node(sc, "hami-core")
    params = {
        "apiVersion": "gpu.flexmig.dev/v1alpha1",
        "kind": "SharedGpuRequest",
        "memoryPercentage": PERCENT,
    }
    config = [{"requests": ["gpus"], "opaque": {"driver": DRIVER_NAME, "parameters": params}}]
    _template(sc, ns, "quarter", {"deviceClassName": HAMI_CLASS}, config)

    by_controller, result = _share(sc, ns, "by-controller", True, hami)
    wanted_mib = parse_quantity(result["consumedCapacity"]["memory"]) / 2**20
    assert by_controller.endswith(f"={int(wanted_mib)}m"), (by_controller, result)

    sc.stop_controller()
    try:
        sc.upgrade("--set", "allocationMode=scheduler")
        by_scheduler, result = _share(sc, ns, "by-scheduler", False, hami)
    finally:
        sc.upgrade("--set", "allocationMode=controller")
        sc.start_controller()
    # kube-scheduler counts the request policy's default (the whole GPU); the node still gives the
    # share the config's percentage, as in controller mode.
    assert parse_quantity(result["consumedCapacity"]["memory"]) / 2**20 > wanted_mib, result
    assert by_scheduler == by_controller


def test_admin_access_watches_the_owners_instance_and_leaves_it(sc: Scenario) -> None:
    mig = _node(sc, "mig")
    owner_ns = sc.test_namespace("ncm-owner")
    admin_ns = sc.test_namespace("ncm-admin")
    one_g = f'device.attributes["{DRIVER_NAME}"].profile.startsWith("1g.")'
    exactly = {"deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": one_g}}]}
    _template(sc, owner_ns, "one", exactly)
    # Without the namespace label the API server refuses adminAccess (upstream's rule).
    with pytest.raises(ApiException) as refused:
        _template(sc, owner_ns, "watch", {**exactly, "adminAccess": True})
    assert refused.value.status in (403, 422) and ADMIN_LABEL in str(refused.value.body)
    request(
        sc.api,
        "PATCH",
        f"/api/v1/namespaces/{admin_ns}",
        {"metadata": {"labels": {ADMIN_LABEL: "true"}}},
        content_type=MERGE_PATCH,
    )
    _template(sc, admin_ns, "watch", {**exactly, "adminAccess": True})

    owner = _pod(sc, owner_ns, "owner", "one", gated=True, node=mig)
    [owner_claim] = sc.claims_of(owner)
    [held] = owner_claim["status"]["allocation"]["devices"]["results"]
    before = mig.instances()
    assert len(before) == 1

    admin = _pod(sc, admin_ns, "monitor", "watch", gated=True, node=mig)
    [admin_claim] = sc.claims_of(admin)
    [watched] = admin_claim["status"]["allocation"]["devices"]["results"]
    assert watched["adminAccess"] is True and watched["device"] == held["device"], (watched, held)
    assert mig.instances() == before  # nothing created
    # The admin's container sees the owner's MIG instance (the same NVIDIA_VISIBLE_DEVICES).
    owner_env = _env(mig, owner_claim["metadata"]["uid"])
    assert [e for e in owner_env if e.startswith("NVIDIA_VISIBLE_DEVICES=MIG-")], owner_env
    assert _env(mig, admin_claim["metadata"]["uid"]) == owner_env

    sc.delete_pod(admin_ns, "monitor")
    assert mig.instances() == before  # the admin's unprepare leaves the owner's instance
    sc.delete_pod(owner_ns, "owner")
    assert mig.instances() == []


def test_a_device_taint_rule_keeps_untolerating_pods_off_its_devices(sc: Scenario) -> None:
    mig = _node(sc, "mig")
    ns = sc.test_namespace("ncm-taint")
    _template(sc, ns, "plain", {"deviceClassName": MIG_CLASS})
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"ncm-maintenance-{sc.suffix}"},
        "spec": {
            "deviceSelector": {"driver": DRIVER_NAME, "pool": mig.name},
            "taint": {"key": "example.com/maintenance", "value": "now", "effect": "NoSchedule"},
        },
    }
    path = "/apis/resource.k8s.io/v1/devicetaintrules"
    request(sc.api, "POST", path, rule)
    try:
        body = pod_body("waits", {"resourceClaimTemplateName": "plain"}, gates=[ALLOCATION_GATE])
        body["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix, "kubernetes.io/hostname": mig.name}
        sc.create(ns, "pods", body)

        def told() -> bool:
            pod = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/waits")
            conds = (pod.get("status") or {}).get("conditions") or ()
            return any(
                c["type"] == CONDITION_TYPE
                and c["status"] == "False"
                and "example.com/maintenance" in c["message"]
                for c in conds
            )

        wait_until(told, 60, "the pod to be told the rule's taint keeps it off the devices")
        assert mig.instances() == []
    finally:
        request(sc.api, "DELETE", f"{path}/{rule['metadata']['name']}")
    sc.wait_running(ns, "waits")  # the rule gone, the devices are free again
    sc.delete_pod(ns, "waits")
    assert mig.instances() == []
