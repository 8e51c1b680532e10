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
    build_claim_spec,
    mig_cap_minor,
    parse_mig_minors,
    qualified_device_id,
    read_mig_minors,
    remove_spec,
    write_spec_atomically,
)

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


def test_mig_spec_content_with_minors_table() -> None:
    spec = build_claim_spec(UID, [MIG, WHOLE], parse_mig_minors(MINORS_FILE))
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpu.flexmig.dev/mig"
    mig, whole = spec["devices"]
    assert mig["name"] == f"{UID}-gpu-2-mig-1g5gb-19-3"
    # Both devices name every UUID of the claim: a runtime keeps only one value per env var.
    assert mig["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID},{GPU_UUID}"]
    assert [n["path"] for n in mig["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia2",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap999",
        "/dev/nvidia-caps/nvidia-cap1000",
    ]
    assert whole["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={MIG_UUID},{GPU_UUID}"]
    assert whole["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidia0"}
    assert len(whole["containerEdits"]["deviceNodes"]) == 4
    assert "containerEdits" not in spec


def test_mig_spec_without_table_uses_kernel_formula() -> None:
    spec = build_claim_spec(UID, [MIG])
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    # gpu2/gi1: 3 + 2*135 + 1*9 = 282; its ci0 is the next minor.
    assert paths[-2:] == ["/dev/nvidia-caps/nvidia-cap282", "/dev/nvidia-caps/nvidia-cap283"]


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
