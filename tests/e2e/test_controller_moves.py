"""Moving movable pods (issue 26, docs/moves.md) on the real control plane: flexmig installed by its
chart, one simulated node with two A100-40GB, the controller as a local process with `--moves=true`.

Each GPU holds one 1g.5gb pod: one from a Deployment that opted in (`gpu.flexmig.dev/movable`), one
bare pod that did not. A 7g.40gb pod (a whole GPU) fits nowhere and has no lower-priority pod to
preempt; the controller evicts the movable pod, its Deployment recreates it, the replacement is
placed on the other GPU (its reserved destination) and the big pod gets the GPU it left. The pod
without the opt-in is never evicted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from api.constants import ALLOCATION_GATE, ANNOTATION_MOVABLE, DRIVER_NAME
from controller.kube.rest import pod_path
from controller.kube.rest import request as send
from controller.kube.roomstore import KEY, ROOM_STATE_NAME
from controller.runtime.crashpoints import ENV_POINTS

from .cluster import ControlPlane, wait_until
from .invariant_watch import InvariantWatch
from .objects import claim_body, pod_body
from .scenario import SCENARIO_LABEL, NodeSpec, Scenario, ScenarioOptions, run_for_module

pytestmark = pytest.mark.e2e
MIG_CLASS = f"mig.{DRIVER_NAME}"
PROFILE = f'device.attributes["{DRIVER_NAME}"].profile'
INDEX = f'device.attributes["{DRIVER_NAME}"].index'


@pytest.fixture(scope="module")
def sc(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    s = Scenario(
        control_plane,
        [NodeSpec("mv-a100", ("A100-40GB", "A100-40GB"))],
        ScenarioOptions(controller_args=("--moves=true",)),
    )
    yield from run_for_module(s, request)


def _template(sc: Scenario, ns: str, name: str, selectors: list[str]) -> None:
    spec = claim_body(name, MIG_CLASS, selectors)["spec"]
    sc.create(
        ns,
        "resourceclaimtemplates",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name}, "spec": {"spec": spec}},
    )  # fmt: skip


def _pod(sc: Scenario, ns: str, name: str, selectors: list[str]) -> dict[str, Any]:
    _template(sc, ns, f"t-{name}", selectors)
    body = pod_body(name, {"resourceClaimTemplateName": f"t-{name}"}, gates=[ALLOCATION_GATE])
    body["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix}
    body["spec"]["terminationGracePeriodSeconds"] = 2
    sc.create(ns, "pods", body)
    return sc.wait_running(ns, name, timeout_s=120)


def _gpu(sc: Scenario, pod: dict[str, Any]) -> int:
    (claim,) = sc.claims_of(pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return int(str(result["device"]).split("-")[1])  # gpu-<index>-...


def _pods(sc: Scenario, ns: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = send(
        sc.api, "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}"
    )["items"]
    return items


def _events(sc: Scenario, ns: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = send(sc.api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason]


def _room_state(sc: Scenario) -> dict[str, Any]:
    cm = send(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/configmaps/{ROOM_STATE_NAME}")
    doc: dict[str, Any] = json.loads(cm["data"][KEY])
    return doc


def _one_small_pod_per_gpu(sc: Scenario, ns: str) -> tuple[dict[str, Any], int, int, dict[str, Any]]:
    """The Deployment's movable pod on one GPU, the pod without the opt-in ("stay") on the other:
    (the movable pod, its GPU, the other GPU, "stay")."""
    # A whole GPU taken for a moment, so that the movable pod lands on the other one.
    blocker = _pod(sc, ns, "blocker", [f'{PROFILE} == "7g.40gb"'])
    taken = _gpu(sc, blocker)
    _template(sc, ns, "small", [f'{PROFILE} == "1g.5gb"'])
    pod = pod_body("mover", {"resourceClaimTemplateName": "small"}, gates=[ALLOCATION_GATE])
    pod["metadata"] = {"labels": {"app": "mover"}, "annotations": {ANNOTATION_MOVABLE: "true"}}
    pod["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix}
    pod["spec"]["terminationGracePeriodSeconds"] = 2
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mover"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "mover"}}, "template": pod},
    }
    send(sc.api, "POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    wait_until(lambda: len(_pods(sc, ns, "mover")) == 1, 60, "the Deployment's pod")
    first = sc.wait_running(ns, _pods(sc, ns, "mover")[0]["metadata"]["name"], timeout_s=120)
    moved_from = _gpu(sc, first)
    assert moved_from != taken
    sc.delete_pod(ns, "blocker")
    # The pod that did not opt in, on the GPU the blocker left: each GPU now holds one small pod.
    stay = _pod(sc, ns, "stay", [f'{PROFILE} == "1g.5gb"', f"{INDEX} == {taken}"])
    return first, moved_from, taken, stay


def _big_pod(sc: Scenario, ns: str) -> None:
    """A 7g.40gb pod: a whole GPU, which only moving the movable pod can free."""
    big = pod_body("big", {"resourceClaimTemplateName": "t-big"}, gates=[ALLOCATION_GATE])
    _template(sc, ns, "t-big", [f'{PROFILE} == "7g.40gb"'])
    big["spec"]["nodeSelector"] = {SCENARIO_LABEL: sc.suffix}
    big["spec"]["terminationGracePeriodSeconds"] = 2
    sc.create(ns, "pods", big)


def test_a_big_pod_gets_room_by_moving_a_movable_pod_its_deployment_recreates(sc: Scenario) -> None:
    ns = sc.test_namespace("moves")
    with InvariantWatch(sc, ns) as watch:
        _moves(sc, ns)
        watch.settle()
    send(sc.api, "DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/mover")
    for name in ("big", "stay", "after"):
        sc.delete_pod(ns, name)


def _moves(sc: Scenario, ns: str) -> None:
    first, moved_from, taken, stay = _one_small_pod_per_gpu(sc, ns)
    _big_pod(sc, ns)
    placed = sc.wait_running(ns, "big", timeout_s=180)
    assert _gpu(sc, placed) == moved_from  # the GPU the movable pod left
    (replacement,) = [p for p in _pods(sc, ns, "mover") if p["metadata"]["uid"] != first["metadata"]["uid"]]
    replacement = sc.wait_running(ns, replacement["metadata"]["name"], timeout_s=120)
    assert _gpu(sc, replacement) == taken  # its reserved destination, next to "stay"
    still = send(sc.api, "GET", pod_path(ns, "stay"))
    assert still["metadata"]["uid"] == stay["metadata"]["uid"] and not still["metadata"].get(
        "deletionTimestamp"
    )
    assert [e["involvedObject"]["name"] for e in _events(sc, ns, "Moved")] == [first["metadata"]["name"]]
    assert not [e for e in _events(sc, ns, "Moved") if e["involvedObject"]["name"] == "stay"]
    assert _events(sc, ns, "MakingRoom")
    # The leader's promises were kept for the next leader (controller/kube/roomstore.py), with the
    # chart's permissions: once the move completed, its rate-limit entry and window remain.
    doc = _room_state(sc)
    moved = {first["metadata"]["uid"], replacement["metadata"]["uid"]}
    assert doc["moves"] == [] and doc["nominations"] == []
    assert {m["uid"] for m in doc["moved"]} >= moved and len(doc["evictions"]) == 1
    # A new controller process reads them back: it keeps them (a leader that had not would write
    # its empty state over them after its first step, which placing a pod proves it took).
    sc.stop_controller()
    sc.start_controller()
    _pod(sc, ns, "after", [f'{PROFILE} == "1g.5gb"'])
    doc = _room_state(sc)
    assert {m["uid"] for m in doc["moved"]} >= moved and len(doc["evictions"]) == 1


def test_a_move_completes_after_the_controller_died_right_after_its_eviction(sc: Scenario) -> None:
    """The controller is killed (SIGKILL) right after it evicted the movable pod and wrote its promises;
    the next controller process reads them back, keeps the room for the big pod and places the
    replacement at its reserved destination, evicting nobody else."""
    ns = sc.test_namespace("moves-crash")
    with InvariantWatch(sc, ns) as watch:
        _moves_across_a_crash(sc, ns)
        watch.settle()
    send(sc.api, "DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/mover")
    sc.delete_pod(ns, "big")
    sc.delete_pod(ns, "stay")


def _moves_across_a_crash(sc: Scenario, ns: str) -> None:
    first, moved_from, taken, _ = _one_small_pod_per_gpu(sc, ns)
    sc.stop_controller()
    armed = sc.start_controller(extra_env={ENV_POINTS: "after-move-evictions"})
    _big_pod(sc, ns)
    wait_until(lambda: armed.proc.poll() is not None, 120, "the armed controller to die at its crashpoint")
    assert "controller crashpoint reached" in armed.log_text()
    assert armed.stop() == -9
    sc.controller = None
    offset = len(armed.log_text())
    successor = sc.start_controller(leftovers_gone=False)
    placed = sc.wait_running(ns, "big", timeout_s=180)
    assert _gpu(sc, placed) == moved_from
    (replacement,) = [p for p in _pods(sc, ns, "mover") if p["metadata"]["uid"] != first["metadata"]["uid"]]
    replacement = sc.wait_running(ns, replacement["metadata"]["name"], timeout_s=120)
    assert _gpu(sc, replacement) == taken
    assert "promises of the previous leader read back" in successor.log_text()[offset:]
    assert [e["involvedObject"]["name"] for e in _events(sc, ns, "Moved")] == [first["metadata"]["name"]]
    doc = _room_state(sc)
    assert doc["moves"] == [] and doc["nominations"] == []
