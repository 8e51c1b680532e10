"""A reusable end-to-end scenario: flexmig installed by its Helm chart and running on simulated nodes.

`Scenario` (a context manager; test_scenarios.py wraps it in a module fixture) does what a cluster
operator and the kubelets would do:

1. `helm install` of deployments/helm/flexmig into the real control plane, with `nodeConfig` making
   the scenario's nodes MIG nodes and the webhook off unless `ScenarioOptions.webhook` asks for it;
2. per node (`NodeSpec`): a `KubeletStandIn` registers the Node (labelled as an NVIDIA GPU node, so the
   chart's DaemonSet places its plugin pod there, and with the scenario label that test pods select);
   the plugin then runs as a local process with the DaemonSet's own arguments (host paths, NVML and
   metrics address replaced by the node's private ones, `--nvml=sim:`) and a ServiceAccount token
   bound to that DaemonSet pod, so the chart's RBAC and node-scope admission policy judge it as they
   would judge the real pod;
3. the controller as a local process with the Deployment's arguments and environment and a token of
   the controller ServiceAccount.

The webhook (scenario 3): `ScenarioOptions(webhook=True)` installs the chart with
`webhook.url=https://127.0.0.1:<Scenario.webhook_port>/mutate-pods` (the API server calls the local
controller, which puts 127.0.0.1 into its self-generated certificate) and appends
`--webhook-port=<port> --webhook-address=127.0.0.1` to the Deployment's controller arguments;
`Scenario.wait_webhook()` waits until the controller has patched its CA into the configuration.
`ScenarioOptions.extra_values` / `controller_args` add more (`{webhook_port}` in them is replaced).
Metrics: `SimNode.metrics()` (the plugin's port, 31992 in the chart), `ControllerProcess.metrics()`
(31993), parsed by `plugin_harness.metric_samples`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.kube.rest import pod_path, request
from driver.nvml.sim import SimGpuSpec

from .chart_workloads import ChartNodeDir, ControllerProcess, Workload, token_kubeconfig, workload
from .cluster import ControlPlane, free_port, wait_until
from .k8sobjects import create_namespace, restore_device_classes, wait_no_gated_pods
from .kubelet_standin import KubeletStandIn
from .plugin_harness import REPO, PluginProcess, instances, scrape, wait_slices

CHART = REPO / "deployments" / "helm" / "flexmig"
SCENARIO_LABEL = "e2e.flexmig.dev/scenario"
GPU_NODE_LABEL = "nvidia.com/gpu.present"  # the chart's DaemonSet affinity (GPU Operator's label)
CHART_DEVICE_CLASSES = ("mig.gpu.flexmig.dev", "gpu.flexmig.dev", "hami-core.gpu.flexmig.dev")


def some_shared_object() -> Path:
    """An ELF shared object present on every Linux CPython (a C extension module)."""
    import _ctypes

    path = Path(str(_ctypes.__file__))
    assert path.suffix == ".so", f"{path} is not a shared object on {sys.platform}"
    return path


@dataclass(frozen=True)
class NodeSpec:
    name: str  # a prefix; the scenario appends its suffix
    gpus: tuple[str, ...]  # simulator SKU keys, e.g. ("A100-40GB", "A100-40GB")
    mode: str = "mig"  # the node's nodeconfig operatingmode
    # Put a stand-in for HAMi-core's libvgpu.so (any ELF shared object passes the plugin's check) on the
    # node before its plugin starts, so its shares are published enforced (without it they are refused).
    hami_core_library: bool = False


@dataclass(frozen=True)
class ScenarioOptions:
    webhook: bool = False  # webhook.enabled, served by the local controller (module docstring)
    extra_values: tuple[str, ...] = ()  # more `helm install` arguments ("--set", "k=v", ...)
    controller_args: tuple[str, ...] = ()  # appended to the Deployment's controller arguments
    controller_env: Mapping[str, str] = field(default_factory=dict)
    start_controller: bool = True
    nvml_backend: str = "sim"  # the plugins' simulator mode (ChartNodeDir.nvml_backend)
    pod_workers: int = 1  # pods each stand-in kubelet works on at once (kubelet_pods.py)


@dataclass
class SimNode:
    spec: NodeSpec
    name: str
    nd: ChartNodeDir
    standin: KubeletStandIn
    plugin: PluginProcess | None = None

    def instances(self) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
        return instances(self.nd)

    def metrics(self) -> str:
        assert self.plugin is not None and self.plugin.metrics_port is not None
        return scrape(self.plugin.metrics_port)


class Scenario:
    def __init__(
        self,
        cp: ControlPlane,
        nodes: Sequence[NodeSpec],
        options: ScenarioOptions | None = None,
        *,
        release: str = "flexmig",
    ) -> None:
        self.cp = cp
        self.options = options or ScenarioOptions()
        self.suffix = uuid.uuid4().hex[:6]
        self.release = release
        self.namespace = f"flexmig-scn-{self.suffix}"
        self.plugin_sa = f"{release}-kubelet-plugin"
        self.controller_sa = f"{release}-controller"
        self.webhook_port = free_port()
        self.api = cp.api_client()
        self.specs = {f"{s.name}-{self.suffix}": s for s in nodes}
        self.nodes: dict[str, SimNode] = {}
        self.controller: ControllerProcess | None = None
        self.installed = False
        self.test_namespaces: list[str] = []
        self._saved_classes: dict[str, dict[str, Any]] = {}
        self.workdir = Path(cp.workdir) / f"scenario-{self.suffix}"
        self.workdir.mkdir(parents=True, exist_ok=True)

    # --- helm -------------------------------------------------------------------------------------

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/mutate-pods"

    def _webhook_args(self) -> list[str]:
        if not self.options.webhook:
            return []
        return [f"--webhook-port={self.webhook_port}", "--webhook-address=127.0.0.1"]

    def wait_webhook(self, timeout_s: float = 60.0) -> None:
        """Until the controller has patched its CA into the MutatingWebhookConfiguration."""
        path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.release}.gpu.flexmig.dev"

        def patched() -> bool:
            hooks = request(self.api, "GET", path)["webhooks"]
            return all(h["clientConfig"].get("caBundle") for h in hooks)

        wait_until(patched, timeout_s, "the controller to patch the webhook's CA bundle")

    def _fill(self, items: Sequence[str]) -> list[str]:
        return [i.replace("{webhook_port}", str(self.webhook_port)) for i in items]

    def helm_values(self) -> list[str]:
        nodeconfig = [{"name": n, "operatingmode": s.mode} for n, s in self.specs.items()]
        return [
            "--set",
            f"webhook.enabled={str(self.options.webhook).lower()}",
            "--set-json",
            f"nodeConfig.nodeconfig={json.dumps(nodeconfig)}",
            "--set-json",  # the controller pod lands on a node whose stand-in "runs" it
            f"controller.nodeSelector={json.dumps({SCENARIO_LABEL: self.suffix})}",
            *(["--set", f"webhook.url={self.webhook_url}"] if self.options.webhook else []),
            *self._fill(self.options.extra_values),
        ]

    def install(self) -> None:
        for name in CHART_DEVICE_CLASSES:  # other modules create these for themselves; put them back later
            with contextlib.suppress(ApiException):
                self._saved_classes[name] = request(
                    self.api, "GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}"
                )
        self.cp.helm(
            "install", self.release, str(CHART), "-n", self.namespace, "--create-namespace", "--take-ownership",
            "--timeout", "2m", *self.helm_values(),
        )  # fmt: skip
        self.installed = True

    def upgrade(self, *values: str) -> None:
        self.cp.helm("upgrade", self.release, str(CHART), "-n", self.namespace, "--reuse-values", *values)

    def workload(self, kind: str, name: str, container: str, local_root: Path) -> Workload:
        """A chart workload's container as installed, its mounted ConfigMaps copied under `local_root`."""
        found = workload(self.api, self.namespace, kind, name, container)
        return found.localize(self.api, self.namespace, local_root)

    def sa_kubeconfig(self, sa: str, path: Path, bound_pod: Mapping[str, Any] | None = None) -> Path:
        return token_kubeconfig(self.cp, self.api, self.namespace, sa, path, bound_pod)

    # --- nodes ------------------------------------------------------------------------------------

    def start_nodes(self) -> None:
        for name, spec in self.specs.items():
            # A hami-core node's GPUs run with MIG off (HAMi-core shares whole GPUs); an Ampere GPU of a
            # MIG node must already be in MIG mode to offer instances.
            mig_on = spec.mode == "mig"
            gpus = [SimGpuSpec(sku, mig_enabled=mig_on, uuid=f"GPU-{uuid.uuid4()}") for sku in spec.gpus]
            nd = ChartNodeDir.create(name, Path("/nonexistent"), gpus)
            assert isinstance(nd, ChartNodeDir)
            nd.nvml_backend = self.options.nvml_backend
            if spec.hami_core_library:
                nd.hami_core_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(some_shared_object(), nd.hami_core_dir / "libvgpu.so")
            node_api = self.cp.api_client(self.cp.node_kubeconfig(name))
            labels = {SCENARIO_LABEL: self.suffix, GPU_NODE_LABEL: "true"}
            standin = KubeletStandIn(
                node_api, nd, labels=labels, pod_workers=self.options.pod_workers
            ).start()
            self.nodes[name] = SimNode(spec, name, nd, standin)
        for node in self.nodes.values():
            nd = node.nd
            pod = self.plugin_pod(node.name)
            nd.kubeconfig = self.sa_kubeconfig(self.plugin_sa, nd.root / "plugin.kubeconfig", bound_pod=pod)
            plugin = self.workload("daemonsets", self.plugin_sa, "plugin", nd.root / "config")
            nd.chart_args = tuple(a.replace("$(NODE_NAME)", node.name) for a in plugin.args)
            node.plugin = PluginProcess(nd, env=plugin.env)
        for node in self.nodes.values():
            assert node.plugin is not None
            node.plugin.wait_ready()
            node.standin.wait_registered()
            wait_slices(self.api, node.name, lambda s: True)

    def restart_standin(self, name: str) -> KubeletStandIn:
        """A kubelet restart: a fresh stand-in wipes the node's slices and registers the plugin again."""
        node = self.nodes[name]
        node.standin.stop()
        old = node.standin
        node.standin = KubeletStandIn(
            old.api_client, node.nd, labels=old.labels, pod_workers=old.pod_workers
        ).start()
        node.standin.wait_registered()
        return node.standin

    def plugin_pod(self, node: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The DaemonSet's pod on `node` once the stand-in runs it."""
        found: list[dict[str, Any]] = []

        def running() -> bool:
            query = [
                ("labelSelector", "app.kubernetes.io/component=kubelet-plugin"),
                ("fieldSelector", f"spec.nodeName={node}"),
            ]
            items = request(self.api, "GET", f"/api/v1/namespaces/{self.namespace}/pods", query=query)[
                "items"
            ]
            found[:] = [p for p in items if (p.get("status") or {}).get("phase") == "Running"]
            return bool(found)

        wait_until(running, timeout_s, f"the plugin DaemonSet pod on {node}")
        return found[0]

    # --- controller -------------------------------------------------------------------------------

    def start_controller(
        self,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        *,
        leftovers_gone: bool = True,
    ) -> ControllerProcess:
        """`extra_env` adds to the process's environment (e.g. an armed crashpoint); `leftovers_gone=False`
        for a restart that must find the gated pods a crashed controller left."""
        assert self.controller is None or self.controller.proc.poll() is not None, (
            "controller already running"
        )
        if leftovers_gone:
            # The controller places every gated pod it sees: another test's leftover would land on our nodes.
            wait_no_gated_pods(self.api, {self.namespace, *self.test_namespaces})
        ctrl = self.workload("deployments", self.controller_sa, "controller", self.workdir / "config")
        identity = f"{self.controller_sa}-local"  # stable, so a restarted process keeps its Lease
        args = [a.replace("$(POD_NAME)", identity) for a in ctrl.args]
        kubeconfig = self.sa_kubeconfig(self.controller_sa, self.workdir / "controller.kubeconfig")
        port = free_port()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_", "FLEXMIG_"))
        }
        env.update(ctrl.env)
        env.update({"POD_NAME": identity, "POD_NAMESPACE": self.namespace, "PYTHONPATH": str(REPO)})
        env.update(self.options.controller_env)
        env.update(extra_env or {})
        argv = [
            sys.executable, "-m", "flexmig.cli", *args, f"--kubeconfig={kubeconfig}", f"--metrics-port={port}",
            *self._webhook_args(), *self._fill(self.options.controller_args), *extra_args,
        ]  # fmt: skip
        self.controller = ControllerProcess(argv, env, self.workdir / "controller.log", port)
        self.controller.wait_leader()
        return self.controller

    def stop_controller(self) -> None:
        if self.controller is not None:
            code = self.controller.stop()
            assert code == 0, f"controller exited {code}:\n{self.controller.log_text()[-3000:]}"
            self.controller = None

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> Scenario:
        self.install()
        self.start_nodes()
        if self.options.start_controller:
            self.start_controller()
        return self

    def test_namespace(self, name: str) -> str:
        ns = f"{name}-{self.suffix}"
        create_namespace(self.api, ns)
        self.test_namespaces.append(ns)
        return ns

    def stop(self, failed: bool = False) -> None:
        """Tear down in the order that leaves nothing behind; keep node dirs of a failed run."""
        problems: list[str] = []
        for ns in self.test_namespaces:  # pods first, while the stand-ins and plugins can unprepare
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"/api/v1/namespaces/{ns}")
        for ns in self.test_namespaces:
            with contextlib.suppress(Exception):
                wait_until(self._no_pods(ns), 60, f"pods of {ns} to go")
        if self.controller is not None:
            self.controller.stop()
        for node in self.nodes.values():
            if node.plugin is not None and node.plugin.stop() != 0:
                problems.append(f"plugin on {node.name} exited non-zero:\n{node.plugin.log_text()[-2000:]}")
        if self.installed:
            self.cp.helm("uninstall", self.release, "-n", self.namespace, "--timeout", "2m", check=False)
            with contextlib.suppress(Exception):  # the stand-ins finish the chart's pods
                wait_until(lambda: not self.pods(self.namespace), 60, "the chart's pods to go")
        for node in self.nodes.values():
            node.standin.request_stop()
        for node in self.nodes.values():
            node.standin.stop()
            node.standin.api_client.close()
            problems += [f"stand-in {node.name}: {e}" for e in node.standin.errors]
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"/api/v1/nodes/{node.name}")
            with contextlib.suppress(ApiException):
                query = [("fieldSelector", f"spec.nodeName={node.name}")]
                request(self.api, "DELETE", "/apis/resource.k8s.io/v1/resourceslices", query=query)
            if not failed:
                node.nd.cleanup()
        with contextlib.suppress(ApiException):
            request(self.api, "DELETE", f"/api/v1/namespaces/{self.namespace}")
        restore_device_classes(self.api, self._saved_classes)
        self.api.close()
        assert not problems, "\n".join(problems)

    def __enter__(self) -> Scenario:
        try:
            return self.start()
        except BaseException:
            self.stop(failed=True)
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(failed=exc_type is not None)

    # --- pods -------------------------------------------------------------------------------------

    def _no_pods(self, ns: str) -> Callable[[], bool]:
        return lambda: not self.pods(ns)

    def pods(self, ns: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = request(self.api, "GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return items

    def create(self, ns: str, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        base = "/api/v1" if plural == "pods" else "/apis/resource.k8s.io/v1"
        return request(self.api, "POST", f"{base}/namespaces/{ns}/{plural}", body)

    def wait_running(self, ns: str, name: str, timeout_s: float = 90.0) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def ready() -> bool:
            pod = request(self.api, "GET", pod_path(ns, name))
            found[:] = [pod]
            conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or ()}
            return pod["status"].get("phase") == "Running" and conds.get("Ready") == "True"

        wait_until(ready, timeout_s, f"pod {ns}/{name} to run ({self._why(ns, name)})")
        return found[0]

    def _why(self, ns: str, name: str) -> str:
        return "; ".join(f"{n.name}: {n.standin.pod(ns, name)}" for n in self.nodes.values())

    def delete_pod(self, ns: str, name: str, wait_s: float = 60.0) -> None:
        """Delete with the default grace period: the stand-in unprepares, then removes the pod."""
        request(self.api, "DELETE", pod_path(ns, name))

        def gone() -> bool:
            try:
                request(self.api, "GET", pod_path(ns, name))
            except ApiException as exc:
                return bool(exc.status == 404)
            return False

        if wait_s:
            wait_until(gone, wait_s, f"pod {ns}/{name} to be removed")

    def claims_of(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pod's ResourceClaims (named or template-generated)."""
        ns = pod["metadata"]["namespace"]
        names = [
            e["resourceClaimName"]
            for e in pod["spec"].get("resourceClaims") or ()
            if e.get("resourceClaimName")
        ]
        names += [
            s["resourceClaimName"] for s in pod.get("status", {}).get("resourceClaimStatuses") or () if s.get("resourceClaimName")
        ]  # fmt: skip
        return [
            request(self.api, "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{n}")
            for n in names
        ]


def run_for_module(
    s: Scenario, request: Any, ready: Callable[[Scenario], None] = lambda _s: None
) -> Iterator[Scenario]:
    """A module fixture's body: start `s` (then `ready(s)`), yield it, stop it. A failed start, or any
    test of the module that failed meanwhile, keeps the node dirs for a look afterwards."""
    try:
        s.start()
        ready(s)
    except BaseException:
        s.stop(failed=True)
        raise
    failed_before = request.session.testsfailed
    yield s
    s.stop(failed=request.session.testsfailed > failed_before)
