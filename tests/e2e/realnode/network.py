"""A real pod network for one `RealNode`: CNI bridge + host-local, and kube-proxy in iptables mode.

Built from their Go modules (k8sbuild/node/build.sh net; realnode/build.py `net_binaries()`):

- containerd's CRI runs the CNI plugins from the node's `cni-bin` directory with a conflist in its
  `cni-conf` directory (node.py's containerd config): a Linux bridge of its own (`fmc<8 hex>`) whose
  address is the pods' gateway, and host-local addresses from a /24 no route of this machine uses,
  kept under the node's root. No `ipMasq`: pods talk only to this machine (the API server) and to each
  other, so the bridge plugin adds no iptables rules that a killed test could leave behind. With a
  CNI config containerd reports the network ready and the node becomes Ready (no not-ready taints).
- kube-proxy (iptables mode) against the test API server as `system:kube-proxy` (bound to the
  `system:node-proxier` role by the API server's bootstrap policy) turns Service ClusterIPs into DNAT
  rules: a pod's in-cluster client reaches the `kubernetes` Service (whose endpoint is the API
  server's advertised address, `ControlPlane(advertise_address=...)`), and the API server, on this
  machine, reaches a webhook through its Service. kube-proxy is told to leave this machine's sysctls
  alone (conntrack limits and timeouts, route_localnet) and its OOM score as it is.

What is global on the machine and so restored or serialised: kube-proxy's KUBE-* chains are one set
per network namespace, and two kube-proxies would overwrite each other's rules, so a file lock makes a
second pod network (another test session here) wait for the first to stop; `stop()` runs
`kube-proxy --cleanup` and deletes the bridge, and the next holder of the lock undoes what a killed
run left (`_take_lock`). `net.ipv4.ip_forward` is switched on (pod -> Service -> pod traffic is
routed; the bridge plugin's `isGateway` would switch it on too) and `stop()` puts back the value found.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import re
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO

import yaml

from ..cluster import Component, ControlPlane, Identity, free_port, tail, wait_until

KUBE_PROXY = Identity("system:kube-proxy")
LOCK_PATH = Path("/run/lock/flexmig-e2e-kube-proxy.lock")
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# Pod subnets are /24s of this range; one is picked that no route of this machine overlaps.
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")


def bridge_netfilter() -> bool:
    try:
        return Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip() == "1"
    except OSError:  # br_netfilter not loaded
        return False


def routed_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    nets = []
    for line in out.splitlines():
        dst = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if dst not in ("default", "local", "broadcast"):
                nets.append(ipaddress.ip_network(dst, strict=False))
    return [n for n in nets if isinstance(n, ipaddress.IPv4Network)]


def free_pod_subnet() -> ipaddress.IPv4Network:
    used = routed_networks()
    candidates = [s for s in POD_RANGE.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used)]
    if not candidates:
        raise AssertionError(f"no free /24 in {POD_RANGE} for the pod network; routes: {used}")
    return candidates[0]


class PodNetwork:
    def __init__(self, cp: ControlPlane, bin_dir: Path, node_name: str, root: Path, log_dir: Path) -> None:
        self.cp = cp
        self.bin_dir = bin_dir
        self.node_name = node_name
        self.root = root
        self.log_dir = log_dir
        self.bridge = f"fmc{uuid.uuid4().hex[:8]}"  # a link name has at most 15 characters
        self.name = f"flexmig-e2e-{self.bridge}"
        self.subnet = free_pod_subnet()
        self.gateway = str(next(self.subnet.hosts()))
        self.kube_proxy: Component | None = None
        self.healthz_port = free_port()
        self._lock: IO[str] | None = None
        self._ip_forward: str | None = None

    def write_cni(self, bin_dir: Path, conf_dir: Path, lock_timeout_s: float = 600.0) -> None:
        """The plugins into containerd's CNI bin dir, the conflist into its conf dir (before it starts).

        containerd also runs `loopback` itself for every sandbox's lo, so it is there but not listed.
        """
        for d in (bin_dir, conf_dir, self.root):
            d.mkdir(parents=True, exist_ok=True)
        self._take_lock(lock_timeout_s)
        # Routed pod -> Service -> pod traffic needs forwarding; the value found is put back in stop().
        IP_FORWARD.write_text("1\n")
        for name in ("bridge", "host-local", "loopback"):
            (bin_dir / name).unlink(missing_ok=True)
            (bin_dir / name).symlink_to(self.bin_dir / name)
        conflist = {
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,  # a pod reaching itself through its own Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "ipam"),
                    },
                }
            ],
        }
        (conf_dir / "10-flexmig-e2e.conflist").write_text(json.dumps(conflist, indent=2))

    def kube_proxy_config(self, kubeconfig: Path) -> dict[str, object]:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "hostnameOverride": self.node_name,
            "clusterCIDR": str(self.subnet),
            "detectLocalMode": "ClusterCIDR",
            "healthzBindAddress": f"127.0.0.1:{self.healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "nodePortAddresses": ["primary"],
            "oomScoreAdj": 0,  # lowering it is refused on these machines; 0 leaves it unchanged
            # Zero: leave this machine's conntrack sysctls as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            # No route_localnet (a machine-wide sysctl): NodePorts on 127.0.0.1 are not needed.
            "iptables": {
                "localhostNodePorts": False,
                # A pod's reply to another pod on the bridge is switched, not routed: only with
                # br_netfilter does conntrack see it and undo the Service's DNAT. Without it,
                # masquerading all Service traffic sends replies through the host instead.
                "masqueradeAll": not bridge_netfilter(),
                "syncPeriod": "30s",
                "minSyncPeriod": "0s",
            },
        }

    def start_kube_proxy(self, env: dict[str, str]) -> None:
        """After the kubelet registered the Node (kube-proxy reads the node's addresses from it)."""
        config = self.root / "kube-proxy.yaml"
        kubeconfig = self.cp.write_kubeconfig(KUBE_PROXY, self.root / "kube-proxy.kubeconfig")
        config.write_text(yaml.safe_dump(self.kube_proxy_config(kubeconfig)))
        argv = [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=2"]
        self.kube_proxy = Component("kube-proxy", argv, self.log_dir / "kube-proxy.log")
        self.kube_proxy.start(env)

        def healthy() -> bool:
            url = f"http://127.0.0.1:{self.healthz_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status) == 200

        def alive() -> None:
            proc = self.kube_proxy.proc if self.kube_proxy else None
            if proc is not None and proc.poll() is not None:
                log = tail(self.log_dir / "kube-proxy.log")
                raise AssertionError(f"kube-proxy exited ({proc.returncode}):\n{log}")

        wait_until(healthy, 60, f"kube-proxy (log {self.log_dir / 'kube-proxy.log'})", check=alive)

    def _take_lock(self, timeout_s: float) -> None:
        """The machine's one pod network. The lock file holds the `ip_forward` value found before it:
        a run killed before stop() left it there, with its bridge and kube-proxy rules, which the
        next holder then removes and whose value it restores."""
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        LOCK_PATH.touch(exist_ok=True)
        fh = open(LOCK_PATH, "r+")  # noqa: SIM115 - held until stop()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fh.close()
                    raise AssertionError(
                        f"another test's pod network holds {LOCK_PATH} for over {timeout_s:.0f}s "
                        "(two kube-proxies would overwrite each other's iptables rules)"
                    ) from None
                time.sleep(1)
        self._lock = fh
        saved = fh.read().strip()
        if saved:
            self._ip_forward = saved
            self._remove_leftovers()
        else:
            self._ip_forward = IP_FORWARD.read_text().strip()
            fh.write(self._ip_forward)
            fh.flush()

    def _kube_proxy_cleanup(self, log_name: str) -> None:
        with open(self.log_dir / log_name, "wb") as log:
            subprocess.run(
                [str(self.bin_dir / "kube-proxy"), "--cleanup", "--v=2"],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=60,
                check=False,
            )

    def _remove_leftovers(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._kube_proxy_cleanup("kube-proxy-cleanup-leftovers.log")
        links = subprocess.run(
            ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True
        ).stdout
        for name in re.findall(r"^\d+: (fmc[0-9a-f]{8})[:@]", links, re.M):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)

    def stop(self) -> None:
        """After the node's containers are gone: kube-proxy and its rules, the bridge, ip_forward."""
        if self.kube_proxy is not None:
            self.kube_proxy.stop(grace_s=10)
            self.kube_proxy = None
            self._kube_proxy_cleanup("kube-proxy-cleanup.log")
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        if self._ip_forward is not None:
            IP_FORWARD.write_text(self._ip_forward + "\n")
            self._ip_forward = None
        if self._lock is not None:
            self._lock.truncate(0)  # stopped cleanly: nothing for the next holder to undo
            self._lock.close()  # releases the flock
            self._lock = None
