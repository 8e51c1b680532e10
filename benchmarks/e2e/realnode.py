"""The real-node mode (`--real-node`): one node run by a real kubelet + containerd + runc.

The node is tests/e2e/realnode's `RealNodeScenario` (what runs there and what is stood in is listed in
its module docstring): the plugin registered through the kubelet's plugin watcher, the kubelet calling
NodePrepareResources itself and containerd injecting the plugin's CDI devices into real containers.
Here its plugin runs on the simulator the benchmark asks for (`--sim`), and the node's own processes
are measured too: CPU of the kubelet, of containerd and of the node's runc shims (children included:
the `runc create/start` each shim runs), and the plugin's own time per prepared claim (its
`flexmig_node_prepare_duration_seconds` histogram), to split the prepare stage into the plugin's part
and the kubelet's + runtime's.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from controller.kube.rest import request
from tests.e2e.plugin_harness import PluginProcess, wait_slices
from tests.e2e.realnode.build import NodeBuildError, build_node_binaries
from tests.e2e.realnode.node import NodeBinaries
from tests.e2e.realnode.scenario import RealNodeScenario, RealSimNode
from tests.e2e.scenario import SCENARIO_LABEL, Scenario, SimNode

HOSTNAME_LABEL = "kubernetes.io/hostname"  # the kubelet sets it to the node's name; RealNode adds none
# Pods a kubelet runs by default (maxPods), less the plugin's anchor pod.
MAX_PODS = 109
PREPARE_METRIC = "flexmig_node_prepare_duration_seconds"
NODE_BINARIES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "busybox")
# The kubelet's event when PrepareDynamicResources fails; it retries only at its next periodic sync
# of the pod (1 to 1.5 minutes: kubernetes/kubernetes#139836).
PREPARE_FAILED = "FailedPrepareDynamicResources"


class BenchRealNodeScenario(RealNodeScenario):
    """`RealNodeScenario` whose plugins run on `options.nvml_backend` (the benchmark's `--sim`)."""

    def start_plugin(self, node: RealSimNode, env: dict[str, str] | None = None) -> PluginProcess:
        node.nd.nvml_backend = self.options.nvml_backend
        return super().start_plugin(node, env)


def node_binaries() -> NodeBinaries:
    """The real node's binaries (built once, cached under ~/.cache/flexmig), or a one-line exit."""
    if os.geteuid() != 0:
        raise SystemExit("--real-node: needs root (mknod, containerd, runc, kubelet); run as root")
    try:
        bins = NodeBinaries(build_node_binaries())
        for name in NODE_BINARIES:
            bins[name]  # FileNotFoundError (an OSError) when missing, e.g. a wrong FLEXMIG_NODE_BIN
        return bins
    except (NodeBuildError, OSError, subprocess.SubprocessError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise SystemExit(f"--real-node: the node binaries could not be built: {first}") from None


def nodes_of(sc: Scenario) -> list[SimNode] | list[RealSimNode]:
    """The scenario's nodes: stand-ins, or the real nodes of a `RealNodeScenario`."""
    if isinstance(sc, RealNodeScenario):
        return list(sc.real_nodes.values())
    return list(sc.nodes.values())


def node_selector(sc: Scenario) -> dict[str, str]:
    """Where a burst's pods go: the real node by its hostname label, or the scenario's stand-ins."""
    if isinstance(sc, RealNodeScenario):
        [name] = sc.real_nodes  # the mode runs one real node
        return {HOSTNAME_LABEL: name}
    return {SCENARIO_LABEL: sc.suffix}


def restart_plugins(sc: BenchRealNodeScenario) -> None:
    """Restart every real node's plugin (a `sim-memory:` plugin reads latencies when it starts) and
    wait until the kubelet has registered it again and its slices are published."""
    for node in sc.real_nodes.values():
        if node.plugin is not None and node.plugin.proc.poll() is None:
            code = node.plugin.stop()
            if code != 0:
                raise RuntimeError(f"plugin on {node.name} exited {code}:\n{node.plugin.log_text()[-3000:]}")
        sc.start_plugin(node)
        wait_slices(sc.api, node.name, lambda s: True, timeout_s=60)


def cpu_with_children(stat: str) -> float:
    """utime + stime + cutime + cstime of a /proc/<pid>/stat line, in clock ticks."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return float(sum(int(x) for x in fields[11:15]))


def _cpu_s(pid: int) -> float:
    try:
        return cpu_with_children(Path(f"/proc/{pid}/stat").read_text()) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _shim_pids(sock: Path) -> list[int]:
    """The containerd-shim-runc-v2 processes serving the containerd at `sock`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(sock).encode() in argv:
            found.append(int(d.name))
    return found


def node_cpu(sc: Scenario) -> dict[str, float]:
    """CPU seconds so far of the real nodes' kubelets, containerds and shims (all nodes together);
    empty for stand-ins. A shim that exited since is not counted: read before and after a burst,
    before its pods are deleted."""
    if not isinstance(sc, RealNodeScenario):
        return {}
    total = {"kubelet": 0.0, "containerd": 0.0, "shims": 0.0}
    for node in sc.real_nodes.values():
        for key, comp in (("kubelet", node.real.kubelet), ("containerd", node.real.containerd)):
            if comp is not None and comp.proc is not None:
                total[key] += _cpu_s(comp.proc.pid)
        total["shims"] += sum(_cpu_s(pid) for pid in _shim_pids(node.real.sock))
    return total


def prepare_totals(metrics: str) -> tuple[float, int]:
    """(seconds, claims) of the plugin's prepare histogram in a /metrics text, all results together."""
    seconds, count = 0.0, 0
    for m in re.finditer(rf"^{PREPARE_METRIC}_(sum|count)(?:{{[^}}]*}})? (\S+)$", metrics, re.M):
        if m.group(1) == "sum":
            seconds += float(m.group(2))
        else:
            count += int(float(m.group(2)))
    return seconds, count


def plugin_prepare(sc: Scenario) -> tuple[float, int]:
    """`prepare_totals` of every real node's plugin now; (0, 0) for stand-ins."""
    if not isinstance(sc, RealNodeScenario):
        return 0.0, 0
    seconds, count = 0.0, 0
    for node in sc.real_nodes.values():
        if node.plugin is not None and node.plugin.metrics_port is not None:
            s, c = prepare_totals(node.metrics())
            seconds, count = seconds + s, count + c
    return seconds, count


def failed_prepares(sc: Scenario, ns: str) -> dict[str, str]:
    """Pod -> the kubelet's first FailedPrepareDynamicResources message, in namespace `ns` (real node
    only; {} for stand-ins, which post no such event)."""
    if not isinstance(sc, RealNodeScenario):
        return {}
    query = [("fieldSelector", f"reason={PREPARE_FAILED}")]
    events = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/events", query=query).get("items", [])
    found: dict[str, str] = {}
    for e in sorted(events, key=lambda e: str(e.get("firstTimestamp") or e.get("eventTime") or "")):
        found.setdefault(str((e.get("involvedObject") or {}).get("name")), str(e.get("message", "")))
    return found
