"""Whole-GPU claims (class type == "gpu") through the controller against a real control plane: a gated
pod gets an idle `gpu-<i>` allocated, the API server accepts it and kube-scheduler binds the pod; a
pod with a whole GPU and a MIG device lands on one node on two GPUs; with no idle GPU left, a pod
waits with the reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.kube.writer import CONDITION_TYPE

from .cluster import ControlPlane
from .controller_env import (
    controller_env,
    create,
    device_class_body,
    eventually,
    gpu_catalogs,
    published_slices,
    type_is,
)
from .objects import claim_body, pod_body

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:6]
    prefix = f"GPU-whole{suffix}-"
    node = f"whole-h100-{suffix}"
    slices = {node: published_slices(node, gpu_catalogs("H100-80GB", 2, prefix), mig_enabled=False)}
    classes = {"whole": f"whole-{suffix}.{DRIVER_NAME}", "mig": f"mig-{suffix}.{DRIVER_NAME}"}
    # Only this module's GPUs (by UUID prefix): other modules' nodes may still publish devices.
    bodies = [
        device_class_body(classes["whole"], type_is("gpu"), _uuid_starts("uuid", prefix)),
        device_class_body(classes["mig"], type_is("mig"), _uuid_starts("parentUUID", prefix)),
    ]
    with (
        control_plane.api_client() as api,
        controller_env(api, f"whole-{suffix}", slices, bodies) as ctl,
    ):
        yield {"api": api, "node": node, "classes": classes, "ns": ctl.namespace, "elector": ctl.elector}


def _uuid_starts(attribute: str, prefix: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].{attribute}.startsWith("{prefix}")'


def _results(resource: Any, ns: str, claim: str) -> Any:
    status = resource.read_namespaced_resource_claim(claim, ns).status
    return status.allocation.devices.results if status and status.allocation else None


def _two_claim_pod(name: str, whole: str, mig: str) -> dict[str, Any]:
    body = pod_body(name, whole, gates=[ALLOCATION_GATE])
    spec = body["spec"]
    spec["resourceClaims"] = [
        {"name": "whole", "resourceClaimName": whole},
        {"name": "mig", "resourceClaimName": mig},
    ]
    spec["containers"][0]["resources"]["claims"] = [{"name": "whole"}, {"name": "mig"}]
    return body


def test_whole_gpu_claims_are_allocated_bound_and_exclusive(env: dict[str, Any]) -> None:
    api, ns, node = env["api"], env["ns"], env["node"]
    core: Any = k8s.CoreV1Api(api)
    resource: Any = k8s.ResourceV1Api(api)
    eventually(env["elector"].is_leader, 30, "the controller to win the leader election")

    # 1. A whole GPU on its own: allocated by the controller, accepted by the API server, pod bound.
    create(api, ns, "resourceclaims", claim_body("w1", env["classes"]["whole"]))
    create(api, ns, "pods", pod_body("w1", "w1", gates=[ALLOCATION_GATE]))
    (result,) = eventually(lambda: _results(resource, ns, "w1"), 60, "claim w1 to be allocated")
    assert (result.driver, result.pool) == (DRIVER_NAME, node)
    assert result.device in ("gpu-0", "gpu-1")
    eventually(lambda: core.read_namespaced_pod("w1", ns).spec.node_name, 60, "kube-scheduler to bind w1")
    assert not core.read_namespaced_pod("w1", ns).spec.scheduling_gates

    # 2. A whole GPU and a MIG device in one pod: the other GPU can only take one of them.
    create(api, ns, "resourceclaims", claim_body("w2", env["classes"]["whole"]))
    create(api, ns, "resourceclaims", claim_body("m2", env["classes"]["mig"]))
    create(api, ns, "pods", _two_claim_pod("both", "w2", "m2"))

    def reason() -> str | None:
        status = core.read_namespaced_pod("both", ns).status
        conds = [c for c in status.conditions or [] if c.type == CONDITION_TYPE and c.status == "False"]
        return conds[0].reason if conds else None

    # Each fits on the one idle GPU, not both: NoSingleNodeFits (the message says why).
    assert eventually(reason, 60, "pod both to be reported unplaceable") == "NoSingleNodeFits"
    assert _results(resource, ns, "w2") is None and _results(resource, ns, "m2") is None

    # 3. Once w1 is gone both GPUs are idle: the pod gets one whole GPU and a MIG device on the other.
    core.delete_namespaced_pod("w1", ns, grace_period_seconds=0)
    resource.delete_namespaced_resource_claim("w1", ns)
    (whole,) = eventually(lambda: _results(resource, ns, "w2"), 90, "claim w2 to be allocated")
    (mig,) = eventually(lambda: _results(resource, ns, "m2"), 30, "claim m2 to be allocated")
    assert whole.pool == mig.pool == node and whole.device in ("gpu-0", "gpu-1")
    assert "-mig-" in mig.device and not mig.device.startswith(whole.device + "-")
    eventually(lambda: core.read_namespaced_pod("both", ns).spec.node_name, 60, "kube-scheduler to bind both")
