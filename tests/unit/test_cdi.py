"""CDI spec content, mig-minors parsing and formula, atomic write and removal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from driver import cdi
from driver.cdi import (
    PreparedGpu,
    PreparedMig,
    SpecHost,
    build_claim_spec,
    mig_cap_minor,
    parse_mig_minors,
    qualified_device_id,
    read_mig_minors,
    remove_spec,
    write_spec_atomically,
)
from driver.cdi_host import DeviceTable, discover_driver_files, parse_proc_devices

UID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"
MIG_UUID = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG = PreparedMig("gpu-2-mig-1g5gb-19-3", GPU_UUID, gpu_minor=2, gi_id=1, ci_id=0, mig_uuid=MIG_UUID)
WHOLE = PreparedGpu("gpu-0", GPU_UUID, gpu_minor=0)

MINORS_FILE = """config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu2/gi1/access 999
gpu2/gi1/ci0/access 1000
garbage line here
"""


def test_qualified_id() -> None:
    assert (
        qualified_device_id(UID, "gpu-0-mig-1g5gb-19-3") == f"gpu.flexmig.dev/mig={UID}-gpu-0-mig-1g5gb-19-3"
    )


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "-a", "a-", "a.b", "a" * 64, "uid with space"])
def test_bad_claim_uid_names_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match="claim_uid"):
        qualified_device_id(bad, "gpu-0")
    with pytest.raises(ValueError, match="claim_uid"):
        remove_spec("/nonexistent", bad)


def test_bad_device_name() -> None:
    with pytest.raises(ValueError, match="device_name"):
        qualified_device_id(UID, "GPU_0")


def _fake_dev_root(root: Path, names: list[str]) -> Path:
    """Stand-in host nodes: symlinks to /dev/null (a char device 1:3), so no mknod (root) is needed."""
    for name in names:
        node = root / "dev" / name
        node.parent.mkdir(parents=True, exist_ok=True)
        node.symlink_to("/dev/null")
    return root


def _table(tmp_path: Path, **majors: int) -> DeviceTable:
    return DeviceTable(tmp_path / "devroot", {k.replace("_", "-"): v for k, v in majors.items()})


def test_mig_spec_content_with_minors_table(tmp_path: Path) -> None:
    table = _table(tmp_path, nvidia_uvm=511, nvidia_caps=237)
    spec = build_claim_spec(UID, [MIG, WHOLE], parse_mig_minors(MINORS_FILE), host=SpecHost(table))
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpu.flexmig.dev/mig"
    mig, whole = spec["devices"]
    assert mig["name"] == f"{UID}-gpu-2-mig-1g5gb-19-3"
    # Both devices name every UUID of the claim: a runtime keeps only one value per env var.
    assert mig["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID},{GPU_UUID}"]
    root = tmp_path / "devroot"
    # Complete entries: the runtime creates each node from type/major/minor without a host node.
    assert mig["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "hostPath": f"{root}/dev/nvidia2", "type": "c", "major": 195, "minor": 2,
         "fileMode": 0o666},
        {"path": "/dev/nvidia-caps/nvidia-cap999", "hostPath": f"{root}/dev/nvidia-caps/nvidia-cap999",
         "type": "c", "major": 237, "minor": 999, "fileMode": 0o444},
        {"path": "/dev/nvidia-caps/nvidia-cap1000", "hostPath": f"{root}/dev/nvidia-caps/nvidia-cap1000",
         "type": "c", "major": 237, "minor": 1000, "fileMode": 0o444},
    ]  # fmt: skip
    assert whole["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID},{GPU_UUID}"]
    assert [(n["path"], n["major"], n["minor"]) for n in whole["containerEdits"]["deviceNodes"]] == [
        ("/dev/nvidia0", 195, 0)
    ]
    # Once per claim: control and UVM nodes.
    common = spec["containerEdits"]["deviceNodes"]
    assert [(n["path"], n["type"], n["major"], n["minor"]) for n in common] == [
        ("/dev/nvidiactl", "c", 195, 255),
        ("/dev/nvidia-uvm", "c", 511, 0),
        ("/dev/nvidia-uvm-tools", "c", 511, 1),
    ]


def test_existing_host_nodes_win_over_registered_numbers(tmp_path: Path) -> None:
    root = _fake_dev_root(tmp_path / "devroot", ["nvidia0", "nvidiactl", "nvidia-caps/nvidia-cap282"])
    spec = build_claim_spec(UID, [WHOLE], host=SpecHost(DeviceTable(root)))
    null = os.stat("/dev/null").st_rdev
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert (node["major"], node["minor"], node["hostPath"]) == (
        os.major(null),
        os.minor(null),
        f"{root}/dev/nvidia0",
    )
    # No nvidia-uvm registered and no host node: left out (the toolkit's generator does the same).
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == ["/dev/nvidiactl"]


def test_host_path_that_is_not_a_device_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    with pytest.raises(ValueError, match="not a character device"):
        build_claim_spec(UID, [WHOLE], host=SpecHost(DeviceTable(tmp_path)))


def test_mig_spec_without_table_uses_kernel_formula(tmp_path: Path) -> None:
    spec = build_claim_spec(UID, [MIG], host=SpecHost(_table(tmp_path, nvidia_caps=237)))
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    # gpu2/gi1: 3 + 2*135 + 1*9 = 282; its ci0 is the next minor.
    assert paths[-2:] == ["/dev/nvidia-caps/nvidia-cap282", "/dev/nvidia-caps/nvidia-cap283"]


def test_mig_without_nvidia_caps_fails_on_a_real_gpu_and_is_left_out_in_simulation(tmp_path: Path) -> None:
    strict = DeviceTable(tmp_path, {}, strict=True)
    with pytest.raises(ValueError, match="nvidia-caps is not registered"):
        build_claim_spec(UID, [MIG], host=SpecHost(strict))
    spec = build_claim_spec(UID, [MIG], host=SpecHost(DeviceTable(tmp_path, {})))
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == ["/dev/nvidia2"]


def test_parse_proc_devices_reads_only_character_majors() -> None:
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-caps\n511 nvidia-uvm\n\n"
    text += "Block devices:\n  8 sd\n237 nvidia-caps-fake-block\n"
    assert parse_proc_devices(text) == {
        "mem": 1,
        "nvidia-frontend": 195,
        "nvidia-caps": 237,
        "nvidia-uvm": 511,
    }


def test_table_without_entry_is_an_error() -> None:
    with pytest.raises(ValueError, match="gpu2/gi1/access"):
        build_claim_spec(UID, [MIG], {"config": 1})


@pytest.mark.parametrize(
    ("gpu", "gi", "ci", "minor"),
    [(0, 0, None, 3), (0, 0, 0, 4), (0, 0, 2, 6), (3, 3, 3, 439), (6, 11, 7, 920), (31, 14, 7, 4322)],
)
def test_formula_matches_nvidia_documented_samples(gpu: int, gi: int, ci: int | None, minor: int) -> None:
    assert mig_cap_minor(gpu, gi, ci) == minor


def test_formula_matches_a_generated_table() -> None:
    lines = ["config 1", "monitor 2"]
    n = 3
    for g in range(2):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {n}")
            n += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {n}")
                n += 1
    table = parse_mig_minors("\n".join(lines))
    for g in range(2):
        for gi in range(15):
            assert table[f"gpu{g}/gi{gi}/access"] == mig_cap_minor(g, gi)
            for ci in range(8):
                assert table[f"gpu{g}/gi{gi}/ci{ci}/access"] == mig_cap_minor(g, gi, ci)


@pytest.mark.parametrize(("gi", "ci"), [(15, 0), (-1, 0), (0, 8)])
def test_formula_range(gi: int, ci: int) -> None:
    with pytest.raises(ValueError):
        mig_cap_minor(0, gi, ci)


def test_parse_and_read_mig_minors(tmp_path: Path) -> None:
    table = parse_mig_minors(MINORS_FILE)
    assert table["config"] == 1 and table["gpu0/gi0/ci0/access"] == 4 and len(table) == 6
    f = tmp_path / "mig-minors"
    f.write_text(MINORS_FILE)
    assert read_mig_minors(f) == table
    assert read_mig_minors(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("devices", "field"),
    [
        ([], "devices"),
        ([WHOLE, WHOLE], "duplicate"),
        ([PreparedGpu("gpu-0", "MIG-x", 0)], "gpu_uuid"),
        ([PreparedGpu("gpu-0", GPU_UUID, -1)], "gpu_minor"),
        ([PreparedMig("gpu-0-mig-a-1-0", GPU_UUID, 0, 1, 0, "GPU-x")], "mig_uuid"),
        ([PreparedMig("gpu-0-mig-a-1-0", "bogus", 0, 1, 0, MIG_UUID)], "parent_uuid"),
    ],
)
def test_invalid_devices(devices: list[cdi.PreparedDevice], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build_claim_spec(UID, devices)


def test_write_and_remove(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    spec = build_claim_spec(UID, [MIG])
    path = write_spec_atomically(cdi_dir, UID, spec)
    assert path.name == f"gpu.flexmig.dev-{UID}.json"
    assert json.loads(path.read_text()) == spec
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # Rewriting replaces in place and leaves no temp files behind.
    write_spec_atomically(cdi_dir, UID, build_claim_spec(UID, [WHOLE]))
    assert [p.name for p in cdi_dir.iterdir()] == [path.name]
    assert remove_spec(cdi_dir, UID) is True
    assert remove_spec(cdi_dir, UID) is False
    assert list(cdi_dir.iterdir()) == []


def test_failed_write_keeps_old_spec_and_cleans_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = build_claim_spec(UID, [WHOLE])
    path = write_spec_atomically(tmp_path, UID, old)

    def boom(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("driver.cdi.os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_spec_atomically(tmp_path, UID, build_claim_spec(UID, [MIG]))
    assert json.loads(path.read_text()) == old
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_driver_does_not_import_kubernetes() -> None:
    source = Path(cdi.__file__).read_text()
    assert "kubernetes" not in source.split('"""', 2)[2] and "grpc" not in source


# --- driver files ----------------------------------------------------------------------------------

DRIVER_VERSION = "550.54.15"


def fake_driver_root(root: Path, libdir: str = "/usr/lib/x86_64-linux-gnu") -> Path:
    """A driver root as the NVIDIA installer leaves it: empty versioned libraries, soname links, tools."""
    lib = root / libdir.lstrip("/")
    lib.mkdir(parents=True)
    for stem in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm"):
        (lib / f"{stem}.so.{DRIVER_VERSION}").write_bytes(b"")
        (lib / f"{stem}.so.1").symlink_to(f"{stem}.so.{DRIVER_VERSION}")
    (lib / "libcuda.so.535.1.1").write_bytes(b"")  # a leftover of an older driver: the newest wins
    (lib / "libunrelated.so.1.2").write_bytes(b"")
    bindir = root / "usr" / "bin"
    bindir.mkdir(parents=True)
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"):
        (bindir / name).write_bytes(b"")
    return root


def _hook(tmp_path: Path) -> str:
    hook = tmp_path / "nvidia-cdi-hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return str(hook)


def test_driver_files_are_found_and_mounted_read_only(tmp_path: Path) -> None:
    root = fake_driver_root(tmp_path / "driver")
    files = discover_driver_files(root, _hook(tmp_path))
    assert files.missing_required == () and files.hook is not None
    spec = build_claim_spec(UID, [MIG], host=SpecHost(_table(tmp_path, nvidia_caps=237), files))
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu"
    expected = [f"{lib}/{s}.so.{v}" for s in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler",
                                              "libnvidia-nvvm") for v in (DRIVER_VERSION, "1")]  # fmt: skip
    expected += [f"/usr/bin/{n}" for n in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")]
    assert sorted(mounts) == sorted(expected)
    for path, m in mounts.items():
        assert m["hostPath"] == f"{root}{path}" and Path(m["hostPath"]).exists()
        assert m["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert f"{lib}/libcuda.so.535.1.1" not in mounts


def test_hooks_update_ldcache_and_create_dev_symlinks(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    files = discover_driver_files(fake_driver_root(tmp_path / "driver"), hook)
    spec = build_claim_spec(UID, [WHOLE], host=SpecHost(_table(tmp_path), files))
    hooks = spec["containerEdits"]["hooks"]
    assert [h["hookName"] for h in hooks] == ["createContainer", "createContainer"]
    assert all(h["path"] == hook for h in hooks)
    links, ldcache = hooks[0]["args"], hooks[1]["args"]
    assert links[:2] == ["nvidia-cdi-hook", "create-symlinks"]
    assert "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so" in links
    assert ldcache == ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]


def test_without_the_hook_no_hooks_and_a_warning(tmp_path: Path) -> None:
    files = discover_driver_files(fake_driver_root(tmp_path / "driver"), str(tmp_path / "absent-hook"))
    assert files.hook is None and any("nvidia-cdi-hook not found" in w for w in files.warnings)
    spec = build_claim_spec(UID, [WHOLE], host=SpecHost(_table(tmp_path), files))
    assert "hooks" not in spec["containerEdits"] and spec["containerEdits"]["mounts"]


def test_ld_so_conf_directories_are_searched_first(tmp_path: Path) -> None:
    root = fake_driver_root(tmp_path / "driver", libdir="/opt/nvidia/lib")
    (root / "etc" / "ld.so.conf.d").mkdir(parents=True)
    (root / "etc" / "ld.so.conf.d" / "nvidia.conf").write_text("# driver\n/opt/nvidia/lib\n")
    files = discover_driver_files(root, "")
    assert files.library_dirs == ("/opt/nvidia/lib",)
    assert (
        f"{root}/opt/nvidia/lib/libcuda.so.{DRIVER_VERSION}",
        f"/opt/nvidia/lib/libcuda.so.{DRIVER_VERSION}",
    ) in (files.mounts)


def test_missing_required_libraries_are_reported(tmp_path: Path) -> None:
    files = discover_driver_files(tmp_path, "")
    assert files.missing_required == ("libcuda", "libnvidia-ml") and files.mounts == ()
    assert any("libcuda" in w and "--driver-root" in w for w in files.warnings)
