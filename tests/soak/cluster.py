"""The soak's cluster: the e2e control plane, the chart installed with its webhook, two controller
replicas behind a forwarder (the webhook's Service), and simulated nodes (plugin + kubelet stand-in).

Besides setting it up, this module holds the levers the fault matrix pulls (faults.py): stopping and
starting kube-apiserver, compacting etcd, killing a controller replica (optionally armed with a
controller crashpoint, controller/runtime/crashpoints.py), restarting a node's plugin armed with a kubelet-plugin
crashpoint (kubeletplugin/agent/crashpoints.py), restarting a kubelet stand-in and pausing the webhook.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.chart_workloads import ControllerProcess, token_kubeconfig
from tests.e2e.cluster import Component, ControlPlane, free_port, wait_until
from tests.e2e.plugin_harness import REPO, PluginProcess, metric_samples, scrape
from tests.e2e.scenario import NodeSpec, Scenario, ScenarioOptions, SimNode

from .cutproxy import ResponseCutter
from .proxy import TcpForwarder

#: Two MIG nodes (A100-40GB x2, H100-80GB x1), one hami-core node, one MIG node with mixed models.
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("mig-a100", ("A100-40GB", "A100-40GB"), mode="mig"),
    NodeSpec("mig-h100", ("H100-80GB",), mode="mig"),
    NodeSpec("hami", ("A100-40GB", "A100-40GB"), mode="hami-core", hami_core_library=True),
    NodeSpec("mixed", ("A100-40GB", "H100-80GB"), mode="mig"),
)
REPLICAS = ("a", "b")
CONTROLLER_CRASHPOINTS = "FLEXMIG_CONTROLLER_CRASHPOINTS"
#: Lifetime of the ServiceAccount tokens of the soak's plugins and controllers. Each process loads its
#: token once; with the e2e default (1 h) a plugin or a replica never restarted would get 401s once a
#: long soak passes the hour. 12 h covers any documented run (the API server sets no maximum here).
TOKEN_LIFETIME_S = 12 * 3600


@dataclass
class Replica:
    name: str
    webhook_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: ControllerProcess | None = None
    starts: int = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def leading(self) -> bool:
        if not self.alive():
            return False
        try:
            return any(True for _ in metric_samples(scrape(self.metrics_port, timeout_s=3), "flexmig_leader"))
        except OSError:
            return False


class SoakCluster:
    def __init__(self, cp: ControlPlane, nodes: tuple[NodeSpec, ...] = NODES) -> None:
        self.cp = cp
        options = ScenarioOptions(
            webhook=True, extra_values=("--set", "controller.replicas=2"), start_controller=False
        )
        self.scenario = Scenario(cp, nodes, options, release="flexmig")
        self.replicas = {n: Replica(n) for n in REPLICAS}
        self.forwarder = TcpForwarder(self.scenario.webhook_port, self._live_webhook_ports)
        self.plugin_env: dict[str, str] = {}
        self.standin_errors = 0
        # Each replica reaches kube-apiserver through its own proxy, which can drop responses.
        self.cutters = {n: ResponseCutter(cp.apiserver_port, seed=i) for i, n in enumerate(REPLICAS)}

    # --- setup ------------------------------------------------------------------------------------

    def start(self) -> SoakCluster:
        sc = self.scenario
        sc.install()
        sc.start_nodes()
        first = next(iter(sc.nodes.values()))
        self.plugin_env = sc.workload("daemonsets", sc.plugin_sa, "plugin", first.nd.root / "config").env
        for node in self.nodes.values():  # the plugins started with 1 h tokens: give them long ones
            pod = sc.plugin_pod(node.name)
            node.nd.kubeconfig = self._token(sc.plugin_sa, node.nd.root / "plugin.kubeconfig", pod)
            self.restart_plugin(node)
        self.forwarder.start()
        for name in REPLICAS:
            self.start_replica(name)
        wait_until(lambda: self.leader() is not None, 90, "a controller replica to lead")
        sc.wait_webhook(90)
        return self

    def stop(self, failed: bool = False) -> None:
        self.forwarder.stop()
        for cutter in self.cutters.values():
            cutter.stop()
        for rep in self.replicas.values():
            if rep.proc is not None:
                rep.proc.stop()
        for node in self.nodes.values():
            # Connection errors of the stand-ins during the API server's outages are the fault itself.
            self.standin_errors += len(node.standin.errors)
            node.standin.errors.clear()
        self.scenario.stop(failed=failed)

    @property
    def api(self) -> Any:
        return self.scenario.api

    @property
    def nodes(self) -> dict[str, SimNode]:
        return self.scenario.nodes

    def node_named(self, prefix: str) -> SimNode:
        return next(n for n in self.nodes.values() if n.spec.name == prefix)

    # --- controller replicas ----------------------------------------------------------------------

    def _live_webhook_ports(self) -> list[int]:
        return [r.webhook_port for r in self.replicas.values() if r.alive()]

    def start_replica(self, name: str, crashpoints: str = "") -> Replica:
        sc, rep = self.scenario, self.replicas[name]
        assert not rep.alive(), f"replica {name} is running"
        ctrl = sc.workload("deployments", sc.controller_sa, "controller", sc.workdir / "config")
        identity = f"{sc.controller_sa}-{name}"
        args = [a.replace("$(POD_NAME)", identity) for a in ctrl.args]
        kubeconfig = self._token(sc.controller_sa, sc.workdir / f"controller-{name}.kubeconfig")
        via = f"https://127.0.0.1:{self.cutters[name].port}"
        kubeconfig.write_text(kubeconfig.read_text().replace(self.cp.server, via))
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_", "FLEXMIG_"))
        }
        env.update(ctrl.env)
        env.update({"POD_NAME": identity, "POD_NAMESPACE": sc.namespace, "PYTHONPATH": str(REPO)})
        if crashpoints:
            env[CONTROLLER_CRASHPOINTS] = crashpoints
        argv = [
            sys.executable, "-m", "flexmig.cli", *args, f"--kubeconfig={kubeconfig}",
            f"--metrics-port={rep.metrics_port}", f"--webhook-port={rep.webhook_port}", "--webhook-address=127.0.0.1",
        ]  # fmt: skip
        rep.proc = ControllerProcess(argv, env, self.log_dir / f"controller-{name}.log", rep.metrics_port)
        rep.starts += 1

        def serving() -> bool:
            if rep.proc is None or rep.proc.proc.poll() is not None:
                return True  # an armed replica may already have crashed: the caller looks
            scrape(rep.metrics_port, timeout_s=2)
            return True

        wait_until(serving, 60, f"controller replica {name} to serve metrics")
        return rep

    def kill_replica(self, name: str) -> int | None:
        """SIGKILL a replica; its exit code (None if it was not running)."""
        rep = self.replicas[name]
        if rep.proc is None:
            return None
        if rep.proc.proc.poll() is None:
            rep.proc.proc.send_signal(signal.SIGKILL)
        code = rep.proc.proc.wait(30)
        rep.proc._log.close()
        return code

    def stop_replica(self, name: str) -> int | None:
        """SIGTERM a replica, as a rolling update does; its exit code (None if it was not running)."""
        rep = self.replicas[name]
        if rep.proc is None or rep.proc.proc.poll() is not None:
            return None
        return rep.proc.stop(timeout_s=40)

    def set_cut_rate(self, rate: float, min_request_bytes: int = 0) -> None:
        for cutter in self.cutters.values():
            cutter.min_request_bytes = min_request_bytes
            cutter.cut_rate = rate

    def response_cuts(self) -> int:
        return sum(c.cuts for c in self.cutters.values())

    def _token(self, sa: str, path: Path, bound_pod: Mapping[str, Any] | None = None) -> Path:
        sc = self.scenario
        return token_kubeconfig(
            sc.cp, sc.api, sc.namespace, sa, path, bound_pod, expiration_s=TOKEN_LIFETIME_S
        )

    def leader(self) -> str | None:
        leaders = [n for n, r in self.replicas.items() if r.leading()]
        return leaders[0] if len(leaders) == 1 else None

    def leaders(self) -> list[str]:
        return [n for n, r in self.replicas.items() if r.leading()]

    @property
    def log_dir(self) -> Path:
        return self.scenario.workdir

    # --- control plane ----------------------------------------------------------------------------

    def _component(self, name: str) -> Component:
        return next(c for c in self.cp.components if c.name == name)

    def stop_apiserver(self) -> None:
        self._component("kube-apiserver").stop()

    def start_apiserver(self, timeout_s: float = 120.0) -> None:
        comp = self._component("kube-apiserver")
        comp.start()
        wait_until(lambda: self.cp.get("/readyz", 3)[0] == 200, timeout_s, "kube-apiserver /readyz after restart",
                   check=comp.check_alive)  # fmt: skip

    def etcd_revision(self) -> int:
        return int(self._etcd("/v3/kv/range", {"key": _b64("/registry/"), "limit": 1})["header"]["revision"])

    def etcd_compact(self) -> int:
        """Compact etcd's history up to now (physical); returns the revision."""
        rev = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def _etcd(self, path: str, body: Mapping[str, object]) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.cp.etcd_port}{path}"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    # --- nodes ------------------------------------------------------------------------------------

    def restart_plugin(self, node: SimNode, crashpoints: str = "", *, kill: bool = False) -> PluginProcess:
        """Stop the node's plugin (SIGTERM, or SIGKILL if `kill`) and start a new one, optionally armed."""
        old = node.plugin
        if old is not None:
            if kill:
                if old.proc.poll() is None:
                    old.kill9()
            else:
                old.stop()
        node.nd.marker.unlink(missing_ok=True)
        env = dict(self.plugin_env)
        if crashpoints:
            env.update({"FLEXMIG_CRASHPOINTS": crashpoints, "FLEXMIG_CRASHPOINT_MARKER": str(node.nd.marker)})
        node.plugin = PluginProcess(node.nd, env=env)
        node.plugin.wait_ready(90)
        return node.plugin

    def restart_standin(self, node: SimNode) -> None:
        self.scenario.restart_standin(node.name)

    def dead_standin_loops(self) -> list[str]:
        """Threads of the kubelet stand-ins that ended (with the error each recorded): a node whose pod
        worker died runs no pod again, which the invariants would blame on flexmig."""
        out = []
        for node in self.nodes.values():
            dead = [t.name for t in node.standin._threads if not t.is_alive()]
            if dead:
                out.append(f"{node.name}: {dead}; errors {node.standin.errors[-3:]}")
        return out


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.5) -> bool:
    """Poll `predicate()` until true or `timeout_s`; whether it became true (never raises on timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return True
        except Exception:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
