"""Host paths vs the plugin's own view of them (issue 22's defect).

A containerised plugin sees the host's driver root at a mount point of its own (the chart's
`/driver-root`): discovery must read the files there, while every path written into a CDI spec must
be the host's, because the container runtime reads the spec on the host. Same for the dev root
(device nodes stat-ed and created by the plugin, named in the spec) and the nvidia-cdi-hook.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from driver.cdi import PreparedGpu, PreparedMig, SpecHost, build_claim_spec
from driver.cdi_host import DeviceTable, discover_driver_files
from kubeletplugin.prepare.cdiwriter import host_spec_writer
from kubeletplugin.prepare.devnodes import ensure_caps_nodes
from kubeletplugin.settings.config import ConfigError, PluginConfig, add_flags, load_config

UID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"
WHOLE = PreparedGpu("gpu-0", GPU_UUID, gpu_minor=0)
MIG = PreparedMig(
    "gpu-0-mig-1g5gb-19-3", GPU_UUID, gpu_minor=0, gi_id=1, ci_id=0, mig_uuid="MIG-aaaaaaaa-bbbb-cccc"
)
HOST_DRIVER = "/run/nvidia/driver"  # the host path the spec must carry; nothing exists there here
LIB = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "550.54.15"


def fake_driver_root(root: Path) -> Path:
    """A driver tree as the NVIDIA installer leaves it: versioned libraries, soname links, a tool."""
    lib = root / LIB.lstrip("/")
    lib.mkdir(parents=True)
    for stem in ("libcuda", "libnvidia-ml"):
        (lib / f"{stem}.so.{DRIVER_VERSION}").write_bytes(b"")
        (lib / f"{stem}.so.1").symlink_to(f"{stem}.so.{DRIVER_VERSION}")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "nvidia-smi").write_bytes(b"")
    return root


def _hook(where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("#!/bin/sh\nexit 0\n")
    where.chmod(0o755)
    return where


def test_driver_files_are_found_in_the_container_and_named_by_their_host_paths(tmp_path: Path) -> None:
    seen = fake_driver_root(tmp_path / "driver-root")  # the chart's mount of the host's driver root
    hook = _hook(tmp_path / "host-cdi-hook" / "nvidia-cdi-hook")
    files = discover_driver_files(
        Path(HOST_DRIVER),
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
        local_driver_root=seen,
        local_hook_path=str(hook),
    )
    assert files.missing_required == () and not files.warnings
    spec = build_claim_spec(UID, [WHOLE], host=SpecHost(DeviceTable(tmp_path / "dev"), files))
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts[f"{LIB}/libcuda.so.{DRIVER_VERSION}"] == f"{HOST_DRIVER}{LIB}/libcuda.so.{DRIVER_VERSION}"
    assert mounts[f"{LIB}/libnvidia-ml.so.1"] == f"{HOST_DRIVER}{LIB}/libnvidia-ml.so.1"
    assert mounts["/usr/bin/nvidia-smi"] == f"{HOST_DRIVER}/usr/bin/nvidia-smi"
    # Every mount is the host's path; none names where the plugin happened to see it.
    assert all(h.startswith(f"{HOST_DRIVER}/") and str(tmp_path) not in h for h in mounts.values())
    hooks = spec["containerEdits"]["hooks"]
    assert {h["path"] for h in hooks} == {"/usr/local/nvidia/toolkit/nvidia-cdi-hook"}

    # The defect: discovery under the host path, as the plugin did in its container, found nothing.
    regression = discover_driver_files(Path(HOST_DRIVER), str(hook))
    assert regression.mounts == () and regression.missing_required == ("libcuda", "libnvidia-ml")


def test_soname_links_with_absolute_targets_in_the_driver_roots_own_view(tmp_path: Path) -> None:
    seen = fake_driver_root(tmp_path / "driver-root")
    link = seen / LIB.lstrip("/") / "libcuda.so.1"
    link.unlink()
    link.symlink_to(f"{LIB}/libcuda.so.{DRIVER_VERSION}")  # absolute, as the driver root sees it
    files = discover_driver_files(Path(HOST_DRIVER), "", local_driver_root=seen)
    assert (f"{HOST_DRIVER}{LIB}/libcuda.so.1", f"{LIB}/libcuda.so.1") in files.mounts


def test_missing_hook_warning_names_both_paths(tmp_path: Path) -> None:
    files = discover_driver_files(
        Path(HOST_DRIVER), "/usr/bin/nvidia-cdi-hook", local_hook_path=str(tmp_path / "absent")
    )
    assert files.hook is None
    assert any("'/usr/bin/nvidia-cdi-hook' (seen at" in w for w in files.warnings), files.warnings


def test_device_nodes_are_stat_ed_and_created_locally_and_named_by_host_paths(tmp_path: Path) -> None:
    seen = tmp_path / "dev-root"  # where the plugin sees the host's dev root
    (seen / "dev").mkdir(parents=True)
    (seen / "dev" / "nvidia0").symlink_to("/dev/null")  # a char device without mknod
    table = DeviceTable(Path("/host/stand-in"), {"nvidia-caps": 237}, local_dev_root=seen)
    spec = build_claim_spec(UID, [WHOLE], host=SpecHost(table))
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    null = os.stat("/dev/null").st_rdev
    assert node["hostPath"] == "/host/stand-in/dev/nvidia0"
    assert (node["major"], node["minor"]) == (os.major(null), os.minor(null))  # read from the local node
    assert table.local_path("/dev/nvidia-caps/nvidia-cap4") == seen / "dev/nvidia-caps/nvidia-cap4"


def test_caps_nodes_are_created_under_the_local_dev_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the node is made, not whether mknod works (root-only; tests/unit/kubeletplugin/
    test_kp_devnodes.py covers that): mknod is recorded, so this runs for any user."""
    made: list[tuple[str, int]] = []

    def fake_mknod(path: str, mode: int = 0o600, device: int = 0) -> None:
        made.append((str(path), device))
        Path(path).touch()

    monkeypatch.setattr(os, "mknod", fake_mknod)
    seen = tmp_path / "dev-root"
    table = DeviceTable(Path("/host/stand-in"), {"nvidia-caps": 237}, local_dev_root=seen)
    created = ensure_caps_nodes(table, [4])
    assert created == [seen / "dev/nvidia-caps/nvidia-cap4"]
    assert len(made) == 1 and made[0][0].startswith(str(seen / "dev/nvidia-caps/"))
    assert made[0][1] == os.makedev(237, 4)
    assert not Path("/host/stand-in").exists()  # nothing written at the host path


def test_the_node_writer_passes_both_views(tmp_path: Path) -> None:
    seen = fake_driver_root(tmp_path / "driver-root")
    writer = host_spec_writer(
        cdi_dir=tmp_path / "cdi",
        dev_root=Path("/"),
        driver_root=Path(HOST_DRIVER),
        proc_root=Path("/proc"),
        cdi_hook="/usr/bin/nvidia-cdi-hook",
        simulated=True,
        proc_root_is_default=True,
        container_driver_root=seen,
        container_dev_root=tmp_path,
    )
    assert (f"{HOST_DRIVER}{LIB}/libcuda.so.1", f"{LIB}/libcuda.so.1") in writer.host.driver.mounts
    assert writer.host.devices.local_path("/dev/nvidia0") == tmp_path / "dev/nvidia0"
    assert writer.host.devices.host_path("/dev/nvidia0") == Path("/dev/nvidia0")


# --- flags -----------------------------------------------------------------------------------------


def _load(tmp_path: Path, *flags: str) -> PluginConfig:
    boot = tmp_path / "boot_id"
    boot.write_text("b\n")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    base = ["--node-name=n1", f"--boot-id-path={boot}", "--nvml=real", "--metrics-port=-1"]
    return load_config(parser.parse_args([*base, *flags]), env={})


def test_container_roots_default_to_the_host_roots(tmp_path: Path) -> None:
    cfg = _load(tmp_path, f"--driver-root={tmp_path}")
    assert cfg.container_driver_root == cfg.driver_root == tmp_path
    assert cfg.container_dev_root == cfg.dev_root == Path("/")
    assert cfg.container_nvidia_cdi_hook == cfg.nvidia_cdi_hook


def test_container_roots_given(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        f"--driver-root={HOST_DRIVER}",
        f"--container-driver-root={tmp_path}",
        "--dev-root=/host/dev-root",
        f"--container-dev-root={tmp_path}",
        "--container-nvidia-cdi-hook-path=/host-cdi-hook/nvidia-cdi-hook",
    )
    assert (cfg.driver_root, cfg.container_driver_root) == (Path(HOST_DRIVER), tmp_path)
    assert (cfg.dev_root, cfg.container_dev_root) == (Path("/host/dev-root"), tmp_path)
    assert cfg.container_nvidia_cdi_hook == "/host-cdi-hook/nvidia-cdi-hook"


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (
            ("--container-driver-root=driver-root",),
            ("--container-driver-root (env FLEXMIG_CONTAINER_DRIVER_ROOT): 'driver-root'", "absolute"),
        ),
        (
            ("--container-driver-root=/nonexistent/driver-root",),
            ("--container-driver-root", "is not a directory; allowed: an existing directory", "--driver-root"),
        ),
        (
            ("--driver-root=/nonexistent/host-driver",),
            ("--driver-root (env FLEXMIG_DRIVER_ROOT): '/nonexistent/host-driver' is not a directory here",
             "--container-driver-root"),
        ),
        (
            ("--container-dev-root=/nonexistent/dev-root",),
            ("--container-dev-root (env FLEXMIG_CONTAINER_DEV_ROOT)", "is not a directory"),
        ),
        (
            ("--container-nvidia-cdi-hook-path=bin/nvidia-cdi-hook",),
            ("--container-nvidia-cdi-hook-path", "must be an absolute path"),
        ),
    ],
)  # fmt: skip
def test_bad_container_roots_are_refused(
    tmp_path: Path, flags: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, *flags)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
