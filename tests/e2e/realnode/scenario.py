"""flexmig installed by its chart on a REAL node: kubelet + containerd + runc instead of the stand-in.

`RealNodeScenario` is `scenario.Scenario` (helm install, controller and webhook as local processes) with
`start_nodes` replaced: each node is a `RealNode` (node.py) and the plugin runs as a local process with
the DaemonSet's arguments, registered through the real kubelet's plugin watcher (`--registry-dir` =
`<kubelet root>/plugins_registry`, `--plugins-dir` = `<kubelet root>/plugins`) and writing its CDI specs
where containerd reads them.

What is stood in, and why (nothing else is):
- the GPUs: the NVML simulator (driver/nvml/sim), as everywhere in the e2e tests;
- their device nodes: `<node>/devroot/dev/nvidia{0,1}`, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`
  are character devices with /dev/null's numbers (mknod 1:3), so runc has real nodes to create and a
  container can open them harmlessly; the plugin is pointed there with `--dev-root`;
- the driver's /proc: `<node>/proc/devices` registers `nvidia-caps` at major 4000 (no driver uses it:
  opening such a node gives ENXIO) and `<node>/proc/driver/nvidia-caps/mig-minors` is the kernel's
  table for 2 GPUs (`--proc-root`); the plugin creates the capability nodes from these;
- the driver's files: `<node>/driver` holds empty libraries and binaries in the real layout
  (`--driver-root`); no nvidia-cdi-hook is installed, so the specs carry no hooks (the plugin warns);
- the plugin's pod: the chart's image cannot run here, so the plugin is a local process; its
  ServiceAccount token is bound to a pod of the plugin's ServiceAccount that the real kubelet runs on
  the node (the "anchor"), which gives the API server the plugin's node as the DaemonSet pod would.
The node is not labelled `nvidia.com/gpu.present`, so the DaemonSet places no pod there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from kubernetes.client.exceptions import ApiException

from controller.kube.rest import request
from driver.cdi import mig_cap_minor
from driver.nvml.sim import SimGpuSpec

from ..chart_workloads import ChartNodeDir
from ..cluster import ControlPlane, wait_until
from ..k8sobjects import restore_device_classes
from ..plugin_harness import PluginProcess, instances, scrape, wait_slices
from ..scenario import NodeSpec, Scenario, ScenarioOptions
from .images import TEST_IMAGE
from .node import TOLERATE_ALL, NodeBinaries, RealNode

P = ParamSpec("P")
R = TypeVar("R")

FAKE_CAPS_MAJOR = 4000
STANDIN_RDEV = os.stat("/dev/null").st_rdev  # 1:3 on Linux
DRIVER_VERSION = "550.54.15"
DRIVER_LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler")
DRIVER_BINS = ("nvidia-smi", "nvidia-debugdump")
LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def make_host_standins(root: Path, gpus: int) -> tuple[Path, Path, Path]:
    """(dev root, proc root, driver root) standing in for the GPU driver; see the module docstring."""
    dev = root / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name in [*(f"nvidia{i}" for i in range(gpus)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        os.mknod(dev / name, stat.S_IFCHR | 0o666, STANDIN_RDEV)
    proc = root / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(
        f"Character devices:\n  1 mem\n195 nvidia-frontend\n{FAKE_CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    lines = ["config 1", "monitor 2"]
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {mig_cap_minor(g, gi)}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {mig_cap_minor(g, gi, ci)}" for ci in range(8)]
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text("\n".join(lines) + "\n")
    driver = root / "driver"
    lib = driver / LIB_DIR.lstrip("/")
    lib.mkdir(parents=True)
    for stem in DRIVER_LIBS:
        (lib / f"{stem}.so.{DRIVER_VERSION}").write_bytes(b"")
        (lib / f"{stem}.so.1").symlink_to(f"{stem}.so.{DRIVER_VERSION}")
    (driver / "usr" / "bin").mkdir(parents=True)
    for name in DRIVER_BINS:
        (driver / "usr" / "bin" / name).write_bytes(b"")
        (driver / "usr" / "bin" / name).chmod(0o755)
    return root / "devroot", proc, driver


@dataclass
class RealSimNode:
    spec: NodeSpec
    name: str
    nd: ChartNodeDir
    real: RealNode
    plugin: PluginProcess | None = None
    anchor: dict[str, Any] | None = None

    def instances(self) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
        return instances(self.nd)

    def metrics(self) -> str:
        assert self.plugin is not None and self.plugin.metrics_port is not None
        return scrape(self.plugin.metrics_port)

    @property
    def dev_root(self) -> Path:
        return self.nd.root / "devroot"


class RealNodeScenario(Scenario):
    def __init__(
        self,
        cp: ControlPlane,
        bins: NodeBinaries,
        nodes: list[NodeSpec],
        options: ScenarioOptions | None = None,
    ) -> None:
        super().__init__(cp, nodes, options)
        self.bins = bins
        self.real_nodes: dict[str, RealSimNode] = {}

    def plugin_extra(self, node: RealSimNode) -> list[str]:
        nd, real = node.nd, node.real
        return [
            f"--registry-dir={real.registry_dir}",
            f"--plugins-dir={real.plugins_dir}",
            f"--dev-root={nd.root / 'devroot'}",
            f"--proc-root={nd.root / 'proc'}",
            f"--driver-root={nd.root / 'driver'}",
            f"--nvidia-cdi-hook-path={nd.root / 'no-nvidia-cdi-hook'}",
        ]

    def start_nodes(self) -> None:
        if os.geteuid() != 0:
            raise AssertionError(
                "the real-node tests need root (mknod, containerd, runc, kubelet): run pytest as root"
            )
        for name, spec in self.specs.items():
            gpus = [SimGpuSpec(sku, mig_enabled=True, uuid=f"GPU-{uuid.uuid4()}") for sku in spec.gpus]
            nd = ChartNodeDir.create(name, Path("/nonexistent"), gpus)
            assert isinstance(nd, ChartNodeDir)
            make_host_standins(nd.root, len(gpus))
            real = RealNode(self.cp, self.bins, name, nd.root / "n", nd.cdi_dir, labels={})
            self.real_nodes[name] = RealSimNode(spec, name, nd, real)
            real.start()
        plugin = self.workload("daemonsets", self.plugin_sa, "plugin", self.workdir / "plugin-config")
        for node in self.real_nodes.values():
            node.anchor = self.run_anchor(node)
            node.nd.kubeconfig = self.sa_kubeconfig(
                self.plugin_sa, node.nd.root / "plugin.kubeconfig", bound_pod=node.anchor
            )
            node.nd.chart_args = tuple(a.replace("$(NODE_NAME)", node.name) for a in plugin.args)
            self.start_plugin(node, plugin.env)
        for node in self.real_nodes.values():
            wait_slices(self.api, node.name, lambda s: True, timeout_s=60)

    def start_plugin(self, node: RealSimNode, env: dict[str, str] | None = None) -> PluginProcess:
        if env is None:
            env = self.workload("daemonsets", self.plugin_sa, "plugin", self.workdir / "plugin-config").env
        node.plugin = PluginProcess(node.nd, env=env, extra=self.plugin_extra(node))
        node.plugin.wait_ready(timeout_s=90)
        self.wait_registered(node)
        return node.plugin

    def wait_registered(self, node: RealSimNode, after: int = 0, timeout_s: float = 60.0) -> None:
        """Until the real kubelet has registered the plugin (the plugin's registered gauge says so)."""

        def registered() -> bool:
            return "flexmig_node_plugin_registered 1.0" in node.metrics()

        wait_until(registered, timeout_s, f"kubelet of {node.name} to register the plugin")

    def run_anchor(self, node: RealSimNode) -> dict[str, Any]:
        """A pod of the plugin's ServiceAccount, run by the real kubelet (module docstring)."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"plugin-anchor-{node.name}"[:63],
                "labels": {"e2e.flexmig.dev/anchor": "true"},
            },
            "spec": {
                "nodeName": node.name,
                "serviceAccountName": self.plugin_sa,
                "automountServiceAccountToken": False,
                "hostNetwork": True,
                "tolerations": TOLERATE_ALL,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "anchor",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": [
                            "/bin/sh",
                            "-c",
                            "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done",
                        ],
                    }
                ],
            },
        }
        request(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/pods", body)
        return self.wait_running(self.namespace, body["metadata"]["name"], timeout_s=120)

    def _why(self, ns: str, name: str) -> str:
        try:
            pod = request(self.api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        except ApiException as exc:
            return f"pod: {exc.status}"
        status = pod.get("status") or {}
        waiting = [
            (c.get("state") or {}).get("waiting")
            for c in status.get("containerStatuses") or ()
            if c.get("state")
        ]
        return f"phase {status.get('phase')}, conditions {status.get('conditions')}, waiting {waiting}"

    def stop(self, failed: bool = False) -> None:
        problems: list[str] = []
        for ns in self.test_namespaces:
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"/api/v1/namespaces/{ns}")
        for ns in self.test_namespaces:
            with contextlib.suppress(Exception):
                wait_until(self._no_pods(ns), 90, f"pods of {ns} to go")
        if self.controller is not None:
            self.controller.stop()
        for node in self.real_nodes.values():
            if node.plugin is not None and node.plugin.proc.poll() is None and node.plugin.stop() != 0:
                problems.append(f"plugin on {node.name} exited non-zero:\n{node.plugin.log_text()[-2000:]}")
        if self.installed:
            self.cp.helm("uninstall", self.release, "-n", self.namespace, "--timeout", "2m", check=False)
        for node in self.real_nodes.values():
            node.real.stop()
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"/api/v1/nodes/{node.name}")
            with contextlib.suppress(ApiException):
                query = [("fieldSelector", f"spec.nodeName={node.name}")]
                request(self.api, "DELETE", "/apis/resource.k8s.io/v1/resourceslices", query=query)
            if failed:
                print(f"\n[e2e] real node {node.name} kept at {node.nd.root} (logs in {node.real.log_dir})")
            else:
                node.real.cleanup()
                node.nd.cleanup()
        with contextlib.suppress(ApiException):
            request(self.api, "DELETE", f"/api/v1/namespaces/{self.namespace}")
        restore_device_classes(self.api, self._saved_classes)
        self.api.close()
        assert not problems, "\n".join(problems)


def dump_crictl_on_failure(test: Callable[P, R]) -> Callable[P, R]:
    """Decorates a test taking a `RealNodeScenario`: when it fails, the failure message ends with
    `crictl ps -a` / `crictl pods` of every real node (what the runtime itself had at that moment)."""

    @functools.wraps(test)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return test(*args, **kwargs)
        except Exception as exc:
            for sc in [*args, *kwargs.values()]:
                if isinstance(sc, RealNodeScenario):
                    for node in sc.real_nodes.values():
                        exc.add_note(f"--- the runtime of node {node.name}:\n{node.real.crictl_dump()}")
            raise

    return wrapper
