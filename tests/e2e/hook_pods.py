"""TEST CODE: the container runtime's part for the chart's own pods, so that `helm test` really runs.

The e2e suite has no kubelet and no container runtime: the kubelet stand-ins (kubelet_standin.py)
mark every pod bound to their node Running, and the scenario (scenario.py) runs the chart's controller
and plugins as local processes. What `helm test` needs on top of that, and this module stands in for:

- pod IPs (`give_pod_ips`): the controller Deployment's pod and each plugin DaemonSet pod get their
  own loopback address (127.0.0.N; Linux answers on all of 127/8) in `status.podIP`, written with the
  node's kubelet identity, and the matching process listens there on the chart's metrics port: each
  plugin is restarted with `--metrics-address=<its pod IP>`; the controller (no address flag) listens
  on all addresses, so on its pod IP too.
- the test hook pod's container (`HookPodRunner`): once its node's stand-in has marked the pod
  Running, its command runs as a local process with the pod's environment and volumes as kubelet
  would make them (the ConfigMap with the script; the projected ServiceAccount volume with a
  TokenRequest token bound to the pod, the namespace's kube-root-ca.crt and the namespace), then the
  pod's status gets the container's exit code and phase Succeeded or Failed, which is what helm
  watches. Not stood in exactly: the in-cluster `kubernetes` Service address (KUBERNETES_SERVICE_HOST/
  PORT point at the API server itself: no kube-proxy here), the image (this Python runs the script)
  and the mount path of the ServiceAccount volume (a runner sets the script's `SA_DIR` to the local
  copy instead of a bind mount at /var/run/secrets/kubernetes.io/serviceaccount).
- pod logs (`ContainerLogServer`): the API server reads `pods/log` from the kubelet's HTTPS port of the
  pod's node (its InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port`); this server answers
  `GET /containerLogs/<ns>/<pod>/<container>` with the hook process's output there, so `helm test
  --logs` prints it. The API server here verifies no kubelet certificate (no --kubelet-certificate-
  authority), as a cluster without a kubelet CA does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import itertools
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from controller.kube.rest import pod_path, request

from .cluster import free_port, wait_until
from .pki import PKI
from .plugin_harness import PluginProcess

if TYPE_CHECKING:
    from .scenario import Scenario, SimNode

Obj = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
_LOOPBACK = itertools.count(10)

# Runs a script as its own module with SA_DIR pointed at the local ServiceAccount volume, then its
# main(): check_serving.py's interface (deployments/helm/flexmig/files/check_serving.py).
RUNNER = """
import importlib.util, pathlib, sys
script, sa_dir = sys.argv[1], sys.argv[2]
name = pathlib.Path(script).stem
spec = importlib.util.spec_from_file_location(name, script)
mod = importlib.util.module_from_spec(spec)
sys.modules[name] = mod  # dataclasses look their module up while decorating
spec.loader.exec_module(mod)
mod.SA_DIR = sa_dir
sys.exit(mod.main())
"""


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def next_loopback() -> str:
    """A loopback address no other pod of this session got (127.0.0.10 and up)."""
    n = next(_LOOPBACK)
    assert n < 255, "out of loopback pod addresses"
    return f"127.0.0.{n}"


def _patch_status(node_api: Any, pod: Obj, status: Obj) -> None:
    meta = pod["metadata"]
    request(
        node_api,
        "PATCH",
        pod_path(meta["namespace"], meta["name"], "status"),
        {"status": status},
        content_type=STRATEGIC,
    )


def _running_pods(sc: Scenario, component: str) -> list[Obj]:
    query = [("labelSelector", f"{INSTANCE}={sc.release},{COMPONENT}={component}")]
    items: list[Obj] = request(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/pods", query=query)["items"]
    return [p for p in items if (p.get("status") or {}).get("phase") == "Running"]


def restart_plugin(sc: Scenario, node: SimNode, address: str, port: int) -> PluginProcess:
    """Restart a node's plugin listening on `address:port` for /metrics and /healthz."""
    if node.plugin is not None and node.plugin.proc.poll() is None:
        code = node.plugin.stop()
        assert code == 0, f"plugin on {node.name} exited {code}:\n{node.plugin.log_text()[-3000:]}"
    node.nd.metrics_address, node.nd.metrics_port = address, port
    env = sc.workload("daemonsets", sc.plugin_sa, "plugin", node.nd.root / "config").env
    seen = node.standin.registrations
    node.plugin = PluginProcess(node.nd, env=env).wait_ready()
    node.standin.wait_registered(after=seen)
    return node.plugin


def give_pod_ips(sc: Scenario, plugin_port: int, timeout_s: float = 60.0) -> dict[str, str]:
    """Pod name -> the loopback address written into its `status.podIP`, for the controller's pods
    and every plugin pod, with each process listening there (module docstring)."""
    ips: dict[str, str] = {}
    wait_until(lambda: bool(_running_pods(sc, "controller")), timeout_s, "the controller pod to run")
    for pod in _running_pods(sc, "controller"):
        ips[pod["metadata"]["name"]] = next_loopback()
    for node in sc.nodes.values():
        pod = sc.plugin_pod(node.name)
        ips[pod["metadata"]["name"]] = address = next_loopback()
        restart_plugin(sc, node, address, plugin_port)
    for pod in _running_pods(sc, "controller") + _running_pods(sc, "kubelet-plugin"):
        ip = ips[pod["metadata"]["name"]]
        node_api = sc.nodes[pod["spec"]["nodeName"]].standin.api_client
        _patch_status(node_api, pod, {"podIP": ip, "podIPs": [{"ip": ip}]})
    return ips


@dataclass(frozen=True)
class HookRun:
    """One run of the hook pod's container."""

    pod: str
    uid: str
    node: str
    exit_code: int
    output: str


class ContainerLogServer:
    """The kubelet's containerLogs endpoint for the hook pods' output (module docstring)."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, str, str], str] = {}  # (namespace, pod, container) -> output
        self.port = free_port()
        pair = PKI("e2e-kubelet-stand-in").issue("kubelet", ips=["127.0.0.1"], server=True)
        self._dir = Path(tempfile.mkdtemp(prefix="fm-kubelet-logs-"))
        (self._dir / "tls.crt").write_bytes(pair.cert_pem)
        (self._dir / "tls.key").write_bytes(pair.key_pem)
        logs = self.logs

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
                text = None
                if len(parts) == 4 and parts[0] == "containerLogs":
                    text = logs.get((parts[1], parts[2], parts[3]))
                body = (text if text is not None else f"no logs for {self.path}\n").encode()
                self.send_response(200 if text is not None else 404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self._dir / "tls.crt"), str(self._dir / "tls.key"))
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubelet-logs", daemon=True)
        self._thread.start()

    def advertise(self, node_api: Any, node: str) -> None:
        """Write the node's address and kubelet port, as kubelet does when it registers."""
        status = {
            # No Hostname address: the API server prefers it, and the node's name resolves nowhere.
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
        }
        request(node_api, "PATCH", f"/api/v1/nodes/{node}/status", {"status": status}, content_type=STRATEGIC)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)


class HookPodRunner:
    """Runs the container of every new pod `name` in the scenario's namespace once its node's stand-in
    has marked it Running, and reports the exit code in its status (module docstring). A context
    manager: a background thread polls for the pod while `helm test` runs."""

    def __init__(self, sc: Scenario, name: str, logs: ContainerLogServer | None = None) -> None:
        self.sc = sc
        self.name = name
        self.logs = logs
        self.runs: list[HookRun] = []
        self.errors: list[str] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"hook-runner-{name}", daemon=True)
        server = urllib.parse.urlsplit(sc.cp.server)
        self._service = (str(server.hostname), str(server.port))

    def __enter__(self) -> HookPodRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def describe(self) -> str:
        """What ran, for an assertion message."""
        lines = [f"{r.pod} ({r.uid[:8]}) on {r.node}: exit {r.exit_code}\n{r.output}" for r in self.runs]
        return "\n".join(["hook runs:", *lines, *(f"runner error: {e}" for e in self.errors)])

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                pod = request(self.sc.api, "GET", pod_path(self.sc.namespace, self.name))
            except ApiException as exc:
                if exc.status != 404:
                    self.errors.append(f"GET pod: {exc.status} {exc.reason}")
                continue
            except Exception as exc:  # the thread must go on (and the test see why)
                self.errors.append(f"GET pod: {exc!r}")
                continue
            uid, node_name = pod["metadata"]["uid"], pod["spec"].get("nodeName") or ""
            node = self.sc.nodes.get(node_name)
            if uid in self._seen or not node_name:
                continue  # done already, or not scheduled yet
            if node is None:  # no stand-in would ever start it: fail it now, not at helm's timeout
                self._seen.add(uid)
                self.errors.append(f"pod {self.name} was scheduled to {node_name}, not a scenario node")
                with contextlib.suppress(Exception):
                    self._finish(self.sc.api, pod, 128, _now())
                continue
            if (pod.get("status") or {}).get("phase") != "Running":
                continue  # its node's stand-in starts it first, as kubelet would
            self._seen.add(uid)
            try:
                self.runs.append(self._run(pod, node.standin.api_client))
            except Exception as exc:
                self.errors.append(f"running {self.name}: {exc!r}")
                with contextlib.suppress(Exception):  # fail the pod, or helm waits for its timeout
                    self._finish(node.standin.api_client, pod, 128, _now())

    def _run(self, pod: Obj, node_api: Any) -> HookRun:
        meta, spec = pod["metadata"], pod["spec"]
        [container] = spec["containers"]
        root = Path(tempfile.mkdtemp(prefix=f"hook-{meta['name']}-", dir=self.sc.workdir))
        volumes = {v["name"]: v for v in spec.get("volumes") or ()}
        mounts: dict[str, Path] = {}
        for m in container.get("volumeMounts") or ():
            mounts[m["mountPath"]] = local = root / "volumes" / m["name"]
            if not local.exists():
                _write_volume(node_api, pod, volumes[m["name"]], local)
        argv = [*(container.get("command") or ()), *(container.get("args") or ())]
        assert argv[:1] == ["python3"] and len(argv) == 2, f"not a `python3 SCRIPT` container: {argv}"
        mount = next((m for m in mounts if argv[1].startswith(m + "/")), None)
        assert mount is not None, f"{argv[1]} is on no volume of the pod"
        script = mounts[mount] / argv[1].removeprefix(mount + "/")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root)}
        for e in container.get("env") or ():
            assert "value" in e, f"env {e['name']}: only literal values are stood in"
            env[e["name"]] = str(e["value"])
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = self._service
        started = _now()
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, str(script), str(mounts[SA_MOUNT])],
            env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=float(env.get("FLEXMIG_TIMEOUT_S", "120")) + 60, check=False,
        )  # fmt: skip
        if self.logs is not None:
            self.logs.logs[(meta["namespace"], meta["name"], container["name"])] = proc.stdout
        (root / "output.log").write_text(proc.stdout)
        self._finish(node_api, pod, proc.returncode, started)
        return HookRun(meta["name"], meta["uid"], spec["nodeName"], proc.returncode, proc.stdout)

    def _finish(self, node_api: Any, pod: Obj, code: int, started: str) -> None:
        """The container terminated with `code`: the pod's phase and container status, as kubelet
        writes them for a restartPolicy Never pod."""
        now = _now()
        meta = pod["metadata"]
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now,
        }
        statuses = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "containerID": f"e2e://{meta['uid'][:8]}-{c['name']}",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
            for c in pod["spec"]["containers"]
        ]
        conditions = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
            for t in ("Ready", "ContainersReady")
        ]
        phase = "Succeeded" if code == 0 else "Failed"
        _patch_status(
            node_api, pod, {"phase": phase, "conditions": conditions, "containerStatuses": statuses}
        )


def _write_volume(node_api: Any, pod: Obj, volume: Obj, local: Path) -> None:
    """A pod volume's files as kubelet writes them, read with the node's identity: a ConfigMap, or
    the projected ServiceAccount volume (token bound to the pod, a ConfigMap key, the namespace)."""
    ns = pod["metadata"]["namespace"]
    local.mkdir(parents=True)
    if "configMap" in volume:
        _write_config_map(node_api, ns, volume["configMap"], local)
        return
    assert "projected" in volume, f"volume {volume['name']}: only configMap and projected are stood in"
    for source in volume["projected"]["sources"]:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            token_spec: Obj = {
                "audiences": [sat["audience"]] if sat.get("audience") else [],
                "expirationSeconds": sat.get("expirationSeconds", 3607),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            }
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": token_spec}
            sa = pod["spec"]["serviceAccountName"]
            out = request(node_api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body)
            (local / sat["path"]).write_text(out["status"]["token"])
        elif "configMap" in source:
            _write_config_map(node_api, ns, source["configMap"], local)
        elif "downwardAPI" in source:
            for item in source["downwardAPI"]["items"]:
                field_path = item["fieldRef"]["fieldPath"]
                assert field_path == "metadata.namespace", f"downward API {field_path} is not stood in"
                (local / item["path"]).write_text(ns)
        else:
            raise AssertionError(f"projected source {sorted(source)} is not stood in")


def _write_config_map(node_api: Any, ns: str, ref: Obj, local: Path) -> None:
    data = request(node_api, "GET", f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}").get("data") or {}
    items = ref.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        (local / item["path"]).write_text(data[item["key"]])
