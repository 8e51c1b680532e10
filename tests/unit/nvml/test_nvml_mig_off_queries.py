"""The simulator's switch for Hopper+ profile queries while MIG mode is off: answer or refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.nvml.sim import MigOffQueries, SimAdmin, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.types import NvmlError, NvmlErrorCode

ANSWER, REFUSE = MigOffQueries.ANSWER, MigOffQueries.REFUSE


def _state(tmp_path: Path, *specs: SimGpuSpec) -> Path:
    path = tmp_path / "sim.json"
    init_sim_state(path, list(specs))
    return path


def test_answering_gpu_reports_profiles_with_mig_off(tmp_path: Path) -> None:
    path = _state(tmp_path, SimGpuSpec("H100-80GB", mig_enabled=False, mig_off_queries=ANSWER))
    with open_sim(path) as nvml:
        assert {p.profile_id for p in nvml.gi_profiles(0)} == {19, 20, 15, 14, 9, 5, 0}
        assert nvml.gi_profile_by_id(0, 9).placements[1].start == 4


def test_refusing_gpu_says_not_supported_until_mig_is_on(tmp_path: Path) -> None:
    path = _state(tmp_path, SimGpuSpec("H100-80GB", mig_enabled=False, mig_off_queries=REFUSE))
    with open_sim(path) as nvml:
        assert nvml.gi_profiles(0) == []
        with pytest.raises(NvmlError) as exc:
            nvml.gi_profile_by_id(0, 9)
        assert exc.value.code is NvmlErrorCode.NOT_SUPPORTED
        assert nvml.set_mig_mode(0, True) is None
        assert len(nvml.gi_profiles(0)) == 7
        assert nvml.set_mig_mode(0, False) is None
        assert nvml.gi_profiles(0) == []  # refused again, and nothing stale was cached


def test_switch_changes_at_run_time_and_survives_reopen(tmp_path: Path) -> None:
    path = _state(tmp_path, SimGpuSpec("B200-180GB", mig_enabled=False))
    admin = SimAdmin(path)
    with open_sim(path) as nvml:
        assert len(nvml.gi_profiles(0)) == 7  # default: answer
    admin.set_mig_off_queries(0, REFUSE)
    with open_sim(path) as nvml:
        assert nvml.gi_profiles(0) == []
    admin.set_mig_off_queries(0, ANSWER)
    with open_sim(path) as nvml:
        assert len(nvml.gi_profiles(0)) == 7


def test_ampere_refuses_with_mig_off_whatever_the_switch(tmp_path: Path) -> None:
    path = _state(tmp_path, SimGpuSpec("A100-40GB", mig_enabled=False, mig_off_queries=ANSWER))
    with open_sim(path) as nvml:
        assert nvml.gi_profiles(0) == []


def test_bad_switch_values_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"gpus\[0\]\.mig_off_queries.*allowed: answer, refuse"):
        _state(tmp_path, SimGpuSpec("H100-80GB", mig_off_queries="sometimes"))  # type: ignore[arg-type]
    path = _state(tmp_path, SimGpuSpec("H100-80GB"))
    with pytest.raises(ValueError, match="allowed: answer, refuse"):
        SimAdmin(path).set_mig_off_queries(0, "no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_index"):
        SimAdmin(path).set_mig_off_queries(3, REFUSE)
