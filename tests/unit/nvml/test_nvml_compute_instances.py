"""Compute instances, MIG devices and processes through the `Nvml` port on the simulator."""

from __future__ import annotations

import re

import pytest

from driver.nvml.sim import open_sim
from driver.nvml.types import ComputeInstance, MigDevice, NvmlError, NvmlErrorCode
from tests.unit.nvml.conftest import SimFactory

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_full_ci_matches_gi_size(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    expected_ci_profile = {19: 0, 15: 0, 14: 1, 9: 2, 5: 3, 0: 4}
    for profile, ci_profile in expected_ci_profile.items():
        gi = nvml.create_gpu_instance(0, profile, 0)
        ci = nvml.create_compute_instance(0, gi.gi_id)
        assert ci.profile_id == ci_profile
        assert (ci.ci_id, ci.compute_start) == (0, 0)
        assert ci.compute_size == nvml.gi_profile_by_id(0, profile).compute_slices
        nvml.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
        nvml.destroy_gpu_instance(0, gi.gi_id)
    gi = nvml.create_gpu_instance(0, 9, 4)
    assert nvml.create_compute_instance(0, gi.gi_id) == ComputeInstance(0, gi.gi_id, 0, 2, 0, 3)


@pytest.mark.parametrize("sku", ["H100-80GB", "H100-PCIE-80GB", "H100-96GB"])
def test_double_memory_1g_on_hopper_gets_ci_profile_7(make_sim: SimFactory, sku: str) -> None:
    """1g.20gb / 1g.24gb: the CI NVML reports as spanning the GI is profile 7, not the lowest id 0."""
    nvml, _, _ = make_sim(sku)
    gi = nvml.create_gpu_instance(0, 15, 2)
    ci = nvml.create_compute_instance(0, gi.gi_id)
    assert (ci.profile_id, ci.compute_start, ci.compute_size) == (7, 0, 1)
    assert nvml.compute_instances(0, gi.gi_id) == [ci]
    assert [(d.gi_id, d.ci_id) for d in nvml.mig_devices(0)] == [(gi.gi_id, ci.ci_id)]


def test_second_full_ci_is_insufficient_resources(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-80GB")
    gi = nvml.create_gpu_instance(0, 0, 0)
    nvml.create_compute_instance(0, gi.gi_id)
    with pytest.raises(NvmlError) as exc:
        nvml.create_compute_instance(0, gi.gi_id)
    assert exc.value.code is NvmlErrorCode.INSUFFICIENT_RESOURCES


def test_compute_instances_listed_and_destroyed(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("B200-180GB")
    gi = nvml.create_gpu_instance(0, 5, 0)
    ci = nvml.create_compute_instance(0, gi.gi_id)
    assert nvml.compute_instances(0, gi.gi_id) == [ci]
    nvml.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
    assert nvml.compute_instances(0, gi.gi_id) == []
    with pytest.raises(NvmlError) as exc:
        nvml.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
    assert exc.value.code is NvmlErrorCode.NOT_FOUND
    with pytest.raises(NvmlError) as exc:
        nvml.compute_instances(0, 9)
    assert exc.value.code is NvmlErrorCode.NOT_FOUND


def test_mig_devices_and_uuids(make_sim: SimFactory) -> None:
    nvml, _, path = make_sim("A100-40GB", "H100-80GB")
    assert nvml.mig_devices(0) == []
    a = nvml.create_gpu_instance(0, 19, 3)
    b = nvml.create_gpu_instance(0, 9, 4)
    nvml.create_gpu_instance(0, 19, 0)  # a GI without a CI has no MIG device
    nvml.create_compute_instance(0, b.gi_id)
    nvml.create_compute_instance(0, a.gi_id)
    devices = nvml.mig_devices(0)
    # MIG device indices follow GI ids, which go by size (3g before 1g), not by creation order.
    assert [(d.gi_id, d.ci_id) for d in devices] == [(b.gi_id, 0), (a.gi_id, 0)]
    assert all(MIG_UUID.match(d.uuid) for d in devices)
    assert len({d.uuid for d in devices}) == 2
    assert nvml.mig_uuid(0, b.gi_id, 0) == devices[0].uuid
    with open_sim(path) as other:
        assert other.mig_devices(0) == devices
    with pytest.raises(NvmlError) as exc:
        nvml.mig_uuid(0, 14, 0)  # no GI has that id
    assert exc.value.code is NvmlErrorCode.NOT_FOUND


def test_mig_uuid_is_deterministic_per_gpu_gi_ci(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-80GB")
    gi = nvml.create_gpu_instance(0, 14, 0)
    nvml.create_compute_instance(0, gi.gi_id)
    first = nvml.mig_devices(0)
    nvml.destroy_compute_instance(0, gi.gi_id, 0)
    nvml.create_compute_instance(0, gi.gi_id)
    assert nvml.mig_devices(0) == first
    assert isinstance(first[0], MigDevice)


def test_running_process_count(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("H200-141GB")
    gi = nvml.create_gpu_instance(0, 19, 0)
    ci = nvml.create_compute_instance(0, gi.gi_id)
    assert nvml.running_process_count(0, gi.gi_id, ci.ci_id) == 0
    admin.add_process(0, gi.gi_id, ci.ci_id, pid=10)
    admin.add_process(0, gi.gi_id, ci.ci_id, pid=11)
    assert nvml.running_process_count(0, gi.gi_id, ci.ci_id) == 2
    with pytest.raises(ValueError, match="no GI"):
        admin.add_process(0, 9, 0, pid=12)
