"""End-to-end scenarios of issue 6: flexmig installed by its Helm chart, on simulated nodes.

One `Scenario` serves the module: the chart installed into the real control plane, an A100-40GB node
and an H100-80GB node with two simulated GPUs each (plugin process + kubelet stand-in), the controller
as a local process with the chart's flags and ServiceAccount. Each test cleans up its pods; the
scheduler-mode test puts controller mode back when it is done.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from api.constants import ALLOCATION_GATE, DRIVER_NAME, parse_device_name
from controller.claims.quantity import parse_quantity
from controller.kube.rest import request
from controller.kube.writer import CONDITION_TYPE, FINALIZER
from driver.catalog.allowlist import parse_allowlist
from driver.catalog.discover import discover_all
from driver.catalog.types import GpuCatalog
from driver.nvml.sim import SimGpuInstanceView, open_sim
from driver.nvml.types import GpuInstance, NvmlErrorCode, Placement
from driver.placement.occupancy import Occupancy, OccupancyError
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import OperatingMode, node_config_for

from .cluster import ControlPlane, wait_until
from .kubelet_pods import FAILED_PREPARE, PREPARED_CONDITION
from .objects import claim_body, pod_body
from .plugin_harness import metric_samples, wait_slices
from .scenario import SCENARIO_LABEL, NodeSpec, Scenario, SimNode, run_for_module

pytestmark = pytest.mark.e2e
MIG_CLASS = f"mig.{DRIVER_NAME}"
NODE_INFO = "hami_mig_device_info"  # plugin, node port
CLUSTER_INFO = "hami_node_gpu_mig_instance_info"  # controller port
COMPONENT = "app.kubernetes.io/component"


@pytest.fixture(scope="module")
def sc(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    nodes = [NodeSpec("scn-a100", ("A100-40GB",) * 2), NodeSpec("scn-h100", ("H100-80GB",) * 2)]
    s = Scenario(control_plane, nodes)
    yield from run_for_module(s, request)


def node_of(sc: Scenario, sku: str) -> SimNode:
    return next(n for n in sc.nodes.values() if n.spec.gpus[0] == sku)


def profile_selector(expr: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].profile{expr}'


def template(sc: Scenario, ns: str, name: str, selector: str) -> None:
    spec = claim_body(name, MIG_CLASS, [selector])["spec"]
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name}}
    sc.create(ns, "resourceclaimtemplates", {**body, "spec": {"spec": spec}})


def gpu_pod(sc: Scenario, ns: str, name: str, tmpl: str, *, gated: bool, node: str | None = None) -> None:
    body = pod_body(name, {"resourceClaimTemplateName": tmpl}, gates=[ALLOCATION_GATE] if gated else ())
    body["spec"]["nodeSelector"] = {
        SCENARIO_LABEL: sc.suffix,
        **({"kubernetes.io/hostname": node} if node else {}),
    }
    sc.create(ns, "pods", body)


def allocated(sc: Scenario, pod: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The pod's one claim and its one device's parsed name."""
    (claim,) = sc.claims_of(pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER_NAME and result["pool"] == pod["spec"]["nodeName"], result
    return claim, parse_device_name(result["device"])


def catalogs(node: SimNode, sc: Scenario) -> list[GpuCatalog]:
    cm = request(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/configmaps/{sc.release}-device-config")
    allowlist = parse_allowlist(
        yaml.safe_load(cm["data"]["device-config.yaml"])["nvidia"]["migProfileAllowlist"]
    )
    with open_sim(node.nd.sim_state) as nvml:
        return discover_all(nvml, allowlist)


def check_layouts(sc: Scenario, node: SimNode, pods: list[dict[str, Any]]) -> list[Occupancy]:
    """Every GPU's instances are a legal layout, and they are exactly the pods' allocated devices."""
    snap = node.nd.admin().snapshot()
    occupancies = []
    for cat, gpu in zip(catalogs(node, sc), snap.gpus, strict=True):
        try:
            gis = [_gi(gpu.index, g) for g in gpu.gpu_instances]
            occupancies.append(Occupancy.from_gpu_instances(cat, gis))
        except OccupancyError as exc:
            raise AssertionError(f"GPU {gpu.index} of {node.name} holds an illegal layout: {exc}") from exc
    realised = Counter((i[0], i[1], i[2]) for i in node.instances())
    wanted = Counter((d.gpu_index, d.gi_profile_id, d.start) for d in (allocated(sc, p)[1] for p in pods))
    assert realised == wanted, f"simulator {sorted(realised)} != allocations {sorted(wanted)}"
    return occupancies


def canonical(obj: Any, key: str = "") -> Any:
    """`obj` with every quantity ("value" of a capacity or counter) replaced by its number."""
    if isinstance(obj, dict):
        return {k: canonical(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canonical(v) for v in obj]
    return parse_quantity(obj) if key == "value" and isinstance(obj, str) else obj


def _gi(gpu: int, view: SimGpuInstanceView) -> GpuInstance:
    return GpuInstance(gpu, view.gi_id, view.profile_id, Placement(view.start, view.size))


# --------------------------------------------------------------------------------------------------


def test_helm_install_objects_and_identities(sc: Scenario) -> None:
    status = json.loads(sc.cp.helm("status", sc.release, "-n", sc.namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    manifest = sc.cp.helm("get", "manifest", sc.release, "-n", sc.namespace).stdout
    kinds = Counter(d["kind"] for d in yaml.safe_load_all(manifest) if d)
    assert "MutatingWebhookConfiguration" not in kinds  # installed with webhook.enabled=false
    assert kinds["DeviceClass"] >= 2 and kinds["DaemonSet"] == 1 and kinds["Deployment"] == 1, kinds

    # Who the local processes are, as the API server sees them.
    def whoami(kubeconfig: Any) -> dict[str, Any]:
        with sc.cp.api_client(kubeconfig) as api:
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            info: dict[str, Any] = request(
                api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body
            )
            return dict(info["status"]["userInfo"])

    ctrl = whoami(sc.workdir / "controller.kubeconfig")
    assert ctrl["username"] == f"system:serviceaccount:{sc.namespace}:{sc.controller_sa}"
    for node in sc.nodes.values():
        plugin = whoami(node.nd.kubeconfig)
        assert plugin["username"] == f"system:serviceaccount:{sc.namespace}:{sc.plugin_sa}"
        assert plugin["extra"]["authentication.kubernetes.io/node-name"] == [node.name]
    lease = request(
        sc.api, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{sc.namespace}/leases/flexmig-controller"
    )
    assert lease["spec"]["holderIdentity"] == f"{sc.controller_sa}-local"

    # The stand-ins "run" the chart's pods on the scenario nodes: one plugin per node, the controller.
    def chart_pods() -> list[tuple[str, str]] | None:
        pods = sc.pods(sc.namespace)
        running = sorted(
            (p["metadata"]["labels"][COMPONENT], p["spec"]["nodeName"])
            for p in pods
            if p["status"].get("phase") == "Running"
        )
        return running if len(running) == len(pods) == 3 else None

    wait_until(lambda: chart_pods() is not None, 60, "the chart's pods to run")
    running = chart_pods()
    assert running is not None
    assert [n for c, n in running if c == "kubelet-plugin"] == sorted(sc.nodes)
    assert [c for c, _ in running].count("controller") == 1


def test_slices_of_two_nodes_accepted_as_published(sc: Scenario) -> None:
    cm = request(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/configmaps/{sc.release}-node-config")
    wanted_profiles = {
        "A100-40GB": {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"},
        "H100-80GB": {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"},
    }
    for node in sc.nodes.values():
        served = wait_slices(sc.api, node.name, lambda s: True)
        node_uid = request(sc.api, "GET", f"/api/v1/nodes/{node.name}")["metadata"]["uid"]
        config = node_config_for(cm["data"]["config.json"], node.name, OperatingMode.HAMI_CORE)
        assert config.operating_mode is OperatingMode.MIG  # the chart's nodeconfig made it a MIG node
        modes = {g.index: g.mig_current for g in node.nd.admin().snapshot().gpus}
        generation = served[0]["spec"]["pool"]["generation"]
        built = build_node_slices(catalogs(node, sc), node.name, generation, config, modes, node_uid=node_uid)
        by_name = {s["metadata"]["name"]: s for s in served}
        assert set(by_name) == {s.name for s in built.slices}
        for s in built.slices:
            got = by_name[s.name]
            # Quantities come back in canonical form ("40960Mi" -> "40Gi"): compare their values.
            assert canonical(got["spec"]) == canonical(s.body["spec"]), f"{s.name} is not as published"
            assert got["metadata"]["ownerReferences"] == s.body["metadata"]["ownerReferences"]
        devices = [d for s in served for d in s["spec"].get("devices") or ()]
        mig = [d["attributes"] for d in devices if d["attributes"]["type"]["string"] == "mig"]
        assert {a["profile"]["string"] for a in mig} == wanted_profiles[node.spec.gpus[0]]
        uuids = {g.uuid for g in node.nd.admin().snapshot().gpus}
        assert {a["parentUUID"]["string"] for a in mig} == uuids and len(uuids) == 2

    # A kubelet restart wipes the node's slices; the plugin republishes them on its re-registration.
    node = node_of(sc, "H100-80GB")
    before = wait_slices(sc.api, node.name, lambda s: True)
    generation = before[0]["spec"]["pool"]["generation"]
    sc.restart_standin(node.name)
    after = wait_slices(sc.api, node.name, lambda s: s[0]["spec"]["pool"]["generation"] > generation)
    assert canonical([s["spec"]["devices"] for s in after if "devices" in s["spec"]]) == canonical(
        [s["spec"]["devices"] for s in before if "devices" in s["spec"]]
    )


def _run_3g_pod(sc: Scenario, ns: str, *, gated: bool) -> tuple[dict[str, Any], SimNode, Any]:
    template(sc, ns, "three-g", profile_selector('.startsWith("3g.")'))
    gpu_pod(sc, ns, "three-g", "three-g", gated=gated)
    pod = sc.wait_running(ns, "three-g")
    node = sc.nodes[pod["spec"]["nodeName"]]
    claim, dev = allocated(sc, pod)
    assert dev.profile is not None and dev.profile.startswith("3g")
    assert [(i[0], i[1], i[2]) for i in node.instances()] == [(dev.gpu_index, dev.gi_profile_id, dev.start)]
    assert any(a.kind == "prepare" and a.claims == (claim["metadata"]["name"],) for a in node.standin.actions)
    return pod, node, claim


def test_template_pod_with_3g_selector_runs_and_is_reclaimed(sc: Scenario) -> None:
    ns = sc.test_namespace("scn-tmpl")
    _, node, claim = _run_3g_pod(sc, ns, gated=True)
    assert FINALIZER in claim["metadata"]["finalizers"]  # the controller allocated it
    data = claim["status"]["devices"][0]["data"]
    mig_uuid = data["migUUID"]

    rows = [r for r in metric_samples(node.metrics(), NODE_INFO) if r["pod"] == "three-g"]
    assert len(rows) == 1 and rows[0]["namespace"] == ns and rows[0]["mig_uuid"] == mig_uuid, rows
    assert rows[0]["profile"] == data["profile"] and rows[0]["profile"].startswith("3g.")

    def cluster_row() -> list[dict[str, str]]:
        assert sc.controller is not None
        return [r for r in metric_samples(sc.controller.metrics(), CLUSTER_INFO) if r["mig_uuid"] == mig_uuid]

    wait_until(lambda: len(cluster_row()) == 1, 30, "the controller's metrics to show the instance")
    assert cluster_row()[0]["node"] == node.name and cluster_row()[0]["profile"] == data["profile"]

    sc.delete_pod(ns, "three-g")
    assert node.instances() == []
    assert not [r for r in metric_samples(node.metrics(), NODE_INFO) if r["pod"] == "three-g"]
    wait_until(lambda: not cluster_row(), 30, "the controller's metrics to drop the instance")


def test_prepare_failure_is_reported_on_the_pod_and_retried(sc: Scenario) -> None:
    ns = sc.test_namespace("scn-retry")
    h100 = node_of(sc, "H100-80GB")
    h100.nd.admin().inject_fault("nvmlDeviceCreateGpuInstanceWithPlacement", 1, NvmlErrorCode.UNKNOWN)
    template(sc, ns, "one", profile_selector('.startsWith("1g.")'))
    gpu_pod(sc, ns, "flaky", "one", gated=True, node=h100.name)
    pod = sc.wait_running(ns, "flaky")
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds[PREPARED_CONDITION] == "True"
    failed = [a for a in h100.standin.actions if a.kind == "failed" and a.pod == f"{ns}/flaky"]
    assert failed and "NodePrepareResources failed" in failed[0].detail, h100.standin.actions
    events = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    reasons = {(e["reason"], e["involvedObject"]["name"]) for e in events}
    assert (FAILED_PREPARE, "flaky") in reasons, reasons
    sc.delete_pod(ns, "flaky")
    assert h100.instances() == []


def test_scheduler_mode_allocates_from_our_slices(sc: Scenario) -> None:
    def chart_pods(component: str) -> set[str]:
        pods = sc.pods(sc.namespace)
        return {p["metadata"]["uid"] for p in pods if p["metadata"]["labels"].get(COMPONENT) == component}

    plugin_pods = chart_pods("kubelet-plugin")
    sc.stop_controller()
    try:
        sc.upgrade("--set", "allocationMode=scheduler")
        deployments = request(sc.api, "GET", f"/apis/apps/v1/namespaces/{sc.namespace}/deployments")["items"]
        assert not deployments, "scheduler mode installs no controller"
        wait_until(lambda: not chart_pods("controller"), 60, "the controller pod to go")
        assert chart_pods("kubelet-plugin") == plugin_pods  # the plugins (and their tokens) live on

        ns = sc.test_namespace("scn-sched")
        pod, node, claim = _run_3g_pod(sc, ns, gated=False)
        assert FINALIZER not in (claim["metadata"].get("finalizers") or ())  # kube-scheduler allocated it
        assert not pod["spec"].get("schedulingGates")
        sc.delete_pod(ns, "three-g")
        assert node.instances() == []

        # Counters keep kube-scheduler's allocations apart: 7g + 3g + 3g fill the A100 node's GPUs,
        # a 1g then cannot be scheduled until one of them is gone.
        a100 = node_of(sc, "A100-40GB")
        for name, expr in (("seven", '== "7g.40gb"'), ("three", '== "3g.20gb"'), ("one", '== "1g.5gb"')):
            template(sc, ns, name, profile_selector(expr))
        order = [("big", "seven"), ("left", "three"), ("right", "three")]
        for name, tmpl in order:
            gpu_pod(sc, ns, name, tmpl, gated=False, node=a100.name)
            sc.wait_running(ns, name)
        gpu_pod(sc, ns, "small", "one", gated=False, node=a100.name)

        def unschedulable() -> bool:
            conds = (
                request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/small")
                .get("status", {})
                .get("conditions")
                or ()
            )
            return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)

        wait_until(unschedulable, 60, "kube-scheduler to find no room for the 1g pod")
        pods = [request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/{n}") for n, _ in order]
        check_layouts(sc, a100, pods)
        sc.delete_pod(ns, "left")
        pods = [sc.wait_running(ns, n) for n in ("big", "right", "small")]
        check_layouts(sc, a100, pods)
        for name in ("big", "right", "small"):
            sc.delete_pod(ns, name)
        assert a100.instances() == []
    finally:
        sc.upgrade("--set", "allocationMode=controller")
        sc.start_controller()


def test_fill_a100_then_refill_holes(sc: Scenario) -> None:
    ns = sc.test_namespace("scn-fill")
    a100 = node_of(sc, "A100-40GB")
    for size in ("1g.5gb", "2g.10gb", "3g.20gb"):
        template(sc, ns, size.split(".")[0], profile_selector(f' == "{size}"'))
    running: dict[str, dict[str, Any]] = {}

    def place(name: str, tmpl: str) -> bool:
        """Create a gated pod; True when it runs, False when the controller finds no room."""
        gpu_pod(sc, ns, name, tmpl, gated=True, node=a100.name)

        def settled() -> bool:
            pod = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            conds = {c["type"]: c for c in pod.get("status", {}).get("conditions") or ()}
            if pod["status"].get("phase") == "Running" and conds.get("Ready", {}).get("status") == "True":
                running[name] = pod
                return True
            return bool(conds.get(CONDITION_TYPE, {}).get("status") == "False")

        wait_until(settled, 90, f"pod {name} to run or be refused")
        return name in running

    mix = ["3g", "2g", "1g", "3g", "2g", "1g"]
    assert all(place(f"p{i}-{t}", t) for i, t in enumerate(mix)), "the mix fits two A100-40GB GPUs"
    extra = 0
    while place(f"fill-{extra}", "1g"):
        extra += 1
        assert extra <= 14, "more 1g instances than two A100-40GB GPUs hold"
    occupancies = check_layouts(sc, a100, list(running.values()))
    for occ in occupancies:  # full: no allowed profile has a free placement left on any GPU
        assert not [p.name for p in occ.profiles if occ.free_placements(p)], [str(i) for i in occ.instances]

    # Free a 3g and a 2g; the waiting 1g moves in, then new pods fill what is left.
    for name in ("p0-3g", "p1-2g"):
        sc.delete_pod(ns, name)
        running.pop(name)
    running[f"fill-{extra}"] = sc.wait_running(ns, f"fill-{extra}")
    check_layouts(sc, a100, list(running.values()))
    assert place("refill-3g", "3g") or place("refill-2g", "2g"), "a freed 3g+2g hole holds at least a 2g"
    n = 0
    while place(f"refill-1g-{n}", "1g"):
        n += 1
    occupancies = check_layouts(sc, a100, list(running.values()))
    for occ in occupancies:
        assert not [p.name for p in occ.profiles if occ.free_placements(p)], [str(i) for i in occ.instances]
    for pod in sc.pods(ns):  # the running ones and those the controller refused
        sc.delete_pod(ns, pod["metadata"]["name"], wait_s=0)
    wait_until(lambda: not sc.pods(ns) and not a100.instances(), 90, "every fill pod and instance to go")
