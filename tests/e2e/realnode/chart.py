"""The chart's own pods on a REAL node: `helm install` of the chart, flexmig's image in containerd.

`ChartNodeScenario` is `scenario.Scenario` without local processes: one `RealNode` (node.py, real
kubelet + containerd + runc) gets flexmig's image (`images.product_image()`, the recipe users build)
imported, and the chart, installed with values only, runs its controller Deployment and kubelet-plugin
DaemonSet there as containers. Everything the product needs to know about this machine goes in
through documented chart values (`helm_values`), never a test-only path in the product:

- GPUs: the NVML simulator, `kubeletPlugin.nvmlBackend=sim:<state>` with the state's directory
  mounted through `kubeletPlugin.extraVolumes` (the simulator replaces the file by rename, so the
  directory is mounted, not the file);
- the driver: the stand-ins of realnode/scenario.py (device nodes, /proc tables, driver files) at a
  host path other than `/`, given as `devRoot`, `procRoot`, `nvml.driverRoot`; no nvidia-cdi-hook
  (`cdiHookPath: ""`); HAMi-core's library is a stand-in ELF object in `hamiCore.dir`;
- kubelet and containerd paths: `kubeletRegistryDir`, `kubeletPluginsDir`, `cdiDir` of this node.

Network, two ways (`pod_network`):

- a pod network (network.py: CNI bridge + host-local, kube-proxy in iptables mode), the chart's
  defaults: the controller and plugin get pod IPs, their in-cluster clients reach the API server
  through the `kubernetes` Service (the control plane must be started with `advertise_address`, so
  that Service has an endpoint pods can reach), and the API server calls the webhook through its
  Service. No address or port of this machine goes into the values.
- the chart's `hostNetwork` values, with ports picked free on this machine (other tests and
  engineers share it). The in-cluster client reads KUBERNETES_SERVICE_HOST/PORT, whose Service IP
  nothing routes without kube-proxy, so `extraEnv` points them at the API server (127.0.0.1:<port>;
  container env wins over the kubelet's service variables), and the API server calls the webhook at
  `webhook.url` on 127.0.0.1.

Either way the kubelet gets the machine's own non-loopback address as --node-ip, because a loopback
one leaves the node without addresses and so host-network pods without a pod IP for their probes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from controller.kube.rest import request
from driver.cdi import spec_file_name
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state

from ..cluster import ControlPlane, free_port, wait_until
from ..k8sobjects import restore_device_classes
from ..scenario import CHART, GPU_NODE_LABEL, NodeSpec, Scenario, ScenarioOptions, some_shared_object
from .build import net_binaries
from .images import ProductImage
from .network import PodNetwork
from .node import TOLERATE_ALL, NodeBinaries, RealNode
from .scenario import make_host_standins


def host_ip() -> str:
    """An IPv4 address of this machine other than loopback (the kubelet's --node-ip)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    raise AssertionError(f"no global IPv4 address on this machine for the kubelet's --node-ip:\n{out}")


class ChartNodeScenario(Scenario):
    """One real node running the chart's pods; `mode` is the node's nodeconfig operating mode."""

    def __init__(
        self,
        cp: ControlPlane,
        bins: NodeBinaries,
        image: ProductImage,
        gpus: list[SimGpuSpec],
        mode: str,
        pod_network: bool = False,
    ) -> None:
        super().__init__(
            cp, [NodeSpec("chart", tuple(g.sku for g in gpus), mode)], ScenarioOptions(webhook=True)
        )
        self.image = image
        self.gpus = gpus
        [self.node_name] = self.specs
        # Short: containerd's and kubelet's unix sockets live under it.
        self.root = Path(tempfile.mkdtemp(prefix="fmc-", dir="/tmp"))
        self.real = RealNode(
            cp,
            bins,
            self.node_name,
            self.root / "n",
            self.root / "cdi",
            labels={GPU_NODE_LABEL: "true"},  # the chart's default DaemonSet affinity
        )
        self.real.node_ip = host_ip()
        self.pod_network = pod_network
        if pod_network:
            assert cp.advertise_address, "pods reach the API server only at a non-loopback address"
            self.real.network = PodNetwork(
                cp, net_binaries(), self.node_name, self.root / "net", self.real.log_dir
            )
            # The chart's defaults: every pod has its own address, nothing collides.
            defaults = yaml.safe_load((CHART / "values.yaml").read_text())
            self.ports = {
                "plugin": defaults["kubeletPlugin"]["metrics"]["port"],
                "controller": defaults["controller"]["metrics"]["port"],
                "webhook": defaults["webhook"]["port"],
            }
        else:
            self.ports = {"plugin": free_port(), "controller": free_port(), "webhook": self.webhook_port}
        self.sim_dir = self.root / "sim"
        self.image_tag = ""  # `image.tag` ("" is the chart's appVersion, the imported image's tag)

    # --- the node's stand-ins -----------------------------------------------------------------------

    @property
    def sim_state(self) -> Path:
        return self.sim_dir / "state.json"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def dev_root(self) -> Path:
        return self.root / "devroot"

    @property
    def driver_root(self) -> Path:
        return self.root / "driver"

    @property
    def hami_dir(self) -> Path:
        return self.root / "vgpu"

    def admin(self) -> SimAdmin:
        return SimAdmin(self.sim_state)

    def instances(self) -> list[tuple[int, int, int, str]]:
        """(gpu, gi, ci, MIG UUID) of every compute instance on the simulated GPUs."""
        snap = self.admin().snapshot()
        return sorted(
            (g.index, gi.gi_id, ci.ci_id, ci.mig_uuid)
            for g in snap.gpus
            for gi in g.gpu_instances
            for ci in gi.compute_instances
        )

    # --- helm ----------------------------------------------------------------------------------------

    def values(self, mode: str) -> dict[str, Any]:
        values = self.host_network_values() if not self.pod_network else self.pod_network_values()
        values["image"] = {"tag": self.image_tag}
        values["nodeConfig"] = {"nodeconfig": [{"name": self.node_name, "operatingmode": mode}]}
        values["kubeletPlugin"].update(self.node_values())
        return values

    def node_values(self) -> dict[str, Any]:
        """Where this node's stand-ins, kubelet and containerd directories are."""
        return {
            "nvmlBackend": f"sim:{self.sim_state}",
            "extraVolumes": [{"name": "sim", "hostPath": {"path": str(self.sim_dir), "type": "Directory"}}],
            "extraVolumeMounts": [{"name": "sim", "mountPath": str(self.sim_dir)}],
            "nvml": {"driverRoot": str(self.driver_root)},
            "devRoot": str(self.dev_root),
            "procRoot": str(self.root / "proc"),
            "cdiHookPath": "",
            "mountHostDev": False,  # the stand-in dev root holds every node the plugin uses
            "kubeletRegistryDir": str(self.real.registry_dir),
            "kubeletPluginsDir": str(self.real.plugins_dir),
            "cdiDir": str(self.cdi_dir),
            "hamiCore": {"dir": str(self.hami_dir), "library": str(self.hami_dir / "libvgpu.so")},
        }

    def pod_network_values(self) -> dict[str, Any]:
        """The chart's network defaults; only placement on this node (no GPU taints here)."""
        here = {"nodeSelector": {"kubernetes.io/hostname": self.node_name}}
        return {"tests": dict(here), "controller": dict(here), "kubeletPlugin": {}}

    def host_network_values(self) -> dict[str, Any]:
        api_env = [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.cp.apiserver_port)},
        ]
        return {
            "webhook": {"url": self.webhook_url, "port": self.ports["webhook"]},
            # `helm test`'s pod: the same node, network and API server address as the chart's pods.
            "tests": {
                "hostNetwork": True,
                "nodeSelector": {"kubernetes.io/hostname": self.node_name},
                "tolerations": TOLERATE_ALL,
                "extraEnv": api_env,
            },
            "controller": {
                "hostNetwork": True,
                # Host ports on one node: a surge pod could never be scheduled beside the old one.
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
                },
                "metrics": {"port": self.ports["controller"]},
                "nodeSelector": {"kubernetes.io/hostname": self.node_name},
                "tolerations": TOLERATE_ALL,  # the node stays NotReady: no pod network
                "extraEnv": api_env,
            },
            "kubeletPlugin": {
                "hostNetwork": True,
                "metrics": {"port": self.ports["plugin"]},
                "extraEnv": api_env,
            },
        }

    def install(self) -> None:
        for name in ("mig.gpu.flexmig.dev", "gpu.flexmig.dev", "hami-core.gpu.flexmig.dev"):
            with contextlib.suppress(ApiException):  # other modules' classes: put back in stop()
                self._saved_classes[name] = request(
                    self.api, "GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}"
                )
        self._helm("install", "--create-namespace", "--take-ownership")
        self.installed = True

    def set_mode(self, mode: str) -> None:
        """`helm upgrade` to another operating mode: the DaemonSet's config checksum restarts the plugin."""
        old = self.pod_now()["metadata"]["uid"]
        self._helm("upgrade", mode=mode)
        wait_until(
            lambda: self.pod_now()["metadata"]["uid"] not in ("", old),
            90,
            "the plugin DaemonSet to replace its pod",
        )
        self.wait_plugin()

    def helm_upgrade(self) -> None:
        """`helm upgrade` with the current values (e.g. after changing `image_tag`); does not wait."""
        self._helm("upgrade")

    def _helm(self, verb: str, *flags: str, mode: str | None = None) -> None:
        values = self.workdir / f"values-{verb}.yaml"
        values.write_text(yaml.safe_dump(self.values(mode or self.specs[self.node_name].mode)))
        self.cp.helm(
            verb, self.release, str(CHART), "-n", self.namespace, *flags, "-f", str(values), "--timeout", "2m"
        )

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> ChartNodeScenario:
        init_sim_state(self.sim_state, self.gpus)
        make_host_standins(self.root, len(self.gpus))
        # The chart mounts the driver root with HostToContainer propagation (a driver container may
        # mount it later), which the runtime allows only from a shared or slave mount. A real node's
        # `/` is shared (systemd); this machine's is private, so the stand-in gets a shared mount.
        for args in (
            ["--bind", str(self.driver_root), str(self.driver_root)],
            ["--make-shared", str(self.driver_root)],
        ):
            subprocess.run(["mount", *args], capture_output=True, text=True, check=True)
        self.hami_dir.mkdir()
        shutil.copy(some_shared_object(), self.hami_dir / "libvgpu.so")
        self.real.start()
        if self.pod_network:
            # The chart's controller tolerates no not-ready taint: wait until the node lost it.
            wait_until(self.node_ready, 60, f"node {self.node_name} to be Ready with its pod network")
        self.real.ctr("images", "import", str(self.image.tar), timeout_s=300)
        self.install()
        self.wait_plugin()
        self.wait_webhook(timeout_s=120)
        self.wait_ready("controller")
        return self

    def node_ready(self) -> bool:
        node = request(self.api, "GET", f"/api/v1/nodes/{self.node_name}")
        taints = [t["key"] for t in node["spec"].get("taints") or ()]
        ready = {"type": "Ready", "status": "True"} in [
            {"type": c["type"], "status": c["status"]} for c in node["status"].get("conditions") or ()
        ]
        return ready and not [t for t in taints if t.startswith("node.kubernetes.io/")]

    def chart_pods(self, component: str) -> list[dict[str, Any]]:
        query = [("labelSelector", f"app.kubernetes.io/component={component}")]
        items: list[dict[str, Any]] = request(
            self.api, "GET", f"/api/v1/namespaces/{self.namespace}/pods", query=query
        )["items"]
        return items

    def pod_now(self, component: str = "kubelet-plugin") -> dict[str, Any]:
        """The chart's current (not terminating) pod of `component`; uid "" when there is none."""
        pods = [p for p in self.chart_pods(component) if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) <= 1, [p["metadata"]["name"] for p in pods]
        return pods[0] if pods else {"metadata": {"uid": ""}}

    def wait_ready(self, component: str, timeout_s: float = 150.0) -> None:
        """Until the kubelet's probes pass: the plugin's /healthz, the controller's webhook port."""

        def ready() -> bool:
            status = self.pod_now(component).get("status") or {}
            return {"type": "Ready", "status": "True"} in [
                {"type": c["type"], "status": c["status"]} for c in status.get("conditions") or ()
            ]

        wait_until(ready, timeout_s, f"the chart's {component} pod to be Ready")

    def wait_plugin(self, timeout_s: float = 150.0) -> None:
        """Until the DaemonSet's pod is Ready and its slices are published."""
        self.wait_ready("kubelet-plugin", timeout_s)
        query = [("fieldSelector", f"spec.nodeName={self.node_name}")]
        wait_until(
            lambda: bool(
                request(self.api, "GET", "/apis/resource.k8s.io/v1/resourceslices", query=query)["items"]
            ),
            60,
            "the plugin's ResourceSlices",
        )

    def metrics_address(self, component: str) -> str:
        """Where the test reaches `component`'s metrics port: its pod IP on a pod network."""
        if not self.pod_network:
            return "127.0.0.1"
        ip: str = self.pod_now(component)["status"]["podIP"]
        return ip

    def explain(self) -> str:
        """The chart's pods and what their containers wait for (for timeouts)."""
        rows = []
        for pod in self.pods(self.namespace):
            status = pod.get("status") or {}
            states = [
                (c["name"], c.get("state"), c.get("restartCount"))
                for c in status.get("containerStatuses") or ()
            ]
            rows.append(f"{pod['metadata']['name']}: {status.get('phase')} {states}")
        return "; ".join(rows) or "no pods"

    def _why(self, ns: str, name: str) -> str:
        try:
            pod = request(self.api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except ApiException as exc:
            return f"pod: {exc.status}"
        status = pod.get("status") or {}
        return f"phase {status.get('phase')}, conditions {status.get('conditions')}"

    def container_log(self, pod: dict[str, Any], container: str) -> str:
        return self.real.container_log(pod, container)

    def logs_of(self, component: str) -> str:
        """The chart's containers' logs of `component` (for failure messages)."""
        out = []
        for pod in self.chart_pods(component):
            for c in pod["spec"]["containers"]:
                out.append(
                    f"--- {pod['metadata']['name']}/{c['name']}\n{self.container_log(pod, c['name'])[-3000:]}"
                )
        return "\n".join(out)

    def stop(self, failed: bool = False) -> None:
        for ns in self.test_namespaces:
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"/api/v1/namespaces/{ns}")
        for ns in self.test_namespaces:
            with contextlib.suppress(Exception):
                wait_until(self._no_pods(ns), 90, f"pods of {ns} to go")
        if self.installed:
            self.cp.helm("uninstall", self.release, "-n", self.namespace, "--timeout", "2m", check=False)
            with contextlib.suppress(Exception):  # the real kubelet stops the chart's containers
                wait_until(lambda: not self.pods(self.namespace), 60, "the chart's pods to go")
        self.real.stop()
        subprocess.run(["umount", "-l", str(self.driver_root)], capture_output=True, check=False)
        for path, query in (
            (f"/api/v1/nodes/{self.node_name}", None),
            (
                "/apis/resource.k8s.io/v1/resourceslices",
                [("fieldSelector", f"spec.nodeName={self.node_name}")],
            ),
            (f"/api/v1/namespaces/{self.namespace}", None),
        ):
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", path, query=query)
        restore_device_classes(self.api, self._saved_classes)
        self.api.close()
        if failed:
            print(f"\n[e2e] chart node {self.node_name} kept at {self.root} (logs in {self.real.log_dir})")
        else:
            self.real.cleanup()
            shutil.rmtree(self.root, ignore_errors=True)


def spec_of(cdi_dir: Path, claim_uid: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((cdi_dir / spec_file_name(claim_uid)).read_text())
    return loaded


def new_gpus(skus: list[tuple[str, bool]]) -> list[SimGpuSpec]:
    return [SimGpuSpec(sku, mig_enabled=mig, uuid=f"GPU-{uuid.uuid4()}") for sku, mig in skus]
