"""Every kind of CDI spec flexmig writes, judged by the CDI reference library (tags.cncf.io/container-
device-interface, the version containerd links) through our small validator (k8sbuild/node/cdivalidate).

The specs are built as the plugin builds them, for a MIG device, a whole GPU and a HAMi-core share, from
a fake driver root with empty library files and a fake dev root (stand-in nodes are symlinks to
/dev/null). The validator parses each spec strictly, validates it and injects every device into an
empty OCI spec, as a runtime would; the negative controls prove it refuses what containerd refused in
the hand trial (a node given by path only whose host node does not exist) and what CDI forbids.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from driver import cdi, hamicore
from driver.cdi_host import DeviceTable, discover_driver_files
from driver.hamicore import ShareLimit

from .realnode.node import NodeBinaries

UID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-22222222-2222-3333-4444-555555555555"
MIG_UUID = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CAPS_MAJOR = 4000
LIB = "/usr/lib/x86_64-linux-gnu"
LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler")
BINS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")


@pytest.fixture(scope="module")
def bins(node_bin_dir: Path) -> NodeBinaries:
    return NodeBinaries(node_bin_dir)


def validate(bins: NodeBinaries, spec_dir: Path) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [bins["cdivalidate"], str(spec_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, out.get("devices") or {}, proc.stderr


def host(tmp_path: Path, with_hook: bool) -> cdi.SpecHost:
    driver = tmp_path / "driver"
    (driver / LIB.lstrip("/")).mkdir(parents=True)
    for stem in LIBS:
        (driver / LIB.lstrip("/") / f"{stem}.so.550.54.15").write_bytes(b"")
        (driver / LIB.lstrip("/") / f"{stem}.so.1").symlink_to(f"{stem}.so.550.54.15")
    (driver / "usr/bin").mkdir(parents=True)
    for name in BINS:
        (driver / "usr/bin" / name).write_bytes(b"")
    hook = tmp_path / "nvidia-cdi-hook"
    if with_hook:
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
    dev = tmp_path / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).symlink_to(
            "/dev/null"
        )  # nvidia1 stays missing: its numbers come from the driver's major
    table = DeviceTable(tmp_path / "devroot", {"nvidia-caps": CAPS_MAJOR}, strict=True)
    return cdi.SpecHost(table, discover_driver_files(driver, str(hook)))


@pytest.mark.parametrize("with_hook", [True, False])
def test_specs_of_every_device_kind_pass_and_inject_completely(
    bins: NodeBinaries, tmp_path: Path, with_hook: bool
) -> None:
    h = host(tmp_path, with_hook)
    specs = tmp_path / "cdi"
    mig = cdi.PreparedMig("gpu-1-mig-1g5gb-9-1", GPU1, 1, 1, 0, MIG_UUID)
    whole = cdi.PreparedGpu("gpu-0", GPU0, 0)
    env = hamicore.device_env([ShareLimit(0, 8000, 30)])[0]
    shared = cdi.PreparedShared("gpu-0-shared", GPU0, 0, env)
    claims = {"mig": [mig, whole], "shared": [shared]}
    for i, devices in enumerate(claims.values()):
        uid = f"{UID[:-1]}{i}"
        edits = {"env": ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]} if devices == [shared] else None
        cdi.write_spec_atomically(specs, uid, cdi.build_claim_spec(uid, devices, None, edits, h))

    code, injected, err = validate(bins, specs)
    assert code == 0, err
    assert len(injected) == 3, sorted(injected)
    for name, oci in injected.items():
        nodes = {d["path"]: d for d in oci["linux"]["devices"]}
        # Every node complete: the runtime creates it without the host node.
        assert all(d["type"] == "c" and d["major"] > 0 for d in nodes.values()), nodes
        assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(nodes)
        allowed = {(d["major"], d["minor"]) for d in oci["linux"]["resources"]["devices"] if d.get("allow")}
        assert {
            (d["major"], d["minor"]) for d in nodes.values()
        } <= allowed  # the devices cgroup lets them in
        mounts = {m["destination"]: m for m in oci.get("mounts") or ()}
        for stem in LIBS:
            assert f"{LIB}/{stem}.so.550.54.15" in mounts, f"{name} lacks {stem}: {sorted(mounts)}"
        for b in BINS:
            assert f"/usr/bin/{b}" in mounts
        assert all("ro" in m["options"] for m in mounts.values())
        hooks = (oci.get("hooks") or {}).get("createContainer") or []
        if with_hook:
            assert [h_["args"][1] for h_ in hooks] == ["create-symlinks", "update-ldcache"]
        else:
            assert hooks == []
        env_vars = dict(e.split("=", 1) for e in oci["process"]["env"])
        if name.endswith("gpu-1-mig-1g5gb-9-1"):
            assert env_vars["NVIDIA_VISIBLE_DEVICES"] == f"{MIG_UUID},{GPU0}"
            caps = sorted((d["major"], d["minor"]) for p, d in nodes.items() if "nvidia-caps" in p)
            assert caps == [(CAPS_MAJOR, 3 + 135 + 9), (CAPS_MAJOR, 3 + 135 + 9 + 1)]  # gpu1/gi1, its ci0
            assert nodes["/dev/nvidia1"]["major"] == 195 and nodes["/dev/nvidia1"]["minor"] == 1
        if name.endswith("gpu-0-shared"):
            assert env_vars["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m" and "CUDA_DEVICE_ORDER" in env_vars


def test_a_node_the_runtime_cannot_create_fails_validation(bins: NodeBinaries, tmp_path: Path) -> None:
    """The hand trial's failure, reproduced: a path-only node whose host node is missing."""
    spec = cdi.build_claim_spec(UID, [cdi.PreparedGpu("gpu-0", GPU0, 0)], host=host(tmp_path, False))
    spec["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "/dev/nvidia7"}]
    cdi.write_spec_atomically(tmp_path / "cdi", UID, spec)
    code, _, err = validate(bins, tmp_path / "cdi")
    assert code == 1 and "failed to stat CDI host device" in err, err


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(cdiVersion="0.4.0"), "version"),  # hostPath needs 0.5.0
        (lambda s: s["containerEdits"]["deviceNodes"][0].update(type="x"), "invalid type"),
        (
            lambda s: s["containerEdits"].update(mounts=[{"hostPath": "", "containerPath": "/x"}]),
            "empty host path",
        ),
        (lambda s: s["devices"][0].update(extra=1), "field extra not found"),
    ],
)
def test_the_validator_refuses_invalid_specs(
    bins: NodeBinaries, tmp_path: Path, mutate: Any, message: str
) -> None:
    spec = cdi.build_claim_spec(UID, [cdi.PreparedGpu("gpu-0", GPU0, 0)], host=host(tmp_path, True))
    mutate(spec)
    cdi.write_spec_atomically(tmp_path / "cdi", UID, spec)
    code, _, err = validate(bins, tmp_path / "cdi")
    assert code == 1 and message in err, err
