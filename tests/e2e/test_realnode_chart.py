"""The chart's own pods on a REAL node (issue 22, Build 2): `helm install`, flexmig's image, real runtime.

The chart is installed with values only (no post-rendering) into the suite's control plane; its
controller Deployment and kubelet-plugin DaemonSet run as containers of flexmig's image (built by
deployments/image/build.sh, imported into containerd) on one real kubelet + containerd + runc node
whose GPUs are the NVML simulator (realnode/chart.py says what is stood in and which values carry it).
Then user pods run in real containers: the guide pod (HAMi limits `nvidia.com/gpu: 1` +
`nvidia.com/gpumem`, rewritten by the webhook the API server calls), a native ResourceClaim pod, and,
after `helm upgrade` switches the node to hami-core, a HAMi-core shared pod. Each container reports
what a CUDA program would need: device nodes, the driver's libraries and binaries (from a stand-in
driver tree at a host path other than `/`), and its environment.

Network: the chart's defaults on a real pod network (realnode/network.py: CNI bridge + host-local,
kube-proxy), so the module starts its own control plane whose API server pods can reach through the
`kubernetes` Service; test_realnode_lifecycle.py covers the `hostNetwork: true` values.

Named test_realnode_* so that conftest.py builds the node binaries before any test; a cold image
build takes minutes, hence the longer timeout.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.constants import ALLOCATION_GATE, ANNOTATION_VGPU_MODE, DRIVER_NAME
from controller.kube.rest import request
from driver.cdi import mig_cap_minor

from .cluster import SERVICE_CIDR, ControlPlane, wait_until
from .objects import claim_body
from .plugin_harness import scrape
from .realnode.chart import ChartNodeScenario, host_ip, new_gpus, spec_of
from .realnode.images import TEST_IMAGE, product_image
from .realnode.node import TOLERATE_ALL, NodeBinaries
from .realnode.scenario import DRIVER_BINS, DRIVER_LIBS, DRIVER_VERSION, FAKE_CAPS_MAJOR, LIB_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
GUIDE_MEMORY_MIB = 8000
# What the container was given, then waits to be stopped (busybox: no sed, so a read loop).
PROBE = r"""
env | grep -E '^(NVIDIA|CUDA)_' | while read -r l; do echo "ENV $l"; done
for f in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm* /dev/nvidia-caps/*; do [ -e "$f" ] && stat -c 'DEV %n %F %t:%T' "$f"; done
for f in /usr/lib/x86_64-linux-gnu/* /usr/bin/nvidia-* /usr/local/vgpu/* /etc/ld.so.preload; do [ -e "$f" ] && echo "FILE $f"; done
echo READY
trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done
"""
# Paths only the plugin's container has: a CDI spec naming one would mount nothing on the host.
CONTAINER_ONLY_ROOTS = ("/driver-root", "/dev-root", "/proc-root", "/cdi-hook")


@pytest.fixture(scope="module")
def pod_network_cp(k8s_bin_dir: Path, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane of this module's own whose API server also listens on, and advertises, this
    machine's address: the `kubernetes` Service then has an endpoint pods can reach (the session's
    control plane listens on loopback only)."""
    cp = ControlPlane(k8s_bin_dir, advertise_address=host_ip())
    cp.start()
    failed_before = request.session.testsfailed
    yield cp
    cp.stop(failed=request.session.testsfailed > failed_before)


@pytest.fixture(scope="module")
def sc(
    pod_network_cp: ControlPlane, node_bin_dir: Path, request: pytest.FixtureRequest
) -> Iterator[ChartNodeScenario]:
    if os.geteuid() != 0:
        raise AssertionError("the real-node tests need root (containerd, runc, kubelet): run pytest as root")
    image = product_image()
    # GPU 0 in MIG mode for the MIG pods; GPU 1 with MIG off, shared once the node is hami-core.
    gpus = new_gpus([("A100-40GB", True), ("A100-40GB", False)])
    s = ChartNodeScenario(
        pod_network_cp, NodeBinaries(node_bin_dir), image, gpus, mode="mig", pod_network=True
    )
    try:
        s.start()
    except BaseException as exc:
        exc.add_note(f"chart pods: {s.explain()}\n{s.logs_of('kubelet-plugin')}\n{s.logs_of('controller')}")
        s.stop(failed=True)
        raise
    failed_before = request.session.testsfailed
    yield s
    s.stop(failed=request.session.testsfailed > failed_before)


def user_pod(sc: ChartNodeScenario, name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "hostNetwork": not sc.pod_network,
            "tolerations": TOLERATE_ALL,  # the node is NotReady without a pod network
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"kubernetes.io/hostname": sc.node_name},
            "containers": [
                {
                    "name": "main",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", PROBE],
                    **container,
                }
            ],
        },
    }


def guide_pod(sc: ChartNodeScenario, name: str, mode: str) -> dict[str, Any]:
    """The user guide's pod: one GPU with 8000 MiB, in the given vgpu-mode."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(GUIDE_MEMORY_MIB)}
    pod = user_pod(sc, name, resources={"limits": limits})
    pod["metadata"]["annotations"] = {ANNOTATION_VGPU_MODE: mode}
    return pod


def wait_output(sc: ChartNodeScenario, pod: dict[str, Any]) -> str:
    out: list[str] = []

    def ready() -> bool:
        out[:] = [sc.container_log(pod, "main")]
        return "READY" in out[0]

    wait_until(ready, 60, f"the container of {pod['metadata']['name']} to report")
    return out[0]


def seen(output: str) -> tuple[dict[str, str], dict[str, tuple[int, int]], set[str]]:
    """(environment, device nodes -> (major, minor), files) the container reported."""
    env = dict(m.split("=", 1) for m in re.findall(r"^ENV (\S+)$", output, re.M))
    devices = {}
    for m in re.finditer(r"^DEV (\S+) character special file ([0-9a-f]+):([0-9a-f]+)$", output, re.M):
        devices[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16))
    return env, devices, set(re.findall(r"^FILE (\S+)$", output, re.M))


def host_paths(spec: dict[str, Any]) -> list[str]:
    edits = [spec.get("containerEdits") or {}, *(d.get("containerEdits") or {} for d in spec["devices"])]
    return [
        x.get("hostPath") or x["path"]
        for e in edits
        for x in [*(e.get("mounts") or ()), *(e.get("deviceNodes") or ())]
    ]


def check_driver_files(sc: ChartNodeScenario, spec: dict[str, Any], files: set[str]) -> None:
    """The driver's libraries and binaries are in the container, mounted from the HOST driver root."""
    for stem in DRIVER_LIBS:
        assert {f"{LIB_DIR}/{stem}.so.{DRIVER_VERSION}", f"{LIB_DIR}/{stem}.so.1"} <= files, files
    assert {f"/usr/bin/{b}" for b in DRIVER_BINS} <= files, files
    paths = host_paths(spec)
    assert f"{sc.driver_root}{LIB_DIR}/libcuda.so.{DRIVER_VERSION}" in paths, paths
    assert not [p for p in paths if p.startswith(CONTAINER_ONLY_ROOTS)], paths


def check_mig_container(sc: ChartNodeScenario, output: str, mine: list[tuple[int, int, int, str]]) -> None:
    env, devices, _ = seen(output)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(u for *_, u in mine), env
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(devices), devices
    for gpu, gi, ci, _ in mine:
        assert f"/dev/nvidia{gpu}" in devices, devices
        for minor in (mig_cap_minor(gpu, gi), mig_cap_minor(gpu, gi, ci)):
            assert devices[f"/dev/nvidia-caps/nvidia-cap{minor}"] == (FAKE_CAPS_MAJOR, minor), devices
            # ...created by the plugin's container in the host's (stand-in) dev root.
            assert (sc.dev_root / f"dev/nvidia-caps/nvidia-cap{minor}").is_char_device()


# --------------------------------------------------------------------------------------------------


def test_chart_pods_run_flexmig_image_on_the_real_node(sc: ChartNodeScenario) -> None:
    for component in ("controller", "kubelet-plugin"):
        [pod] = sc.chart_pods(component)
        assert pod["spec"]["nodeName"] == sc.node_name
        [status] = pod["status"]["containerStatuses"]
        assert status["ready"] and status["image"] == sc.image.name, status
        assert status["restartCount"] == 0, (status, sc.logs_of(component))
    # The kubelet's plugin watcher found the registration socket the container made in its directory.
    assert [p.name for p in sc.real.registry_dir.iterdir()] == ["gpu.flexmig.dev-reg.sock"]
    assert "Registered DRA plugin" in sc.real.kubelet_log()
    # Both metrics ports answer at the pods' own addresses; the plugin's says kubelet registered it.
    plugin_metrics = scrape(sc.ports["plugin"], sc.metrics_address("kubelet-plugin"))
    assert "flexmig_node_plugin_registered 1.0" in plugin_metrics
    assert "flexmig_" in scrape(sc.ports["controller"], sc.metrics_address("controller"))


def test_chart_pods_use_the_pod_network_and_services(sc: ChartNodeScenario) -> None:
    """Pod IPs from the CNI, the API server through the `kubernetes` Service (the chart sets no
    address: the kubelet's service variables point the in-cluster clients at its ClusterIP, which
    kube-proxy routes), and the webhook called through its Service (no `webhook.url`)."""
    assert sc.real.network is not None
    svc = request(sc.api, "GET", "/api/v1/namespaces/default/services/kubernetes")
    assert ipaddress.ip_address(svc["spec"]["clusterIP"]) in ipaddress.ip_network(SERVICE_CIDR), svc["spec"]
    for component in ("controller", "kubelet-plugin"):
        pod = sc.pod_now(component)
        assert not pod["spec"].get("hostNetwork"), component
        assert ipaddress.ip_address(pod["status"]["podIP"]) in sc.real.network.subnet, pod["status"]
        env = {e["name"] for c in pod["spec"]["containers"] for e in c.get("env") or ()}
        assert not env & {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}, env
    [hook] = request(
        sc.api,
        "GET",
        f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{sc.release}.{DRIVER_NAME}",
    )["webhooks"]
    assert "url" not in hook["clientConfig"] and hook["clientConfig"]["service"]["namespace"] == sc.namespace
    node = request(sc.api, "GET", f"/api/v1/nodes/{sc.node_name}")
    assert {"type": "Ready", "status": "True"} in [
        {"type": c["type"], "status": c["status"]} for c in node["status"]["conditions"]
    ]


def test_a_pod_reaches_the_metrics_services(sc: ChartNodeScenario) -> None:
    """Pod -> Service -> pod through kube-proxy, as a Prometheus in the cluster scrapes flexmig."""
    ns = sc.test_namespace("chart-net")
    services = request(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/services")["items"]
    targets = [
        f"{s['spec']['clusterIP']}:{s['spec']['ports'][0]['port']}"
        for s in services
        if s["metadata"]["name"].endswith("-metrics")
    ]
    assert len(targets) == 2, [s["metadata"]["name"] for s in services]
    get = r"printf 'GET /metrics HTTP/1.0\r\n\r\n'"
    fetch = "".join(
        f"{get} | nc -w 5 {t.replace(':', ' ')} | grep -q '^flexmig_' && echo OK {t}; " for t in targets
    )
    sc.create(ns, "pods", user_pod(sc, "scraper", command=["/bin/sh", "-c", fetch + PROBE]))
    out = wait_output(sc, sc.wait_running(ns, "scraper", timeout_s=60))
    assert [f"OK {t}" for t in targets] == re.findall(r"^OK \S+$", out, re.M), out
    sc.delete_pod(ns, "scraper", wait_s=60)


def test_guide_pod_and_claim_pod_get_mig_instances_and_the_driver(sc: ChartNodeScenario) -> None:
    ns = sc.test_namespace("chart-mig")
    created = sc.create(ns, "pods", guide_pod(sc, "guide", "mig"))
    assert {"name": ALLOCATION_GATE} in created["spec"]["schedulingGates"]  # the webhook rewrote it
    assert "nvidia.com/gpu" not in created["spec"]["containers"][0].get("resources", {}).get("limits", {})
    claim = claim_body(
        "one", "mig.gpu.flexmig.dev", ['device.attributes["gpu.flexmig.dev"].profile == "3g.20gb"']
    )
    sc.create(ns, "resourceclaims", claim)
    body = user_pod(sc, "claimed", resources={"claims": [{"name": "gpu"}]})
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one"}]
    sc.create(ns, "pods", body)

    pods = {name: sc.wait_running(ns, name, timeout_s=150) for name in ("guide", "claimed")}
    realised = sc.instances()
    assert len(realised) == 2 and {g for g, *_ in realised} == {0}, realised
    for name, pod in pods.items():
        [claim_obj] = sc.claims_of(pod)
        spec = spec_of(sc.cdi_dir, claim_obj["metadata"]["uid"])
        output = wait_output(sc, pod)
        env = seen(output)[0]
        mine = [r for r in realised if r[3] == env.get("NVIDIA_VISIBLE_DEVICES")]
        assert len(mine) == 1, (name, env, realised)
        check_mig_container(sc, output, mine)
        check_driver_files(sc, spec, seen(output)[2])

    for name in pods:
        sc.delete_pod(ns, name, wait_s=90)
    # Only the kubelet's NodeUnprepareResources, served by the plugin's container, destroys them.
    wait_until(lambda: sc.instances() == [], 30, "both MIG instances to be destroyed")
    assert not list(sc.cdi_dir.glob("gpu.flexmig.dev*.json"))


def test_hami_core_pod_after_helm_upgrade_to_hami_core(sc: ChartNodeScenario) -> None:
    sc.set_mode("hami-core")  # the plugin pod restarts with the new node config
    ns = sc.test_namespace("chart-hami")
    sc.create(ns, "pods", guide_pod(sc, "shared", "hami-core"))
    pod = sc.wait_running(ns, "shared", timeout_s=150)
    assert sc.instances() == []  # a share creates no MIG instance
    [claim_obj] = sc.claims_of(pod)
    spec = spec_of(sc.cdi_dir, claim_obj["metadata"]["uid"])
    env, devices, files = seen(wait_output(sc, pod))
    gpu1 = sc.gpus[1].uuid
    assert env.get("NVIDIA_VISIBLE_DEVICES") == gpu1, env  # the GPU with MIG off
    assert env.get("CUDA_DEVICE_MEMORY_LIMIT_0") == f"{GUIDE_MEMORY_MIB}m", env
    assert "/dev/nvidia1" in devices and "/dev/nvidiactl" in devices, devices
    # HAMi-core: its library from the host's hamiCore.dir, preloaded into every process.
    assert {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= files, files
    assert f"{sc.hami_dir}/libvgpu.so" in host_paths(spec)
    check_driver_files(sc, spec, files)
    sc.delete_pod(ns, "shared", wait_s=90)
    assert not list(sc.cdi_dir.glob("gpu.flexmig.dev*.json"))
