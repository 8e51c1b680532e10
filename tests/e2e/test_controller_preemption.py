"""Priority preemption in controller mode (issue 26), on the real control plane: flexmig installed by
its chart (its RBAC grants the controller pods/eviction), one simulated A100-40GB node with its plugin
and kubelet stand-in, the controller as a local process with the chart's flags.

A 7g.40gb pod fills the GPU; a 7g.40gb pod of higher priority then evicts it through the Eviction API
and runs once the stand-in has ended it; a PodDisruptionBudget that forbids the eviction is respected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.kube.rest import pod_path
from controller.kube.rest import request as send

from .cluster import ControlPlane, wait_until
from .invariant_watch import InvariantWatch
from .objects import claim_body, pod_body
from .scenario import SCENARIO_LABEL, NodeSpec, Scenario

pytestmark = pytest.mark.e2e
MIG_CLASS = f"mig.{DRIVER_NAME}"
WHOLE_MIG = f'device.attributes["{DRIVER_NAME}"].profile == "7g.40gb"'


@pytest.fixture(scope="module")
def sc(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    s = Scenario(control_plane, [NodeSpec("pre-a100", ("A100-40GB",))])
    classes = {"low": 10, "high": 1000}
    try:
        s.start()
        for name, value in classes.items():
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": f"{name}-{s.suffix}"},
                "value": value,
            }
            send(s.api, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
    except BaseException:
        s.stop(failed=True)
        raise
    failed_before = request.session.testsfailed
    yield s
    for name in classes:
        with contextlib.suppress(ApiException):
            send(s.api, "DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}-{s.suffix}")
    s.stop(failed=request.session.testsfailed > failed_before)


def _pod(sc: Scenario, ns: str, name: str, prio: str) -> None:
    tmpl = f"whole-{name}"
    spec = claim_body(tmpl, MIG_CLASS, [WHOLE_MIG])["spec"]
    sc.create(
        ns,
        "resourceclaimtemplates",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": tmpl}, "spec": {"spec": spec}},
    )  # fmt: skip
    body = pod_body(name, {"resourceClaimTemplateName": tmpl}, gates=[ALLOCATION_GATE])
    body["metadata"]["labels"] = {"app": name}
    body["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix}
    body["spec"]["priorityClassName"] = f"{prio}-{sc.suffix}"
    body["spec"]["terminationGracePeriodSeconds"] = 2
    sc.create(ns, "pods", body)


def _events(sc: Scenario, ns: str, pod: str, reason: str) -> list[dict[str, Any]]:
    items = send(sc.api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == pod and e.get("reason") == reason]


def _gated(sc: Scenario, ns: str, name: str) -> bool:
    pod = send(sc.api, "GET", pod_path(ns, name))
    return any(g.get("name") == ALLOCATION_GATE for g in pod["spec"].get("schedulingGates") or ())


def _evictions(sc: Scenario, result: str) -> float:
    """flexmig_preemption_evictions_total{result} of the controller."""
    assert sc.controller is not None
    families = text_string_to_metric_families(sc.controller.metrics())
    return sum(
        s.value
        for f in families
        for s in f.samples
        if s.name == "flexmig_preemption_evictions_total" and s.labels.get("result") == result
    )


def test_a_high_priority_pod_preempts_a_lower_one_on_a_full_node_and_runs(sc: Scenario) -> None:
    ns = sc.test_namespace("preempt")
    with InvariantWatch(sc, ns) as watch:
        _preempts(sc, ns)
        watch.settle()
    sc.delete_pod(ns, "high")


def _preempts(sc: Scenario, ns: str) -> None:
    _pod(sc, ns, "low", "low")
    low = sc.wait_running(ns, "low")
    _pod(sc, ns, "high", "high")
    # Evicted through the Eviction API, ended by the stand-in with its grace period, claim freed.
    wait_until(lambda: _events(sc, ns, "low", "Preempted"), 60, "the Preempted event on the low-priority pod")
    high = sc.wait_running(ns, "high", timeout_s=120)
    assert high["spec"]["nodeName"] == low["spec"]["nodeName"]
    with pytest.raises(ApiException) as gone:
        send(sc.api, "GET", pod_path(ns, "low"))
    assert gone.value.status == 404
    (preempted,) = _events(sc, ns, "low", "Preempted")
    assert f"{ns}/high" in preempted["message"] and "priority 1000" in preempted["message"]
    (preempting,) = _events(sc, ns, "high", "Preempting")
    assert f"{ns}/low (priority 10)" in preempting["message"]
    assert _evictions(sc, "evicted") >= 1
    (claim,) = sc.claims_of(high)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert "7g40gb" in result["device"]


def test_a_disruption_budget_that_forbids_the_eviction_is_respected(sc: Scenario) -> None:
    ns = sc.test_namespace("preempt-pdb")
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    send(sc.api, "POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb)
    with InvariantWatch(sc, ns) as watch:
        _refused(sc, ns)
        watch.settle()
    sc.delete_pod(ns, "urgent")
    sc.delete_pod(ns, "guarded")


def _refused(sc: Scenario, ns: str) -> None:
    _pod(sc, ns, "guarded", "low")
    sc.wait_running(ns, "guarded")
    refused_before = _evictions(sc, "refused")
    _pod(sc, ns, "urgent", "high")
    wait_until(lambda: _evictions(sc, "refused") > refused_before, 60, "the eviction to be refused (429)")
    guarded = send(sc.api, "GET", pod_path(ns, "guarded"))
    assert not guarded["metadata"].get("deletionTimestamp")
    assert guarded["status"]["phase"] == "Running"
    assert _gated(sc, ns, "urgent") and not _events(sc, ns, "guarded", "Preempted")
