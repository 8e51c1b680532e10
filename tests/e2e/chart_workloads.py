"""The chart's workloads as local processes (test code for scenario.py).

There is no kubelet to start the chart's pods, so the scenario runs their containers' commands here:
`ChartNodeDir` gives `PluginProcess` the DaemonSet's arguments with the node-local paths, NVML
simulator and metrics address put last (argparse keeps the last value); `ControllerProcess` runs the
Deployment's command. Both authenticate with TokenRequest tokens of the chart's ServiceAccounts
(`token_kubeconfig`), the plugin's bound to its DaemonSet pod so that the API server knows its node.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.kube.rest import request

from .cluster import ControlPlane, wait_until
from .pki import b64
from .plugin_harness import REPO, NodeDir, scrape, stop_process


@dataclass(frozen=True)
class Workload:
    """A chart workload's container as installed: its args, plain env values, and mounted config."""

    args: tuple[str, ...]
    env: dict[str, str]  # only literal values; fieldRefs are the caller's to fill in
    config_mounts: dict[str, tuple[str, str]]  # mountPath -> ("configMap" | "secret", object name)

    def localize(self, api: Any, namespace: str, root: Path) -> Workload:
        """Write each mounted ConfigMap/Secret under `root` and point args and env at those copies."""
        moved: dict[str, str] = {}
        for mount, (kind, name) in self.config_mounts.items():
            plural = "configmaps" if kind == "configMap" else "secrets"
            obj = request(api, "GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}")
            local = root / name
            local.mkdir(parents=True, exist_ok=True)
            for key, value in (obj.get("data") or {}).items():
                (local / key).write_bytes(base64.b64decode(value) if kind == "secret" else value.encode())
            moved[mount] = str(local)

        def fix(text: str) -> str:
            for mount, local in moved.items():
                text = text.replace(mount, local)
            return text

        return Workload(
            tuple(fix(a) for a in self.args), {k: fix(v) for k, v in self.env.items()}, self.config_mounts
        )


def workload(api: Any, namespace: str, kind: str, name: str, container: str) -> Workload:
    """A chart workload's container (kind: daemonsets, deployments), as installed."""
    obj = request(api, "GET", f"/apis/apps/v1/namespaces/{namespace}/{kind}/{name}")
    pod = obj["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == container)
    volumes = {v["name"]: v for v in pod.get("volumes") or ()}
    mounts: dict[str, tuple[str, str]] = {}
    for m in c.get("volumeMounts") or ():
        v = volumes[m["name"]]
        if "configMap" in v:
            mounts[m["mountPath"]] = ("configMap", v["configMap"]["name"])
        elif "secret" in v:
            mounts[m["mountPath"]] = ("secret", v["secret"]["secretName"])
    env = {e["name"]: str(e["value"]) for e in c.get("env") or () if "value" in e}
    return Workload(tuple(c.get("args") or ()), env, mounts)


def token_kubeconfig(
    cp: ControlPlane,
    api: Any,
    namespace: str,
    sa: str,
    path: Path,
    bound_pod: Mapping[str, Any] | None = None,
    *,
    expiration_s: int = 3600,
) -> Path:
    """A kubeconfig with a TokenRequest token of ServiceAccount `sa` (bound to a pod if given), valid
    `expiration_s` (a process loads it once, so a run longer than that needs a longer one)."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": expiration_s}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    out = request(api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token", body)
    cluster = {"server": cp.server, "certificate-authority-data": b64(cp.pki.ca_pem)}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": out["status"]["token"]}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": sa}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class ChartNodeDir(NodeDir):
    """A NodeDir whose plugin runs with the chart's DaemonSet arguments, host paths made node-local."""

    chart_args: tuple[str, ...] = ()  # the DaemonSet's, ConfigMap mounts already made local
    # Where /metrics and /healthz listen: by default an ephemeral port on 127.0.0.1; hook_pods.py
    # gives each plugin its pod's own loopback address and the chart's port, as a pod IP would be.
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 0  # 0: ephemeral; the bound port is logged (31992 in the chart)
    # "sim" (file-backed: tests arm faults and latencies on the file while the plugin runs) or
    # "sim-memory" (loaded once, changes written back: what benchmarks/e2e uses, driver/nvml/backend.py).
    nvml_backend: str = "sim"

    @property
    def hami_core_dir(self) -> Path:
        """The node's HAMi-core directory (the chart's host /usr/local/vgpu)."""
        return self.root / "vgpu"

    def argv(self, extra: Sequence[str] = ()) -> list[str]:
        local = {
            "registry-dir": self.root / "reg",
            "plugins-dir": self.root / "plugins",
            "cdi-dir": self.cdi_dir,
            "checkpoint-path": self.checkpoint,
            "boot-id-path": self.boot_id_file,
            "hami-core-dir": self.hami_core_dir,
            "hami-core-library": self.hami_core_dir / "libvgpu.so",
            "nvml": f"{self.nvml_backend}:{self.sim_state}",
            "kubeconfig": self.kubeconfig,
            "metrics-address": self.metrics_address,
            "metrics-port": self.metrics_port,
            "log-format": "json",
        }
        overrides = [f"--{k}={v}" for k, v in local.items()]
        args = [*self.chart_args, *overrides, *extra]
        return [sys.executable, "-m", "flexmig.cli", *args, *self._host_views(args)]

    @staticmethod
    def _host_views(args: Sequence[str]) -> list[str]:
        """A plugin run as a host process sees host paths where the container sees its mounts: each
        path the DaemonSet gives as the container's view of a mount (/driver-root, /dev-root, /cdi-hook,
        /proc-root) is pointed back at the host path it stands for (the last value given, as argparse
        takes it, so a test's own --driver-root wins)."""
        given = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)
        out = [
            f"--container-{flag}={given[flag]}"
            for flag, mount in (
                ("driver-root", "/driver-root"),
                ("dev-root", "/dev-root"),
                ("nvidia-cdi-hook-path", "/cdi-hook/"),
            )
            if given.get(f"container-{flag}", "").startswith(mount) and flag in given
        ]
        if given.get("proc-root") == "/proc-root":
            out.append("--proc-root=/proc")
        return out


class ControllerProcess:
    """`flexmig controller` as a local process (the Deployment's container)."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, metrics_port: int
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        # argparse keeps the last --metrics-port, so a caller's extra arguments may move the port.
        ports = [a.removeprefix("--metrics-port=") for a in self.argv if a.startswith("--metrics-port=")]
        self.metrics_port = int(ports[-1]) if ports else metrics_port
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=dict(env), cwd=str(REPO)
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        return scrape(self.metrics_port)

    def wait_leader(self, timeout_s: float = 60.0) -> None:
        def leading() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"controller exited ({self.proc.returncode}):\n{self.log_text()[-4000:]}"
                )
            return "flexmig_leader 1.0" in self.metrics()

        wait_until(leading, timeout_s, "the controller to lead")

    def stop(self, timeout_s: float = 20.0) -> int:
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code
