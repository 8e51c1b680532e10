"""Prepare/unprepare of adminAccess results through the real Preparer on the NVML simulator: an admin
claim exposes what exists (the MIG instance another claim made, or the GPU as it is), creates and
destroys nothing, switches no MIG mode, and never blocks or breaks the claim that holds the device."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.checkpoint.model import (
    Checkpoint,
    ClaimCheckpoint,
    ClaimState,
    PreparedDeviceRecord,
    checkpoint_from_json,
    checkpoint_to_json,
)
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef, claim_view_from_dict

NODE = "hopper"
OWNER = "5a1e0c3e-0000-4c9e-8a59-00000000a001"
ADMIN = "5a1e0c3e-0000-4c9e-8a59-00000000a002"
MIG = "gpu-0-mig-1g10gb-19-0"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = make_node(tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=True)] * 2)
    yield n
    n.preparer.close()


def _claim(api: FakeApi, uid: str, name: str, device: str, admin: bool = False) -> ClaimRef:
    dev = AllocatedDevice("gpu", DRIVER_NAME, NODE, device, admin_access=admin)
    api.claims[("ns", name)] = ClaimView("ns", name, uid, (dev,), (PodRef("ns", name, f"pod-{name}"),))
    return ClaimRef(namespace="ns", uid=uid, name=name)


def _instances(node: SimNode, gpu: int = 0) -> list[tuple[int, int]]:
    return [(gi.gi_id, gi.start) for gi in node.admin.snapshot().gpus[gpu].gpu_instances]


def test_admin_exposes_the_owners_mig_instance_and_unprepare_leaves_it(node: SimNode) -> None:
    owner = _claim(node.api, OWNER, "owner", MIG)
    assert node.preparer.prepare([owner])[OWNER].error == ""
    before = _instances(node)
    made = node.mig_calls()
    admin = _claim(node.api, ADMIN, "watch", MIG, admin=True)
    result = node.preparer.prepare([admin])[ADMIN]
    assert result.error == ""
    assert node.mig_calls() == made  # nothing created
    spec = json.loads((node.cdi_dir / f"{DRIVER_NAME}-{ADMIN}.json").read_text())
    owner_spec = json.loads((node.cdi_dir / f"{DRIVER_NAME}-{OWNER}.json").read_text())
    mig_uuid = node.admin.snapshot().gpus[0].gpu_instances[0].compute_instances[0].mig_uuid
    assert mig_uuid in json.dumps(spec) and mig_uuid in json.dumps(owner_spec)
    [rec] = node.store.get_claim(ADMIN).devices  # type: ignore[union-attr]
    assert rec.admin and not rec.created_gi and not rec.created_ci
    # The admin goes first: the owner's instance stays.
    assert node.preparer.unprepare([admin])[ADMIN] is None
    assert _instances(node) == before
    # The owner goes: its instance goes, whatever admin watched it.
    admin2 = _claim(node.api, ADMIN, "watch", MIG, admin=True)
    assert node.preparer.prepare([admin2])[ADMIN].error == ""
    assert node.preparer.unprepare([owner])[OWNER] is None
    assert _instances(node) == []
    assert node.preparer.unprepare([admin2])[ADMIN] is None


def test_a_new_owner_takes_the_placement_an_admin_still_watches(node: SimNode) -> None:
    # An admin record holds nothing: neither the overlap check nor the placement owners count it.
    owner = _claim(node.api, OWNER, "owner", MIG)
    assert node.preparer.prepare([owner])[OWNER].error == ""
    admin = _claim(node.api, ADMIN, "watch", MIG, admin=True)
    assert node.preparer.prepare([admin])[ADMIN].error == ""
    assert node.preparer.unprepare([owner])[OWNER] is None
    nxt = "5a1e0c3e-0000-4c9e-8a59-00000000a003"
    result = node.preparer.prepare([_claim(node.api, nxt, "next", MIG)])[nxt]
    assert result.error == "" and len(_instances(node)) == 1


def test_admin_of_a_free_placement_creates_nothing_and_says_why(node: SimNode) -> None:
    made = node.mig_calls()
    admin = _claim(node.api, ADMIN, "watch", MIG, admin=True)
    result = node.preparer.prepare([admin])[ADMIN]
    assert "no MIG instance at placement 0:1 of GPU 0" in result.error
    assert "never creates one" in result.error
    assert node.mig_calls() == made and _instances(node) == []
    assert node.store.get_claim(ADMIN) is None


def test_admin_whole_gpu_keeps_mig_mode_and_the_instances_on_it(node: SimNode) -> None:
    owner = _claim(node.api, OWNER, "owner", MIG)
    assert node.preparer.prepare([owner])[OWNER].error == ""
    admin = _claim(node.api, ADMIN, "watch", "gpu-0", admin=True)
    assert node.preparer.prepare([admin])[ADMIN].error == ""  # no overlap refusal
    assert node.admin.snapshot().gpus[0].mig_current is True
    # An idle GPU in MIG mode stays in it too (a held whole GPU would switch it off).
    idle = _claim(node.api, ADMIN, "watch", "gpu-1", admin=True)
    assert node.preparer.unprepare([admin])[ADMIN] is None
    assert node.preparer.prepare([idle])[ADMIN].error == ""
    assert node.admin.snapshot().gpus[1].mig_current is True
    assert len(_instances(node)) == 1


def test_admin_flag_survives_the_checkpoint_and_other_records_keep_their_layout() -> None:
    admin = PreparedDeviceRecord(("gpu",), NODE, "gpu-0", 0, "GPU-x", admin=True)
    plain = PreparedDeviceRecord(("gpu",), NODE, "gpu-1", 1, "GPU-y")
    entry = ClaimCheckpoint("u", "ns", "c", ClaimState.PREPARE_COMPLETED, (admin, plain))
    raw = checkpoint_to_json(Checkpoint("boot", {"u": entry}))
    assert [d.get("adminAccess") for d in raw["claims"]["u"]["devices"]] == [True, None]
    assert [d.admin for d in checkpoint_from_json(raw).claims["u"].devices] == [True, False]


def test_claim_view_reads_admin_access_and_allocation_config() -> None:
    cfg = {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": {}}}
    view = claim_view_from_dict(
        {
            "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "r",
                                "driver": DRIVER_NAME,
                                "pool": NODE,
                                "device": "gpu-0",
                                "adminAccess": True,
                            }
                        ],
                        "config": [cfg],
                    }
                }
            },
        }
    )
    assert view.devices[0].admin_access is True and view.config == (cfg,)
