"""The plugin creates the MIG capability nodes a prepared instance needs, idempotently (kubeletplugin/prepare/devnodes.py).

Device numbers used here are stand-ins: major 4000 is registered by no driver (opening such a node gives
ENXIO), so the nodes made under the test's dev root are harmless.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from driver import cdi
from driver.cdi_host import DeviceTable
from kubeletplugin.prepare.cdiwriter import ClaimSpecWriter
from kubeletplugin.prepare.devnodes import ensure_caps_nodes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")
FAKE_CAPS_MAJOR = 4000
UID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"


def _rdev(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), f"{path} is not a character device"
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def test_creates_missing_nodes_once(tmp_path: Path) -> None:
    table = DeviceTable(tmp_path, {"nvidia-caps": FAKE_CAPS_MAJOR})
    created = ensure_caps_nodes(table, [12, 13])
    caps = tmp_path / "dev" / "nvidia-caps"
    assert created == [caps / "nvidia-cap12", caps / "nvidia-cap13"]
    assert _rdev(caps / "nvidia-cap12") == (FAKE_CAPS_MAJOR, 12, 0o444)
    assert _rdev(caps / "nvidia-cap13") == (FAKE_CAPS_MAJOR, 13, 0o444)
    assert ensure_caps_nodes(table, [12, 13]) == []  # idempotent
    assert sorted(p.name for p in caps.iterdir()) == ["nvidia-cap12", "nvidia-cap13"]  # no temp files


def test_replaces_wrong_nodes(tmp_path: Path) -> None:
    caps = tmp_path / "dev" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "nvidia-cap12").write_text("not a device")
    os.mknod(caps / "nvidia-cap13", stat.S_IFCHR | 0o444, os.makedev(FAKE_CAPS_MAJOR + 1, 13))  # old major
    table = DeviceTable(tmp_path, {"nvidia-caps": FAKE_CAPS_MAJOR})
    assert len(ensure_caps_nodes(table, [12, 13])) == 2
    assert _rdev(caps / "nvidia-cap12")[:2] == (FAKE_CAPS_MAJOR, 12)
    assert _rdev(caps / "nvidia-cap13")[:2] == (FAKE_CAPS_MAJOR, 13)


def test_no_caps_driver_creates_nothing(tmp_path: Path) -> None:
    assert ensure_caps_nodes(DeviceTable(tmp_path, {}), [12]) == []
    assert not (tmp_path / "dev").exists()


def test_writer_creates_the_nodes_its_spec_names(tmp_path: Path) -> None:
    table = DeviceTable(tmp_path / "root", {"nvidia-caps": FAKE_CAPS_MAJOR}, strict=True)
    writer = ClaimSpecWriter(tmp_path / "cdi", None, cdi.SpecHost(table))
    mig = cdi.PreparedMig(
        "gpu-0-mig-1g5gb-9-1", "GPU-11111111-2222-3333-4444-555555555555", 0, 1, 0,
        "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
    )  # fmt: skip
    path = writer.write(UID, [mig], None)
    nodes = json.loads(path.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
    caps = [n for n in nodes if "nvidia-caps" in n["path"]]
    # gpu0/gi1 and its ci0 by the kernel's layout: 3 + 9 = 12, 13.
    assert [(n["path"], n["major"], n["minor"]) for n in caps] == [
        ("/dev/nvidia-caps/nvidia-cap12", FAKE_CAPS_MAJOR, 12),
        ("/dev/nvidia-caps/nvidia-cap13", FAKE_CAPS_MAJOR, 13),
    ]
    for n in caps:
        assert _rdev(Path(n["hostPath"]))[:2] == (n["major"], n["minor"])
