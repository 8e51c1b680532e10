"""flexmig with a REAL kubelet, containerd and runc (issue 11): pods run in real containers.

One simulated A100-40GB x2 node, run by a real kubelet v1.37.2 with containerd 2.4 and runc (built by
k8sbuild/node/build.sh), the chart installed with its webhook and the controller as a local process (the
shim path of test_shim_scenarios.py: the webhook rewrites a HAMi-style pod, the controller allocates, the
kube-scheduler binds). The plugin is registered through the kubelet's own plugin watcher; kubelet calls
NodePrepareResources / NodeUnprepareResources itself, and containerd injects our CDI devices into the
container. What is stood in (GPUs, their device nodes, the driver's /proc and files, the plugin's pod)
is listed in realnode/scenario.py. crictl (built apart, k8sbuild/node/build.sh crictl) checks what the
runtime itself holds, and a failing test's message ends with the node's `crictl ps -a`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from api.constants import ALLOCATION_GATE, ANNOTATION_VGPU_MODE
from api.gen.dra_v1 import api_pb2 as dra_pb2
from api.gen.dra_v1 import api_pb2_grpc as dra_grpc
from controller.kube.rest import request
from driver.cdi import mig_cap_minor, spec_file_name

from .cluster import ControlPlane, wait_until
from .objects import claim_body
from .plugin_harness import wait_slices
from .realnode.images import TEST_IMAGE
from .realnode.node import TOLERATE_ALL, NodeBinaries
from .realnode.scenario import (
    DRIVER_LIBS,
    FAKE_CAPS_MAJOR,
    LIB_DIR,
    RealNodeScenario,
    RealSimNode,
    dump_crictl_on_failure,
)
from .scenario import NodeSpec, ScenarioOptions

pytestmark = pytest.mark.e2e
GUIDE_MEMORY_MIB = 8000
MIG_CLASS = "mig.gpu.flexmig.dev"
# Prints what the container was given, then waits to be stopped.
PROBE = r"""
echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"
for f in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm* /dev/nvidia-caps/*; do [ -e "$f" ] && stat -c 'DEV %n %F %t:%T' "$f"; done
for f in /usr/lib/x86_64-linux-gnu/* /usr/bin/nvidia-*; do [ -e "$f" ] && echo "FILE $f"; done
echo READY
trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done
"""


@pytest.fixture(scope="module")
def sc(
    control_plane: ControlPlane, node_bin_dir: Path, request: pytest.FixtureRequest
) -> Iterator[RealNodeScenario]:
    s = RealNodeScenario(
        control_plane,
        NodeBinaries(node_bin_dir),
        [NodeSpec("real-mig", ("A100-40GB",) * 2)],
        ScenarioOptions(webhook=True),
    )
    try:
        s.start()
        s.wait_webhook()
    except BaseException:
        s.stop(failed=True)
        raise
    failed_before = request.session.testsfailed
    yield s
    s.stop(failed=request.session.testsfailed > failed_before)


def the_node(sc: RealNodeScenario) -> RealSimNode:
    [node] = sc.real_nodes.values()
    return node


def probe_container(node: RealSimNode) -> dict[str, Any]:
    return {
        "name": "main",
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", PROBE],
    }


def pod_spec(node: RealSimNode) -> dict[str, Any]:
    return {
        "automountServiceAccountToken": False,
        "hostNetwork": True,  # no CNI on the test node
        "tolerations": TOLERATE_ALL,  # the node is NotReady without a pod network
        "terminationGracePeriodSeconds": 2,
        "nodeSelector": {"kubernetes.io/hostname": node.name},
    }


def guide_pod(node: RealSimNode, name: str) -> dict[str, Any]:
    """The user guide's pod: two GPUs, 8000 MiB each, MIG mode."""
    container = probe_container(node)
    container["resources"] = {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": str(GUIDE_MEMORY_MIB)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {ANNOTATION_VGPU_MODE: "mig"}},
        "spec": {**pod_spec(node), "containers": [container]},
    }


def wait_output(node: RealSimNode, pod: dict[str, Any], timeout_s: float = 60.0) -> str:
    out: list[str] = []

    def ready() -> bool:
        out[:] = [node.real.container_log(pod, "main")]
        return "READY" in out[0]

    wait_until(ready, timeout_s, f"the container of {pod['metadata']['name']} to report")
    return out[0]


def sim_instances(node: RealSimNode) -> list[tuple[int, int, int, str]]:
    """(gpu, gi, ci, MIG UUID) of every compute instance on the simulated GPUs."""
    snap = node.nd.admin().snapshot()
    return sorted(
        (g.index, gi.gi_id, ci.ci_id, ci.mig_uuid)
        for g in snap.gpus
        for gi in g.gpu_instances
        for ci in gi.compute_instances
    )


def devices_seen(output: str) -> dict[str, tuple[str, int, int]]:
    found = {}
    for m in re.finditer(r"^DEV (\S+) (.+) ([0-9a-f]+):([0-9a-f]+)$", output, re.M):
        found[m.group(1)] = (m.group(2), int(m.group(3), 16), int(m.group(4), 16))
    return found


def check_container_sees_its_instances(
    node: RealSimNode, output: str, realised: list[tuple[int, int, int, str]]
) -> None:
    visible = re.search(r"^VISIBLE=(.*)$", output, re.M)
    assert visible is not None, output
    assert sorted(visible.group(1).split(",")) == sorted(u for *_, u in realised)
    devices = devices_seen(output)
    assert all(kind == "character special file" for kind, _, _ in devices.values()), devices
    for gpu, gi, ci, _ in realised:
        assert f"/dev/nvidia{gpu}" in devices
        for minor in (mig_cap_minor(gpu, gi), mig_cap_minor(gpu, gi, ci)):
            assert devices[f"/dev/nvidia-caps/nvidia-cap{minor}"][1:] == (FAKE_CAPS_MAJOR, minor), devices
            # ...created on the host by the plugin, as the driver's nvidia-modprobe would.
            assert (node.dev_root / f"dev/nvidia-caps/nvidia-cap{minor}").is_char_device()
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(devices)
    files = set(re.findall(r"^FILE (\S+)$", output, re.M))
    for stem in DRIVER_LIBS:
        assert f"{LIB_DIR}/{stem}.so.550.54.15" in files and f"{LIB_DIR}/{stem}.so.1" in files, files
    assert "/usr/bin/nvidia-smi" in files


def check_runtime_view(
    node: RealSimNode, pod: dict[str, Any], realised: list[tuple[int, int, int, str]], spec: dict[str, Any]
) -> None:
    """What containerd itself holds, through crictl: the pod's sandbox is Ready, and its container was
    created with our CDI devices, whose edits put the MIG UUIDs and caps nodes into the OCI spec."""
    meta = pod["metadata"]
    sandboxes = node.real.crictl_json(
        "pods", "--name", meta["name"], "--namespace", meta["namespace"], "-o", "json"
    )["items"]
    mine = [s for s in sandboxes if s["metadata"]["uid"] == meta["uid"]]
    assert len(mine) == 1, f"crictl pods: one sandbox for {meta['name']} wanted, got {sandboxes}"
    [sandbox] = mine
    assert sandbox["state"] == "SANDBOX_READY", sandbox
    [ctr] = node.real.crictl_json("ps", "--pod", sandbox["id"], "--name", "main", "-o", "json")["containers"]
    assert ctr["state"] == "CONTAINER_RUNNING", ctr
    assert pod["status"]["containerStatuses"][0]["containerID"] == f"containerd://{ctr['id']}"
    info = node.real.crictl_json("inspect", ctr["id"])["info"]
    asked = sorted(d["name"] for d in info["config"].get("CDI_devices") or ())
    assert asked == sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"]), info["config"]
    oci = info["runtimeSpec"]
    env = dict(e.split("=", 1) for e in oci["process"]["env"])
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(u for *_, u in realised), env
    devices = {d["path"]: d for d in oci["linux"]["devices"]}
    for gpu, gi, ci, _ in realised:
        for minor in (mig_cap_minor(gpu, gi), mig_cap_minor(gpu, gi, ci)):
            path = f"/dev/nvidia-caps/nvidia-cap{minor}"
            assert path in devices, f"{path} not in the OCI spec's devices {sorted(devices)}"
            dev = devices[path]
            assert (dev["type"], dev["major"], dev["minor"]) == ("c", FAKE_CAPS_MAJOR, minor), dev


def claim_uids(sc: RealNodeScenario, pod: dict[str, Any]) -> list[str]:
    return [c["metadata"]["uid"] for c in sc.claims_of(pod)]


def validate_cdi_dir(sc: RealNodeScenario, node: RealSimNode) -> None:
    import subprocess

    proc = subprocess.run(
        [sc.bins["cdivalidate"], str(node.nd.cdi_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------------------------------


@dump_crictl_on_failure
def test_plugin_registered_through_the_kubelets_plugin_watcher(sc: RealNodeScenario) -> None:
    node = the_node(sc)
    assert node.plugin is not None
    sockets = [p.name for p in node.real.registry_dir.iterdir()]
    assert sockets == ["gpu.flexmig.dev-reg.sock"], sockets
    log = node.real.kubelet_log()
    assert "gpu.flexmig.dev" in log and "DRAPlugin" in log, "the kubelet never mentioned the plugin"
    # Nothing installed nvidia-cdi-hook here: the plugin says so once at start.
    assert "nvidia-cdi-hook not found" in node.plugin.log_text()


@dump_crictl_on_failure
def test_guide_pod_runs_in_a_real_container_and_gives_its_instances_back(sc: RealNodeScenario) -> None:
    ns = sc.test_namespace("real-guide")
    node = the_node(sc)
    created = sc.create(ns, "pods", guide_pod(node, "guide"))
    assert {"name": ALLOCATION_GATE} in created["spec"]["schedulingGates"]  # the webhook rewrote it
    pod = sc.wait_running(ns, "guide", timeout_s=150)
    assert pod["spec"]["nodeName"] == node.name
    realised = sim_instances(node)
    assert len(realised) == 2, realised
    output = wait_output(node, pod)
    check_container_sees_its_instances(node, output, realised)
    [uid] = claim_uids(sc, pod)
    spec_path = node.nd.cdi_dir / spec_file_name(uid)
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == "gpu.flexmig.dev/mig"
    check_runtime_view(node, pod, realised, spec)
    validate_cdi_dir(sc, node)  # the reference library accepts what containerd just used

    sc.delete_pod(ns, "guide", wait_s=90)
    # Only the kubelet's NodeUnprepareResources destroys them: nobody else calls the plugin.
    wait_until(lambda: sim_instances(node) == [], 30, "both MIG instances to be destroyed")
    assert not spec_path.exists()
    assert node.plugin is not None
    calls = [e for e in node.plugin.events() if e.get("event") == "NodeUnprepareResources v1"]
    assert calls and not any(e.get("failed") for e in calls), calls


@dump_crictl_on_failure
def test_resource_claim_pod_survives_plugin_and_kubelet_restarts(sc: RealNodeScenario) -> None:
    ns = sc.test_namespace("real-claim")
    node = the_node(sc)
    claim = claim_body("one", MIG_CLASS, ['device.attributes["gpu.flexmig.dev"].profile == "3g.20gb"'])
    sc.create(ns, "resourceclaims", claim)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "claimed"},
        "spec": {
            **pod_spec(node),
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one"}],
            "containers": [{**probe_container(node), "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    created = sc.create(ns, "pods", body)
    # The webhook gates pods with our claims; the controller allocates (the chart's default mode).
    assert {"name": ALLOCATION_GATE} in created["spec"]["schedulingGates"]
    pod = sc.wait_running(ns, "claimed", timeout_s=150)
    realised = sim_instances(node)
    assert len(realised) == 1, realised
    check_container_sees_its_instances(node, wait_output(node, pod), realised)
    container_id = pod["status"]["containerStatuses"][0]["containerID"]

    # The plugin restarted while the pod runs: kubelet registers it again, nothing is re-created.
    assert node.plugin is not None
    assert node.plugin.stop() == 0
    sc.start_plugin(node)
    assert sim_instances(node) == realised

    # The kubelet restarted. v1.37 restores its prepared claims from its own checkpoint
    # (<root-dir>/dra_manager_state) and does NOT call NodePrepareResources again for a running pod;
    # it wipes the node's ResourceSlices at start and the plugin republishes them on re-registration.
    plugin = node.plugin

    def prepares() -> list[dict[str, Any]]:
        return [e for e in plugin.events() if e.get("event") == "NodePrepareResources v1"]

    calls_before = len(prepares())
    node.real.restart_kubelet()
    wait_until(lambda: "Registered DRA plugin" in node.real.current_kubelet_log(), 60, "re-registration")
    wait_slices(sc.api, node.name, lambda s: bool(s), timeout_s=90)
    assert len(prepares()) == calls_before
    # Prepare repeated on the same claim (what a kubelet without that checkpoint does): idempotent.
    [uid] = claim_uids(sc, pod)
    before = json.loads((node.nd.cdi_dir / spec_file_name(uid)).read_text())
    with grpc.insecure_channel(f"unix:{node.real.plugins_dir / 'gpu.flexmig.dev' / 'dra.sock'}") as ch:
        resp = dra_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace=ns, uid=uid, name="one")]),
            timeout=45,
        )
    assert resp.claims[uid].error == "", resp.claims[uid].error
    assert [list(d.cdi_device_ids) for d in resp.claims[uid].devices] == [
        [f"gpu.flexmig.dev/mig={d['name']}"] for d in before["devices"]
    ]
    assert json.loads((node.nd.cdi_dir / spec_file_name(uid)).read_text()) == before
    assert sim_instances(node) == realised
    current = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/claimed")
    assert current["status"]["containerStatuses"][0]["containerID"] == container_id  # same container
    validate_cdi_dir(sc, node)

    sc.delete_pod(ns, "claimed", wait_s=90)
    wait_until(lambda: sim_instances(node) == [], 30, "the instance to be destroyed")
