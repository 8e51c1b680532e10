"""End-to-end: `helm install` as a new admin or a HAMi user does it (issue 13's "done when").

Three installs of the chart into the real control plane, each with the chart's workloads running as
local processes on simulated MIG-capable nodes (scenario.py):

1. HAMi v2.10's own device config and device-plugin `config.json` (tests/data/hami-v2.10/), passed
   unchanged as `deviceConfig.hamiConfig` / `nodeConfig.hamiConfig`: the install succeeds, each
   component logs its one warning naming the keys flexmig does not use, MIG devices are published and
   the user guide's pod runs with two MIG instances.
2. `flexmig migrate-config` of a v2.9 `knownMigGeometries` ConfigMap, its output given to helm as a
   values file: the profiles published are exactly the migrated allowlist's.
3. Default values (no nodeconfig entry, no device config): MIG devices and the guide's pod.

The webhook is on in 1 and 3 (it is also the chart's default), served by the local controller, because
the guide's pod is a HAMi-style pod; the harness's `controller.nodeSelector` is the only other value set.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from api.constants import DeviceKind, parse_device_name
from controller.kube.rest import request
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, parse_allowlist

from .cluster import ControlPlane
from .plugin_harness import REPO, wait_slices
from .scenario import NodeSpec, Scenario, ScenarioOptions, SimNode
from .test_shim_scenarios import A100_ALLOWED, GUIDE_MEMORY_MIB, guide_pod, results

HAMI = REPO / "tests" / "data" / "hami-v2.10"
UNUSED_WARNING = "device config keys flexmig does not use"
# What flexmig does not use in HAMi's example device config (overwriteEnv, other vendors' sections).
HAMI_UNUSED = ("cambricon", "hygon", "nvidia.overwriteEnv")


class UnlistedNodesScenario(Scenario):
    """The scenario without its `nodeConfig.nodeconfig` value: its nodes have no nodeconfig entry of
    their own (they get the chart's default mode, or whatever `nodeConfig.hamiConfig` says)."""

    def helm_values(self) -> list[str]:
        values = super().helm_values()
        at = next(i for i, v in enumerate(values) if v.startswith("nodeConfig.nodeconfig="))
        assert values[at - 1] == "--set-json"
        return values[: at - 1] + values[at + 1 :]


def _start(sc: Scenario) -> Scenario:
    """Start the scenario and wait for the webhook when it has one (torn down if either fails)."""
    try:
        sc.start()
        if sc.options.webhook:
            sc.wait_webhook()
    except BaseException:
        sc.stop(failed=True)
        raise
    return sc


def _published(sc: Scenario, node: SimNode) -> dict[str, dict[str, Any]]:
    """The node's published devices: name -> attributes."""
    served = wait_slices(sc.api, node.name, lambda s: True)
    return {d["name"]: d["attributes"] for s in served for d in s["spec"].get("devices") or ()}


def _mig_profiles_by_gpu(sc: Scenario, node: SimNode) -> dict[str, set[str]]:
    """The MIG profiles a node publishes, per GPU product name (NVML's name, as the allowlist matches)."""
    out: dict[str, set[str]] = {}
    for attrs in _published(sc, node).values():
        if attrs["type"]["string"] == "mig":
            out.setdefault(attrs["productName"]["string"], set()).add(attrs["profile"]["string"])
    return out


def _config_map_text(sc: Scenario, suffix: str, key: str) -> str:
    path = f"/api/v1/namespaces/{sc.namespace}/configmaps/{sc.release}-{suffix}"
    text: str = request(sc.api, "GET", path)["data"][key]
    return text


def _unused_key_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if UNUSED_WARNING in line]


def _run_guide_pod(sc: Scenario, ns: str, allowed: set[str]) -> None:
    """The user guide's pod (gpu: 2, gpumem: 8000, vgpu-mode: mig) runs with two MIG instances of an
    allowed profile on two different GPUs, and gives them back when deleted."""
    sc.create(ns, "pods", guide_pod(sc, "guide", mode="mig"))
    pod = sc.wait_running(ns, "guide")
    node = sc.nodes[pod["spec"]["nodeName"]]
    devices = [r["device"] for r in results(sc, pod)]
    names = [parse_device_name(d) for d in devices]
    assert len(names) == 2 and {n.kind for n in names} == {DeviceKind.MIG}, names
    assert len({n.gpu_index for n in names}) == 2, f"gpu: 2 means two different GPUs: {names}"
    gis = node.instances()
    assert sorted(g[0] for g in gis) == sorted(n.gpu_index for n in names), gis
    attrs = _published(sc, node)
    profiles = {attrs[d]["profile"]["string"] for d in devices}
    assert profiles <= allowed, profiles
    assert all(int(p.split(".")[1].removesuffix("gb")) * 1024 >= GUIDE_MEMORY_MIB for p in profiles)
    sc.delete_pod(ns, "guide")
    assert node.instances() == []


def test_hami_v210_device_config_and_nodeconfig_install_unchanged(control_plane: ControlPlane) -> None:
    device_config, node_config = HAMI / "device-config.yaml", HAMI / "config.json"
    values = (
        "--set-file", f"deviceConfig.hamiConfig={device_config}",
        "--set-file", f"nodeConfig.hamiConfig={node_config}",
    )  # fmt: skip
    nodes = [NodeSpec("hami-a", ("A100-40GB",) * 2), NodeSpec("hami-b", ("A100-40GB",) * 2)]
    sc = _start(
        UnlistedNodesScenario(control_plane, nodes, ScenarioOptions(webhook=True, extra_values=values))
    )
    failed = True
    try:
        # The ConfigMaps hold the files as written (helm's own checks passed: the install succeeded).
        assert _config_map_text(sc, "device-config", "device-config.yaml").strip() == (
            device_config.read_text().strip()
        )
        assert _config_map_text(sc, "node-config", "config.json").strip() == node_config.read_text().strip()

        # One warning per component (plugins and controller) naming every key flexmig does not use.
        assert sc.controller is not None
        logs = {n.name: n.plugin.log_text() for n in sc.nodes.values() if n.plugin is not None}
        logs["controller"] = sc.controller.log_text()
        for who, log in logs.items():
            found = _unused_key_warnings(log)
            assert len(found) == 1, f"{who}: {found or log[-3000:]}"
            assert all(k in found[0] for k in HAMI_UNUSED), f"{who}: {found[0]}"

        # MIG-NODE-A (the example's only entry) is not one of ours: our nodes get the default mode,
        # which gives their A100s dynamic MIG with the example's A100-40GB allowlist.
        for node in sc.nodes.values():
            assert _mig_profiles_by_gpu(sc, node) == {"NVIDIA A100-SXM4-40GB": A100_ALLOWED}

        _run_guide_pod(sc, sc.test_namespace("hami-guide"), A100_ALLOWED)
        failed = False
    finally:
        sc.stop(failed=failed)


def test_migrated_known_mig_geometries_install_and_publish_the_allowlist(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    source = HAMI / "known-mig-geometries.yaml"
    out = tmp_path / "migrated-values.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "flexmig.cli", "migrate-config", str(source), "-o", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    migrated: Mapping[str, Any] = yaml.safe_load(out.read_text())
    allowlist = parse_allowlist(migrated["deviceConfig"]["migProfileAllowlist"])
    a100_80 = "NVIDIA A100-SXM4-80GB"
    # The v2.9 geometries of the A100-80GB allow no 3g.40gb: the migrated list differs from the chart's
    # default there, so what the node publishes shows which of the two was installed.
    migrated_80 = set(allowlist.profiles_for(a100_80) or ())
    assert migrated_80 == {"1g.10gb", "2g.20gb", "7g.80gb"}, migrated_80
    assert migrated_80 != set(DEFAULT_MIG_PROFILE_ALLOWLIST.profiles_for(a100_80) or ())

    nodes = [NodeSpec("migrated", ("A100-80GB", "A100-40GB"))]
    options = ScenarioOptions(extra_values=("-f", str(out)), start_controller=False)
    sc = _start(Scenario(control_plane, nodes, options))
    failed = True
    try:
        [node] = sc.nodes.values()
        published = _mig_profiles_by_gpu(sc, node)
        wanted = {name: set(allowlist.profiles_for(name) or ()) for name in published}
        assert set(published) == {a100_80, "NVIDIA A100-SXM4-40GB"}
        assert published == wanted
        assert not _unused_key_warnings(node.plugin.log_text() if node.plugin else "")
        failed = False
    finally:
        sc.stop(failed=failed)


def test_default_values_publish_mig_and_run_the_guide_pod(control_plane: ControlPlane) -> None:
    # Two MIG-capable nodes, no nodeconfig entry, no device config: only the chart's defaults decide.
    nodes = [NodeSpec("dflt-a100", ("A100-40GB",) * 2), NodeSpec("dflt-h100", ("H100-80GB",) * 2)]
    sc = _start(UnlistedNodesScenario(control_plane, nodes, ScenarioOptions(webhook=True)))
    failed = True
    try:
        assert yaml.safe_load(_config_map_text(sc, "node-config", "config.json")) == {"nodeconfig": []}
        expected = {
            "NVIDIA A100-SXM4-40GB": A100_ALLOWED,
            "NVIDIA H100 80GB HBM3": {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"},
        }
        for node in sc.nodes.values():
            published = _mig_profiles_by_gpu(sc, node)
            assert len(published) == 1 and published == {k: expected[k] for k in published}, published
            names = list(_published(sc, node))
            assert not [n for n in names if n.endswith("-shared")], names  # MIG, not HAMi-core shares

        allowed = set().union(*expected.values())
        _run_guide_pod(sc, sc.test_namespace("dflt-guide"), allowed)
        failed = False
    finally:
        sc.stop(failed=failed)
