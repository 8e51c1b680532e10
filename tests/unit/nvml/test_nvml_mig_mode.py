"""MIG mode: Ampere keeps a pending mode until reset, Hopper+ switches at once."""

from __future__ import annotations

import pytest

from driver.nvml.types import MigMode, NvmlError, NvmlErrorCode
from tests.unit.nvml.conftest import SimFactory


@pytest.fixture(params=["file", "memory"])
def sim_mode(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both simulator modes: the in-memory one must follow the same rules."""
    return str(request.param)


def test_ampere_mode_is_pending_until_reset(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB", mig_enabled=False)
    assert nvml.mig_mode(0) == MigMode(current=False, pending=False)
    assert nvml.set_mig_mode(0, True) is None
    assert nvml.mig_mode(0) == MigMode(current=False, pending=True)
    assert nvml.mig_mode(0).change_pending
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, 0, 0)
    assert exc.value.code is NvmlErrorCode.NOT_SUPPORTED
    admin.reset_gpu(0)
    assert nvml.mig_mode(0) == MigMode(current=True, pending=True)
    assert nvml.create_gpu_instance(0, 0, 0).gi_id == 0


def test_hopper_and_blackwell_switch_immediately(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-80GB", "B200-180GB", mig_enabled=False)
    for index in (0, 1):
        assert nvml.set_mig_mode(index, True) is None
        assert nvml.mig_mode(index) == MigMode(current=True, pending=True)
        gi = nvml.create_gpu_instance(index, 19, 0)
        assert nvml.set_mig_mode(index, False) is NvmlErrorCode.IN_USE  # instances present
        nvml.destroy_gpu_instance(index, gi.gi_id)
        assert nvml.set_mig_mode(index, False) is None
        assert nvml.mig_mode(index) == MigMode(current=False, pending=False)


def test_enable_with_whole_gpu_process_is_in_use(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("H200-141GB", mig_enabled=False)
    admin.add_process(0, None, None, pid=77)
    assert nvml.set_mig_mode(0, True) is NvmlErrorCode.IN_USE
    assert nvml.mig_mode(0) == MigMode(current=False, pending=False)
    admin.remove_process(0, 77)
    assert nvml.set_mig_mode(0, True) is None


def test_reset_clears_instances_and_is_refused_with_processes(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A30-24GB")
    gi = nvml.create_gpu_instance(0, 5, 0)
    ci = nvml.create_compute_instance(0, gi.gi_id)
    admin.add_process(0, gi.gi_id, ci.ci_id, pid=5)
    with pytest.raises(NvmlError) as exc:
        admin.reset_gpu(0)
    assert exc.value.code is NvmlErrorCode.IN_USE
    admin.remove_process(0, 5)
    admin.reset_gpu(0)
    assert nvml.gpu_instances(0) == []
    assert nvml.mig_devices(0) == []


def test_reboot_clears_instances_keeps_ampere_mode_not_hopper(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-80GB", "H100-94GB")
    nvml.create_gpu_instance(0, 9, 0)
    nvml.create_gpu_instance(1, 9, 4)
    admin.add_process(1, None, None, pid=3)
    assert nvml.set_mig_mode(0, False) is NvmlErrorCode.IN_USE
    admin.reboot()
    assert nvml.gpu_instances(0) == [] and nvml.gpu_instances(1) == []
    assert nvml.mig_mode(0) == MigMode(True, True)  # Ampere persists MIG mode
    assert nvml.mig_mode(1) == MigMode(False, False)  # Hopper boots with MIG off
    assert admin.snapshot().gpus[1].processes == ()


@pytest.mark.parametrize("sku", ["H100-80GB", "H200-141GB", "B200-180GB", "RTX-PRO-6000"])
def test_reset_turns_mig_off_on_hopper_and_newer(make_sim: SimFactory, sku: str) -> None:
    nvml, admin, _ = make_sim(sku)
    assert nvml.mig_mode(0) == MigMode(True, True)
    admin.reset_gpu(0)
    assert nvml.mig_mode(0) == MigMode(False, False)


def test_reset_keeps_mig_on_ampere(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB", "A30-24GB")
    for index in (0, 1):
        admin.reset_gpu(index)
        assert nvml.mig_mode(index) == MigMode(True, True)


def test_gpu_info(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-96GB", "RTX-PRO-6000")
    first, second = nvml.gpus()
    assert (first.name, first.pci_device_id, first.memory_total_mib) == ("NVIDIA GH200 480GB", 0x2342, 97871)
    assert first.architecture.value == "hopper" and first.mig_capable and first.minor_number == 0
    assert second.architecture.value == "blackwell" and second.index == 1
    assert first.uuid.startswith("GPU-") and first.uuid != second.uuid
