"""A real Kubernetes node for the e2e tests: containerd + runc + kubelet, joined to the test control plane.

Everything runs as root on this machine, in private directories, with private sockets and ports, so
nothing touches the machine's own container runtime or kubelet (if any):

- containerd (config version 3): own root, state, gRPC/ttrpc sockets, NRI socket and opt dir; the CRI
  runtime with `restrict_oom_score_adj = true` (a sandbox may not lower its OOM score on these VMs),
  `cdi_spec_dirs` = the plugin's CDI directory and runc = the runc built with seccomp; no CNI config
  (test pods use the host network) unless `RealNode.network` is set: then network.py's bridge +
  host-local pod network and a kube-proxy for this node.
- kubelet (KubeletConfiguration v1beta1): `failCgroupV1: false` (the VMs are cgroup v1), cgroupfs, no
  QoS cgroups, own root dir (its plugin watcher reads `<root>/plugins_registry`), own ports, pod logs
  under its root, the control plane's DRA feature gates, credentials of `system:node:<name>`.
- images come from no registry: `images.py` writes OCI layout tars imported with `ctr`.
- crictl: `<node root>/crictl.yaml` points crictl at this containerd's CRI socket; `RealNode.crictl()`
  runs it (`crictl --config <node root>/crictl.yaml ...`), by hand the same command debugs a kept node.

Without a pod network the node reports NotReady, which the node lifecycle controller turns into
not-ready taints: test pods tolerate them (`TOLERATE_ALL`) and run with `hostNetwork: true`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..cluster import FEATURE_GATES, Component, ControlPlane, free_port, tail, wait_until
from .build import crictl_binary
from .images import PAUSE_ENTRYPOINT, PAUSE_IMAGE, TEST_IMAGE, write_image_tar
from .network import PodNetwork

TOLERATE_ALL = [{"operator": "Exists"}]


@dataclass(frozen=True)
class NodeBinaries:
    bin_dir: Path

    def __getitem__(self, name: str) -> str:
        path = self.bin_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run tests/e2e/k8sbuild/node/build.sh")
        return str(path)


def containerd_config(root: Path, runc: str, cdi_dir: Path) -> str:
    sock = root / "containerd.sock"
    cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{root / "root"}"
state = "{root / "state"}"

[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[plugins."io.containerd.nri.v1.nri"]
  socket_path = "{root / "nri.sock"}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"
[{cri_runtime}]
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir (not /var/run/netns): unmount_all() finds them.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{cdi_dir}"]
[{cri_runtime}.cni]
  bin_dirs = ["{root / "cni-bin"}"]
  conf_dir = "{root / "cni-conf"}"
[{cri_runtime}.containerd]
  default_runtime_name = "runc"
[{cri_runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri_runtime}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
"""


def crictl_config(containerd_sock: Path) -> str:
    """crictl's config file: both endpoints are the node's containerd (its CRI plugin)."""
    endpoint = f"unix://{containerd_sock}"
    return yaml.safe_dump(
        {"runtime-endpoint": endpoint, "image-endpoint": endpoint, "timeout": 10, "debug": False}
    )


def kubelet_config(root: Path, containerd_sock: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "localStorageCapacityIsolation": False,
        "containerRuntimeEndpoint": f"unix://{containerd_sock}",
        "address": "127.0.0.1",
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "featureGates": dict(FEATURE_GATES),
        "podLogsDir": str(root / "pod-logs"),
        "volumePluginDir": str(root / "volume-plugins"),
        "registerNode": True,
        "nodeStatusUpdateFrequency": "5s",
        # A busy shared test machine must not make the kubelet evict or garbage-collect test pods.
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "",
        "serializeImagePulls": False,
    }


class RealNode:
    """containerd + kubelet for node `name`; directories under `root` (short: unix socket paths)."""

    def __init__(
        self,
        cp: ControlPlane,
        bins: NodeBinaries,
        name: str,
        root: Path,
        cdi_dir: Path,
        labels: Mapping[str, str],
    ) -> None:
        self.cp = cp
        self.bins = bins
        self.name = name
        self.root = root
        self.cdi_dir = cdi_dir
        self.labels = dict(labels)
        # Loopback leaves the Node without addresses (kubelet refuses it), so host-network pods get no
        # pod IP; realnode/chart.py sets the machine's address for the chart's probed pods.
        self.node_ip = "127.0.0.1"
        self.ctrd_root = root / "c"
        self.kubelet_root = root / "k"
        self.sock = self.ctrd_root / "containerd.sock"
        self.log_dir = root / "logs"
        self.containerd: Component | None = None
        self.kubelet: Component | None = None
        self.network: PodNetwork | None = None  # set before start() for a pod network
        self._kubelet_starts = 0

    # --- paths ------------------------------------------------------------------------------------

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def pod_logs_dir(self) -> Path:
        return self.kubelet_root / "pod-logs"

    @property
    def crictl_config_path(self) -> Path:
        return self.root / "crictl.yaml"

    # --- lifecycle --------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "CONTAINERD_"))}
        env["PATH"] = f"{self.bins.bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"  # containerd finds its shim
        return env

    def start(self, timeout_s: float = 120.0) -> RealNode:
        for d in (self.ctrd_root, self.kubelet_root, self.log_dir, self.cdi_dir, self.registry_dir):
            d.mkdir(parents=True, exist_ok=True)
        if self.network is not None:
            self.network.write_cni(self.ctrd_root / "cni-bin", self.ctrd_root / "cni-conf")
        self.start_containerd()
        self.import_images()
        self.start_kubelet(timeout_s)
        if self.network is not None:
            self.network.start_kube_proxy(self._env())
        return self

    def start_containerd(self, timeout_s: float = 60.0) -> None:
        config = self.ctrd_root / "config.toml"
        config.write_text(containerd_config(self.ctrd_root, self.bins["runc"], self.cdi_dir))
        self.crictl_config_path.write_text(crictl_config(self.sock))
        self.containerd = Component(
            "containerd", [self.bins["containerd"], "--config", str(config)], self.log_dir / "containerd.log"
        )
        self.containerd.start(self._env())
        wait_until(
            lambda: self.ctr("version", check=False).returncode == 0,
            timeout_s,
            f"containerd of {self.name} (log {self.log_dir / 'containerd.log'})",
            check=self._check(self.containerd),
        )

    def ctr(
        self, *args: str, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.bins["ctr"], "--address", str(self.sock), "--namespace", "k8s.io", *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=self._env()
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def crictl(
        self, *args: str, check: bool = True, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """crictl against this node's containerd (crictl.yaml); builds crictl on first use if needed."""
        argv = [str(crictl_binary()), "--config", str(self.crictl_config_path), *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=self._env()
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def crictl_json(self, *args: str) -> Any:
        """The parsed JSON output of `crictl <args> -o json` (or of `crictl inspect*`, JSON by default)."""
        return json.loads(self.crictl(*args).stdout)

    def crictl_dump(self) -> str:
        """`crictl ps -a` and `crictl pods` for a failure message; never raises."""
        parts = []
        for args in (("ps", "-a"), ("pods",)):
            try:
                proc = self.crictl(*args, check=False)
                text = proc.stdout.strip() or proc.stderr.strip()
            except Exception as exc:  # a debugging aid must not hide the test's failure
                text = f"(crictl unavailable: {exc})"
            parts.append(f"$ crictl --config {self.crictl_config_path} {' '.join(args)}\n{text}")
        return "\n".join(parts)

    def import_images(self) -> None:
        busybox = Path(self.bins["busybox"])
        images = self.root / "images"
        images.mkdir(exist_ok=True)
        for name, entrypoint in ((TEST_IMAGE, ["/bin/sh"]), (PAUSE_IMAGE, PAUSE_ENTRYPOINT)):
            tar = write_image_tar(
                busybox, name, images / f"{name.replace('/', '_').replace(':', '_')}.tar", entrypoint
            )
            self.ctr("images", "import", str(tar), timeout_s=120)
        listed = self.ctr("images", "list", "-q").stdout.split()
        missing = {TEST_IMAGE, PAUSE_IMAGE} - set(listed)
        assert not missing, f"images not imported: {missing}; have {listed}"

    def start_kubelet(self, timeout_s: float = 120.0) -> None:
        config = self.kubelet_root / "config.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self.kubelet_root, self.sock)))
        kubeconfig = self.cp.node_kubeconfig(self.name)
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._kubelet_starts += 1
        argv = [
            self.bins["kubelet"],
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.kubelet_root / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=3",
        ]
        self.kubelet = Component("kubelet", argv, self.log_dir / f"kubelet-{self._kubelet_starts}.log")
        self.kubelet.start(self._env())
        api = self.cp.api_client()
        try:
            from kubernetes import client as k8s

            core = k8s.CoreV1Api(api)

            def registered() -> bool:
                node = core.read_node(self.name)
                conds = {c.type: c for c in node.status.conditions or ()}
                return "Ready" in conds  # NotReady without a pod network is expected; module docstring

            wait_until(
                registered, timeout_s, f"kubelet of {self.name} to register", check=self._check(self.kubelet)
            )
        finally:
            api.close()

    def _check(self, comp: Component) -> Any:
        def check() -> None:
            if comp.proc is not None and comp.proc.poll() is not None:
                raise AssertionError(f"{comp.name} exited ({comp.proc.returncode}):\n{tail(comp.log_path)}")

        return check

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop(grace_s=15)
            self.kubelet = None

    def restart_kubelet(self, timeout_s: float = 120.0) -> None:
        self.stop_kubelet()
        self.start_kubelet(timeout_s)

    def current_kubelet_log(self) -> str:
        """The log of the kubelet started last."""
        return (self.log_dir / f"kubelet-{self._kubelet_starts}.log").read_text(errors="replace")

    def kubelet_log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("kubelet-*.log")))

    def stop(self) -> None:
        """Kubelet, then every container task, then containerd, then what stays mounted."""
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.alive():
            with contextlib.suppress(Exception):
                for task in self.ctr("tasks", "list", "-q", check=False).stdout.split():
                    self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
                deadline = time.monotonic() + 20
                while (
                    time.monotonic() < deadline
                    and self.ctr("tasks", "list", "-q", check=False).stdout.split()
                ):
                    time.sleep(0.2)
                for c in self.ctr("containers", "list", "-q", check=False).stdout.split():
                    self.ctr("tasks", "delete", "-f", c, check=False)
                    self.ctr("containers", "delete", c, check=False)
            self.containerd.stop(grace_s=15)
        self.unmount_all()  # the sandboxes' network namespaces too: their veths go with them
        if self.network is not None:
            self.network.stop()

    def unmount_all(self) -> None:
        root = str(self.root.resolve())
        mounts = []
        with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
            for line in fh:
                target = line.split()[4].replace("\\040", " ")
                if target == root or target.startswith(root + "/"):
                    mounts.append(target)
        for target in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)

    def cleanup(self) -> None:
        self.unmount_all()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- pods -------------------------------------------------------------------------------------

    def container_log(self, pod: Mapping[str, Any], container: str) -> str:
        """The container's output as the kubelet stored it (CRI log format: time stream tag text)."""
        meta = pod["metadata"]
        d = self.pod_logs_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        lines = []
        for f in sorted(d.glob("*.log")):
            for line in f.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(lines)
