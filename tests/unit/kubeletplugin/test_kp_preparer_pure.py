"""Pure parts of the node core: status/annotation shaping, config validation, crashpoints, slice hashing."""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from api.constants import DRIVER_NAME
from driver.migannotation import decode_mig_allocations, encode_mig_allocations
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.kube.claimstatus import annotation_records, device_status_entries, pod_mig_devices
from kubeletplugin.publish.publisher import content_hash
from kubeletplugin.publish.slices import NodeSlices, PublishedSlice
from kubeletplugin.settings.config import ConfigError, UnenforcedShares, add_flags, load_config
from kubeletplugin.settings.nodeconfig import OperatingMode

REPO = Path(__file__).resolve().parents[3]


def _mig(name: str, start: int, request: str = "gpu", gi: int = 1) -> PreparedDeviceRecord:
    return PreparedDeviceRecord(
        request_names=(request,),
        pool="n",
        device_name=name,
        gpu_index=0,
        gpu_uuid="GPU-aaaa",
        profile="1g.5gb",
        gi_profile_id=19,
        placement_start=start,
        placement_size=1,
        gi_id=gi,
        ci_id=0,
        mig_uuid=f"MIG-{gi}",
        created_gi=True,
        created_ci=True,
    )


def _claim(uid: str, name: str, *devices: PreparedDeviceRecord) -> ClaimCheckpoint:
    return ClaimCheckpoint(uid, "ns", name, ClaimState.PREPARE_COMPLETED, devices)


def test_device_status_entries_shape() -> None:
    whole = PreparedDeviceRecord(("w",), "n", "gpu-1", 1, "GPU-b")
    entries = device_status_entries(DRIVER_NAME, [_mig("gpu-0-mig-1g5gb-19-3", 3, gi=7), whole])
    assert entries[0] == {
        "driver": DRIVER_NAME,
        "pool": "n",
        "device": "gpu-0-mig-1g5gb-19-3",
        "data": {
            "migUUID": "MIG-7",
            "gpuInstanceID": 7,
            "computeInstanceID": 0,
            "parentUUID": "GPU-aaaa",
            "profile": "1g.5gb",
            "placement": {"start": 3, "size": 1},
        },
    }
    assert entries[1]["data"] == {"uuid": "GPU-b"}


def test_container_and_device_indexes_init_first_and_request_filter() -> None:
    pod = {
        "spec": {
            "resourceClaims": [{"name": "a", "resourceClaimName": "claim-a"}, {"name": "b"}],
            "initContainers": [{"name": "init", "resources": {"claims": [{"name": "b"}]}}],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "a", "request": "two"}, {"name": "b"}]}},
                {"name": "side"},
            ],
        },
        # b comes from a template: its generated name is only in the status.
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "claim-b-xyz"}]},
    }
    a = _claim("ua", "claim-a", _mig("d1", 0, "one", 1), _mig("d2", 1, "two/sub", 2), _mig("d3", 2, "two", 3))
    b = _claim("ub", "claim-b-xyz", _mig("d4", 4, "gpu", 4))
    devices = pod_mig_devices(pod, {"claim-a": a, "claim-b-xyz": b})
    got = [(d.container_index, d.container_name, d.device_index, d.device.device_name) for d in devices]
    assert got == [(0, "init", 0, "d4"), (1, "main", 0, "d2"), (1, "main", 1, "d3"), (1, "main", 2, "d4")]
    records = annotation_records(devices)
    assert decode_mig_allocations(encode_mig_allocations(records)) == records


def test_unrealised_and_whole_devices_are_not_mirrored() -> None:
    pod = {
        "spec": {
            "resourceClaims": [{"name": "a", "resourceClaimName": "c"}],
            "containers": [{"name": "m", "resources": {"claims": [{"name": "a"}]}}],
        }
    }
    half = PreparedDeviceRecord(
        ("gpu",), "n", "x", 0, "GPU-a", profile="1g.5gb", placement_start=0, placement_size=1
    )
    whole = PreparedDeviceRecord(("gpu",), "n", "gpu-0", 0, "GPU-a")
    assert pod_mig_devices(pod, {"c": _claim("u", "c", half, whole)}) == []


def _args(**kw: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    argv = [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", v)]
    return parser.parse_args(argv)


def _base(tmp_path: Path) -> dict[str, str]:
    boot = tmp_path / "boot_id"
    boot.write_text("b\n")
    sim = tmp_path / "sim.json"
    sim.write_text("{}")
    return {
        "node_name": "node-a",
        "boot_id_path": str(boot),
        "nvml": f"sim:{sim}",
        "registry_dir": str(tmp_path / "reg"),
        "plugins_dir": str(tmp_path / "plugins"),
    }


def test_config_defaults_env_and_files(tmp_path: Path) -> None:
    node_cfg = tmp_path / "config.json"
    node_cfg.write_text(
        '{"nodeconfig": [{"name": "node-a", "operatingmode": "mig", "filterdevices": {"index": [1]}}]}'
    )
    allow = tmp_path / "allow.yaml"
    allow.write_text(
        "nvidia:\n  migProfileAllowlist:\n  - models: [A100-SXM4-40GB]\n    profiles: [1g.5gb]\n"
    )
    cfg = load_config(_args(**_base(tmp_path), node_config=str(node_cfg), device_config=str(allow)), env={})
    assert cfg.node_config.publishes_mig and cfg.node_config.filter_indexes == {1}
    assert cfg.allowlist.profiles_for("NVIDIA A100-SXM4-40GB") == ("1g.5gb",)
    assert cfg.metrics_port == 31992 and cfg.is_simulated
    base = _base(tmp_path)
    del base["node_name"]
    cfg = load_config(_args(**base), env={"NODE_NAME": "from-env", "FLEXMIG_METRICS_PORT": "-1"})
    assert cfg.node_name == "from-env" and cfg.metrics_port is None
    # Without a flag an unlisted node decides per GPU, and a missing HAMi-core library withholds shares.
    assert cfg.node_config.operating_mode is OperatingMode.AUTO
    assert cfg.unenforced_shares is UnenforcedShares.REFUSE
    cfg = load_config(_args(**_base(tmp_path)), env={"FLEXMIG_UNENFORCED_SHARES": "publish"})
    assert cfg.unenforced_shares is UnenforcedShares.PUBLISH
    cfg = load_config(_args(**_base(tmp_path), operating_mode="mig"), env={})
    assert cfg.node_config.publishes_mig


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"node_name": "Bad_Name"}, "--node-name"),
        ({"nvml": "cuda"}, "--nvml (env FLEXMIG_NVML): 'cuda' is not an NVML backend; allowed: \"real\""),
        ({"nvml": "sim:/nonexistent"}, "does not exist"),
        ({"metrics_port": "70000"}, "--metrics-port"),
        ({"operating_mode": "fast"}, "allowed: auto, hami-core, mig, mps"),
        (
            {"unenforced_shares": "maybe"},
            "--unenforced-shares (env FLEXMIG_UNENFORCED_SHARES): 'maybe'; allowed: refuse, publish",
        ),
        ({"cdi_dir": "relative/dir"}, "--cdi-dir"),
        ({"plugins_dir": "/tmp/" + "x" * 100}, "longer than 107 bytes"),
        ({"boot_id_path": "/nonexistent/boot"}, "--boot-id-path"),
        ({"node_config": "/nonexistent.json"}, "--node-config"),
    ],
)
def test_config_errors_name_the_flag(tmp_path: Path, override: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_args(**{**_base(tmp_path), **override}), env={})
    assert needle in str(err.value)


def test_cli_bad_value_exits_2_and_touches_nothing(tmp_path: Path) -> None:
    reg = tmp_path / "reg"
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.cli", "kubeletplugin", "--node-name", "n", "--registry-dir", str(reg),
         "--nvml", "bogus"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--nvml" in proc.stderr and "allowed" in proc.stderr
    assert not reg.exists()


def test_crashpoint_blocks_and_writes_marker(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    cp = Crashpoints(frozenset({"after-gi-create"}), marker)
    cp.reach("after-ci-create")  # not armed: returns at once
    t = threading.Thread(target=cp.reach, args=("after-gi-create",), daemon=True)
    t.start()
    # Poll instead of a fixed wait: on a loaded 2-core machine the thread may take a while to start.
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    t.join(timeout=0.2)
    assert t.is_alive() and marker.read_text() == "after-gi-create\n"
    with pytest.raises(ValueError, match="unknown points"):
        Crashpoints(frozenset({"typo"}), marker)


def test_content_hash_ignores_generation() -> None:
    def slices(gen: int, devices: list[str]) -> NodeSlices:
        body = {
            "metadata": {"name": "s"},
            "spec": {"pool": {"name": "n", "generation": gen}, "devices": devices},
        }
        return NodeSlices(slices=(PublishedSlice("s", body),), gpus=())

    assert content_hash(slices(1, ["a"])) == content_hash(slices(7, ["a"]))
    assert content_hash(slices(1, ["a"])) != content_hash(slices(1, ["b"]))
