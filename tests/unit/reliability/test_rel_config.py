"""Bad node-agent configuration: the plugin refuses to start with one line naming the flag (and its
environment variable), the file, the entry and field, and the allowed values; it reads files and writes
nothing (no directory, socket or checkpoint, the GPUs untouched). A well-formed profile name the GPU does
not offer is not an error (one allowlist serves many models) but a warning naming the model and what it
offers. Rows N1-N16 of docs/reliability.md."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import yaml

from controller.shim import ShimConfigError, parse_shim_defaults
from driver.catalog.allowlist import parse_allowlist
from driver.catalog.discover import discover_all
from driver.catalog.types import CatalogWarningKind
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim
from flexmig.migrateconfig import migrate
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.config import ConfigError, add_flags, load_config
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

REPO = Path(__file__).resolve().parents[3]
NODE = "node-a"


class Node:
    """A node's flags and files in a temp dir; after a refused start nothing may exist but the inputs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        boot = tmp / "boot_id"
        boot.write_text("boot-1\n")
        self.sim = tmp / "sim.json"
        init_sim_state(self.sim, [SimGpuSpec("A100-40GB")])
        self.sim_before = self.sim.read_bytes()
        self.flags = {
            "node-name": NODE,
            "boot-id-path": str(boot),
            "nvml": f"sim:{self.sim}",
            "registry-dir": str(tmp / "registry"),
            "plugins-dir": str(tmp / "plugins"),
            "cdi-dir": str(tmp / "cdi"),
            "checkpoint-path": str(tmp / "state" / "checkpoint.json"),
            "metrics-port": "-1",
        }
        self.inputs = {p.name for p in tmp.iterdir()}  # boot_id, the simulator state and its lock

    def file(self, name: str, text: str) -> str:
        (self.tmp / name).write_text(text)
        self.inputs.add(name)
        return str(self.tmp / name)

    def refused(self, *fragments: str, **flags: str) -> str:
        parser = argparse.ArgumentParser()
        add_flags(parser)
        merged = {**self.flags, **{k.replace("_", "-"): v for k, v in flags.items()}}
        args = parser.parse_args([x for k, v in merged.items() for x in (f"--{k}", v)])
        with pytest.raises(ConfigError) as err:
            load_config(args, env={})
        message = str(err.value)
        for fragment in fragments:
            assert fragment in message, (fragment, message)
        assert {p.name for p in self.tmp.iterdir()} == self.inputs  # nothing created
        assert self.sim.read_bytes() == self.sim_before  # no GPU state touched
        return message


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_n1_allowlist_profiles_given_as_a_string_is_refused(node: Node) -> None:
    path = node.file(
        "devices.yaml",
        "nvidia:\n  migProfileAllowlist:\n  - models: [A100-SXM4-40GB]\n    profiles: 1g.5gb\n",
    )
    node.refused(
        "--device-config (env FLEXMIG_DEVICE_CONFIG)",
        path,
        "migProfileAllowlist[0].profiles: expected a list of strings, got str",
        device_config=path,
    )


def test_n2_allowlist_profile_name_typo_is_refused_with_the_form(node: Node) -> None:
    path = node.file(
        "devices.yaml", "migProfileAllowlist:\n- models: [A100-SXM4-40GB]\n  profiles: [1g.5gb, 2g.10g]\n"
    )
    node.refused(
        "migProfileAllowlist[0].profiles[1]: '2g.10g' is not a MIG profile name",
        "<G>g.<GB>gb",
        "e.g. 1g.10gb",
        device_config=path,
    )


def test_n3_allowlist_unknown_field_is_refused_with_the_allowed_fields(node: Node) -> None:
    path = node.file(
        "devices.yaml", "migProfileAllowlist:\n- models: [A100-SXM4-40GB]\n  profile: [1g.5gb]\n"
    )
    node.refused(
        "migProfileAllowlist[0]: unknown field(s) profile",
        "allowed fields: models, profiles",
        device_config=path,
    )


def test_n4_allowlist_that_is_not_yaml_is_refused(node: Node) -> None:
    path = node.file("devices.yaml", "migProfileAllowlist: [models: [A100\n")
    node.refused("--device-config", "is neither valid YAML nor JSON", device_config=path)


def test_n5_a_model_in_two_allowlist_entries_is_refused(node: Node) -> None:
    text = "migProfileAllowlist:\n- {models: [A100-SXM4-40GB], profiles: [1g.5gb]}\n- {models: [A100-40GB], profiles: [7g.40gb]}\n"
    path = node.file("devices.yaml", text)
    node.refused("migProfileAllowlist[1].models: 'A100-40GB' names the same GPU model", device_config=path)


def test_n6_an_unknown_profile_name_is_a_warning_naming_what_the_model_offers(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    init_sim_state(state, [SimGpuSpec("A100-40GB")])
    allow = parse_allowlist([{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "3g.25gb"]}])
    with open_sim(state) as nvml, structlog.testing.capture_logs() as logs:
        (catalog,) = discover_all(nvml, allow)
    (warning,) = catalog.warnings
    assert warning.kind is CatalogWarningKind.PROFILE_NOT_OFFERED and warning.profile == "3g.25gb"
    assert "allowlisted profile 3g.25gb is not offered by A100-40GB; it offers: 1g.5gb" in warning.message
    assert "7g.40gb" in warning.message
    (logged,) = [e for e in logs if e["log_level"] == "warning"]
    assert logged["event"] == warning.message and logged["model"] == "A100-40GB"
    # What the allowlist names and the GPU offers is still published; the unknown name changes nothing.
    assert [p.name for p in catalog.profiles] == ["1g.5gb"]
    built = build_node_slices([catalog], NODE, 1, NodeConfig(NODE, OperatingMode.MIG), {0: True})
    names = [d["name"] for s in built.slices for d in s.body["spec"].get("devices") or []]
    assert names and all("1g5gb" in n for n in names if "-mig-" in n)
    assert SimAdmin(state).snapshot().gpus[0].gpu_instances == ()


def test_n7_a_bad_operating_mode_flag_is_refused_with_the_modes(node: Node) -> None:
    node.refused(
        "--operating-mode (env FLEXMIG_OPERATING_MODE): 'MIG'",
        "allowed:",
        "hami-core, mig, mps",
        operating_mode="MIG",
    )


def test_n8_a_bad_operatingmode_in_nodeconfig_is_refused_naming_the_entry(node: Node) -> None:
    path = node.file("config.json", '{"nodeconfig": [{"name": "node-b", "operatingmode": "vgpu"}]}')
    node.refused(
        "--node-config (env FLEXMIG_NODE_CONFIG)",
        "nodeconfig[0] (node 'node-b').operatingmode 'vgpu' is not one of:",
        "hami-core, mig, mps",
        node_config=path,
    )


def test_n9_filterdevices_with_a_malformed_uuid_is_refused(node: Node) -> None:
    path = node.file(
        "config.json", f'{{"nodeconfig": [{{"name": "{NODE}", "filterdevices": {{"uuid": ["GPU-1234"]}}}}]}}'
    )
    node.refused(
        f"nodeconfig[0] (node '{NODE}').filterdevices.uuid[0]: 'GPU-1234' is not a GPU UUID",
        "allowed: 'GPU-' and 32 hex digits as 8-4-4-4-12",
        node_config=path,
    )


def test_n10_filterdevices_with_a_misspelt_key_is_refused(node: Node) -> None:
    path = node.file(
        "config.json", f'{{"nodeconfig": [{{"name": "{NODE}", "filterdevices": {{"uuids": []}}}}]}}'
    )
    node.refused("filterdevices has unknown keys ['uuids']; allowed: uuid, index", node_config=path)


@pytest.mark.parametrize("value", ["0", "-3", "ten", "2.5"])
def test_n11_a_bad_device_split_count_flag_is_refused(node: Node, value: str) -> None:
    node.refused(
        f"--device-split-count (env FLEXMIG_DEVICE_SPLIT_COUNT): {value!r}",
        "allowed: an integer >= 1",
        device_split_count=value,
    )


@pytest.mark.parametrize("value", ["0", '"10"', "true", "2.5"])
def test_n12_a_bad_devicesplitcount_in_nodeconfig_is_refused(node: Node, value: str) -> None:
    path = node.file("config.json", f'{{"nodeconfig": [{{"name": "{NODE}", "deviceSplitCount": {value}}}]}}')
    node.refused(
        f"nodeconfig[0] (node '{NODE}').deviceSplitCount",
        "is not a valid device split count",
        "allowed: an integer >= 1",
        node_config=path,
    )


def test_n13_the_command_exits_2_with_one_line_and_creates_nothing(node: Node) -> None:
    path = node.file(
        "devices.yaml", "migProfileAllowlist:\n- models: [A100-SXM4-40GB]\n  profiles: [2g.10g]\n"
    )
    argv = [x for k, v in {**node.flags, "device-config": path}.items() for x in (f"--{k}", v)]
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.cli", "kubeletplugin", *argv],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "'2g.10g' is not a MIG profile name" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert {p.name for p in node.tmp.iterdir()} == node.inputs
    assert node.sim.read_bytes() == node.sim_before


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"nvidia": {"defaultMemory": "8000"}}, "nvidia.defaultMemory: must be an integer, got '8000'"),
        ({"nvidia": {"defaultCores": 150}}, "nvidia.defaultCores: 150 is out of range (allowed: 0..100)"),
        ({"nvidia": {"defaultGPUNum": True}}, "nvidia.defaultGPUNum: must be an integer, got True"),
    ],
    ids=["defaultMemory-string", "defaultCores-150", "defaultGPUNum-bool"],
)
def test_n14_a_bad_shim_device_config_default_is_refused(doc: dict[str, object], fragment: str) -> None:
    with pytest.raises(ShimConfigError) as err:
        parse_shim_defaults(doc)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (
            {"container-driver-root": "/nonexistent/driver-root"},
            ("--container-driver-root (env FLEXMIG_CONTAINER_DRIVER_ROOT): '/nonexistent/driver-root' is"
             " not a directory; allowed: an existing directory where this process sees --driver-root",),
        ),
        (
            {"container-dev-root": "dev-root"},
            ("--container-dev-root (env FLEXMIG_CONTAINER_DEV_ROOT): 'dev-root' must be an absolute path",),
        ),
        (
            {"driver-root": "/nonexistent/driver"},
            ("--driver-root (env FLEXMIG_DRIVER_ROOT): '/nonexistent/driver' is not a directory here",
             "--container-driver-root"),
        ),
        (
            {"container-nvidia-cdi-hook-path": "nvidia-cdi-hook"},
            ("--container-nvidia-cdi-hook-path", "must be an absolute path"),
        ),
    ],
    ids=["container-driver-root-missing", "container-dev-root-relative", "driver-root-missing", "hook-relative"],
)  # fmt: skip
def test_n15_a_bad_host_or_container_root_is_refused(
    node: Node, flags: dict[str, str], fragments: tuple[str, ...]
) -> None:
    node.refused(*fragments, **{k.replace("-", "_"): v for k, v in flags.items()})


V29 = REPO / "tests" / "data" / "hami-v2.9" / "device-config.yaml"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (V29.read_text(), "nvidia.knownMigGeometries (HAMi v2.9's whole-GPU templates)"),
        (
            "nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    allowedGeometries: [[{name: 1g.6gb}]]\n",
            "nvidia.migProfileAllowlist[0] has allowedGeometries",
        ),
        (
            "nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    profiles: [{name: 1g.6gb, count: 4}]\n",
            "nvidia.migProfileAllowlist[0].profiles holds {name, memory, count} templates",
        ),
    ],
    ids=["v2.9-configmap", "geometries-under-allowlist", "templates-as-profiles"],
)
def test_n16_a_hami_v29_device_config_names_the_cause_and_migrate_config(
    node: Node, text: str, fragment: str
) -> None:
    path = node.file("devices.yaml", text)
    node.refused(
        "--device-config (env FLEXMIG_DEVICE_CONFIG)",
        "this looks like a HAMi device config of another version",
        fragment,
        f"flexmig migrate-config {path} -o values.yaml",
        device_config=path,
    )


def test_n16_through_the_command_and_the_migration_it_names_is_complete(node: Node) -> None:
    path = node.file("devices.yaml", V29.read_text())
    argv = [x for k, v in {**node.flags, "device-config": path}.items() for x in (f"--{k}", v)]
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.cli", "kubeletplugin", *argv],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "flexmig migrate-config" in proc.stderr
    assert {p.name for p in node.tmp.iterdir()} == node.inputs
    # What the message says to do works on this input: nothing dropped, and the plugin takes the result.
    migrated = migrate(yaml.safe_load(V29.read_text()))
    assert migrated.unmapped == []
    fixed = node.file(
        "migrated.yaml",
        yaml.safe_dump(
            {"nvidia": {"migProfileAllowlist": migrated.values["deviceConfig"]["migProfileAllowlist"]}}
        ),
    )
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(
        [x for k, v in {**node.flags, "device-config": fixed}.items() for x in (f"--{k}", v)]
    )
    assert load_config(args, env={}).allowlist
