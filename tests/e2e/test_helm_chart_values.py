"""The chart values real clusters need (issue 22), checked with the real `helm template`, no API server.

- hostNetwork, per component, with the DNS policy that keeps Services resolvable;
- tolerations: the plugin's defaults reach GPU nodes and NotReady nodes without repeating what the
  DaemonSet controller adds; extra tolerations per component;
- node selection: a node with the GPU Operator's label or with Node Feature Discovery's is selected
  (evaluated here as the scheduler does, on the rendered affinity), [] selects every node;
- metrics: no fixed NodePort by default, the port is a value;
- host roots vs the plugin's view: every host root the plugin is told about is mounted from that
  host path at the container path it is told to read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from .chart_render import CHART, KUBE_VERSION, one, render, run_helm
from .test_helm_chart import container, parse_cli

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
GPU_OPERATOR = {"nvidia.com/gpu.present": "true"}
# What the DaemonSet controller adds to every daemon pod itself (pkg/controller/daemon/util).
DAEMONSET_ADDED = {
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
}


def pod_spec(docs: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = one(docs, kind)["spec"]["template"]["spec"]
    return spec


def selects(spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """The pod's nodeSelector and required node affinity admit a node with these labels (In/Exists:
    all the chart's defaults use)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True

    def matches(expr: Mapping[str, Any]) -> bool:
        if expr["operator"] == "In":
            return labels.get(expr["key"]) in expr["values"]
        assert expr["operator"] == "Exists", expr
        return expr["key"] in labels

    return any(
        all(matches(e) for e in t.get("matchExpressions") or ()) for t in required["nodeSelectorTerms"]
    )


def test_host_network_is_off_by_default_and_per_component(helm_bin: Path, tmp_path: Path) -> None:
    docs = render(helm_bin, tmp_path)
    for kind in ("Deployment", "DaemonSet"):
        spec = pod_spec(docs, kind)
        assert "hostNetwork" not in spec and "dnsPolicy" not in spec
    plugin_only = render(helm_bin, tmp_path, "--set", "kubeletPlugin.hostNetwork=true")
    assert pod_spec(plugin_only, "DaemonSet")["hostNetwork"] is True
    assert "hostNetwork" not in pod_spec(plugin_only, "Deployment")
    both = render(
        helm_bin,
        tmp_path,
        *("--set", "kubeletPlugin.hostNetwork=true", "--set", "controller.hostNetwork=true"),
        *("--set", "kubeletPlugin.metrics.port=39992"),
    )
    for kind in ("Deployment", "DaemonSet"):
        spec = pod_spec(both, kind)
        assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    # The port that binds on the node is the value, everywhere it appears.
    ds = one(both, "DaemonSet")
    plugin = container(ds, "plugin")
    assert parse_cli(plugin["args"], {"NODE_NAME": "n"}).metrics_port == "39992"
    assert {"name": "metrics", "containerPort": 39992, "protocol": "TCP"} in plugin["ports"]
    assert one(both, "Service", "-kubelet-plugin-metrics")["spec"]["ports"][0]["port"] == 39992


def test_tolerations_reach_gpu_and_not_ready_nodes_and_extras_are_per_component(
    helm_bin: Path, tmp_path: Path
) -> None:
    docs = render(helm_bin, tmp_path)
    plugin = pod_spec(docs, "DaemonSet")["tolerations"]
    assert {(t["key"], t["effect"]) for t in plugin} == {
        ("nvidia.com/gpu", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoSchedule"),  # a node whose driver or CNI is still coming up
    }
    assert not {(t["key"], t["effect"]) for t in plugin} & DAEMONSET_ADDED
    assert "tolerations" not in pod_spec(docs, "Deployment")

    control_plane = (
        '{"key":"node-role.kubernetes.io/control-plane","operator":"Exists","effect":"NoSchedule"}'
    )
    infra = '{"key":"dedicated","operator":"Equal","value":"gpu","effect":"NoSchedule"}'
    extra = render(
        helm_bin,
        tmp_path,
        *("--set-json", f"controller.extraTolerations=[{control_plane}]"),
        *("--set-json", f"kubeletPlugin.extraTolerations=[{infra}]"),
    )
    ctrl = pod_spec(extra, "Deployment")["tolerations"]
    assert [t["key"] for t in ctrl] == ["node-role.kubernetes.io/control-plane"]
    plugin = pod_spec(extra, "DaemonSet")["tolerations"]  # appended: the defaults stay
    assert [t["key"] for t in plugin] == ["nvidia.com/gpu", "node.kubernetes.io/not-ready", "dedicated"]


def test_gpu_nodes_are_selected_by_either_label_or_every_node(helm_bin: Path, tmp_path: Path) -> None:
    spec = pod_spec(render(helm_bin, tmp_path), "DaemonSet")
    assert selects(spec, GPU_OPERATOR) and selects(spec, NFD) and selects(spec, {**NFD, **GPU_OPERATOR})
    assert not selects(spec, {"kubernetes.io/os": "linux"})
    assert not selects(spec, {"nvidia.com/gpu.present": "false"})

    everywhere = pod_spec(
        render(helm_bin, tmp_path, "--set-json", "kubeletPlugin.gpuNodeLabels=[]"), "DaemonSet"
    )
    assert "affinity" not in everywhere and selects(everywhere, {})

    own = '[{"key":"example.com/accelerator","value":"h100"}]'
    custom = pod_spec(
        render(helm_bin, tmp_path, "--set-json", f"kubeletPlugin.gpuNodeLabels={own}"), "DaemonSet"
    )
    assert selects(custom, {"example.com/accelerator": "h100"}) and not selects(custom, GPU_OPERATOR)

    # An affinity of one's own replaces the label affinity; nodeSelector narrows either.
    narrowed = pod_spec(
        render(helm_bin, tmp_path, "--set", "kubeletPlugin.nodeSelector.pool=gpu"), "DaemonSet"
    )
    assert selects(narrowed, {**NFD, "pool": "gpu"}) and not selects(narrowed, NFD)


def test_no_fixed_node_port_unless_asked(helm_bin: Path, tmp_path: Path) -> None:
    node_port = render(
        helm_bin,
        tmp_path,
        *("--set", "controller.metrics.service.type=NodePort"),
        *("--set", "kubeletPlugin.metrics.service.type=NodePort"),
    )
    for suffix in ("-controller-metrics", "-kubelet-plugin-metrics"):
        svc = one(node_port, "Service", suffix)["spec"]
        assert svc["type"] == "NodePort" and "nodePort" not in svc["ports"][0]  # the API server picks one
    proc = run_helm(
        helm_bin,
        tmp_path,
        *("template", "x", str(CHART), "--kube-version", KUBE_VERSION),
        *("--set", "kubeletPlugin.metrics.service.nodePort=31992"),
    )
    assert proc.returncode != 0
    assert (
        "kubeletPlugin.metrics.service.nodePort is 31992 but kubeletPlugin.metrics.service.type is ClusterIP"
        in proc.stderr
    ), proc.stderr


def _mounted_from(ds: Mapping[str, Any], container_path: str) -> str:
    """The host path the plugin container sees at `container_path` (through its volume mounts)."""
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    best = max(
        (
            m
            for m in container(ds, "plugin")["volumeMounts"]
            if (container_path + "/").startswith(m["mountPath"].rstrip("/") + "/")
        ),
        key=lambda m: len(m["mountPath"]),
    )
    host = volumes[best["name"]]["hostPath"]["path"]
    rest = posixpath.relpath(container_path, best["mountPath"])
    return posixpath.normpath(posixpath.join(host, rest))


@pytest.mark.parametrize(
    "values",
    [
        (),  # the defaults: the host's driver at /driver-root, the hook's directory at /cdi-hook
        (  # stand-in roots at host paths other than /, as a test node or a driver container has them
            *("--set", "kubeletPlugin.nvmlBackend=sim:/var/lib/flexmig-sim/state.json"),
            *("--set", "kubeletPlugin.nvml.driverRoot=/srv/standin/driver"),
            *("--set", "kubeletPlugin.devRoot=/srv/standin/devroot"),
            *("--set", "kubeletPlugin.procRoot=/srv/standin/proc"),
            *("--set", "kubeletPlugin.cdiHookPath=/srv/standin/bin/nvidia-cdi-hook"),
        ),
    ],
    ids=["defaults", "stand-ins"],
)
def test_each_host_root_is_mounted_where_the_plugin_is_told_to_look(
    helm_bin: Path, tmp_path: Path, values: tuple[str, ...]
) -> None:
    ds = one(render(helm_bin, tmp_path, *values), "DaemonSet")
    plugin = container(ds, "plugin")
    args = parse_cli(plugin["args"], {"NODE_NAME": "n"})
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert mounts["driver-root"]["readOnly"] is True  # the main container, not only the init one
    assert _mounted_from(ds, args.container_driver_root) == args.driver_root
    assert _mounted_from(ds, args.container_nvidia_cdi_hook_path) == args.nvidia_cdi_hook_path
    assert mounts["cdi-hook"]["readOnly"] is True
    if values:
        assert _mounted_from(ds, args.container_dev_root + "/dev") == "/srv/standin/devroot/dev"
        assert args.dev_root == "/srv/standin/devroot"
        assert _mounted_from(ds, args.proc_root) == "/srv/standin/proc"
        assert "initContainers" not in ds["spec"]["template"]["spec"]  # no NVML to load with the simulator
    else:
        assert ds["spec"]["template"]["spec"]["initContainers"][0]["name"] == "locate-nvml"
        assert args.dev_root is None and args.container_dev_root is None


def test_no_driver_root_means_no_mount_and_no_flags(helm_bin: Path, tmp_path: Path) -> None:
    ds = one(
        render(
            helm_bin,
            tmp_path,
            "--set",
            "kubeletPlugin.nvml.driverRoot=",
            "--set",
            "kubeletPlugin.cdiHookPath=",
        ),
        "DaemonSet",
    )
    args = parse_cli(container(ds, "plugin")["args"], {"NODE_NAME": "n"})
    assert args.driver_root is None and args.container_driver_root is None
    assert args.nvidia_cdi_hook_path is None
    assert not {"driver-root", "cdi-hook"} & {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        (("--set-json", 'kubeletPlugin.extraTolerations=[{"key":"a","operator":"Bogus"}]'), "/kubeletPlugin/extraTolerations/0/operator"),
        (("--set-json", 'controller.tolerations=[{"key":"a","effect":"NoShedule"}]'), "/controller/tolerations/0/effect"),
        (("--set-json", 'kubeletPlugin.gpuNodeLabels=[{"key":"nvidia.com/gpu.present"}]'), "/kubeletPlugin/gpuNodeLabels/0"),
        (("--set", "kubeletPlugin.devRoot=srv/dev"), "/kubeletPlugin/devRoot"),
        (("--set", "kubeletPlugin.cdiHookPath=nvidia-cdi-hook"), "/kubeletPlugin/cdiHookPath"),
        (("--set", "controller.hostNetwork=yes"), "/controller/hostNetwork"),
    ],
)  # fmt: skip
def test_schema_rejects_bad_new_values(
    helm_bin: Path, tmp_path: Path, override: tuple[str, ...], field: str
) -> None:
    proc = run_helm(
        helm_bin, tmp_path, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *override
    )
    assert proc.returncode != 0, f"{override} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr and field in proc.stderr, (
        proc.stderr
    )
