"""The `sim-memory:<file>` backend: the state file is loaded once, each call that changes a GPU writes
it back before returning (so other processes and a restarted plugin see the hardware), read-only
calls write nothing, and calls on different GPUs run in parallel (driver/nvml/sim/writeback.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from driver.nvml.backend import open_nvml
from driver.nvml.port import Nvml
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state
from driver.nvml.sim.state import StateFile
from driver.nvml.types import NvmlError, NvmlErrorCode

CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"


def _open(tmp_path: Path, gpus: int = 2, **latency_s: float) -> tuple[Nvml, Path]:
    path = tmp_path / "sim.json"
    init_sim_state(path, [SimGpuSpec("H100-80GB") for _ in range(gpus)])
    if latency_s:
        SimAdmin(path).set_latency(**latency_s)
    nvml = open_nvml(f"sim-memory:{path}")
    nvml.init()
    return nvml, path


def _create_1g(nvml: Nvml, index: int, slot: int = 0) -> int:
    profile = next(p for p in nvml.gi_profiles(index) if p.compute_slices == 1 and p.memory_slices == 1)
    return nvml.create_gpu_instance(index, profile.profile_id, profile.placements[slot].start).gi_id


def _file_gis(path: Path, index: int) -> list[int]:
    return [gi.gi_id for gi in SimAdmin(path).snapshot().gpus[index].gpu_instances]


def test_the_file_is_loaded_once_and_later_changes_to_it_are_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml, path = _open(tmp_path)
    loads = 0
    real_load = StateFile._load_raw

    def counting_load(self: StateFile) -> dict[str, object]:
        nonlocal loads
        loads += 1
        return real_load(self)

    monkeypatch.setattr(StateFile, "_load_raw", counting_load)
    SimAdmin(path).inject_fault(CREATE, 1, NvmlErrorCode.UNKNOWN)  # written after the load
    loads = 0
    assert nvml.gpu(0).name == "NVIDIA H100 80GB HBM3"
    gi_id = _create_1g(nvml, 0)  # the file's fault is not this process's
    nvml.destroy_gpu_instance(0, gi_id)
    assert loads == 0


def test_a_change_is_in_the_file_before_the_call_returns(tmp_path: Path) -> None:
    # The latency is slept after the change: the file must hold it while the call still runs, as a
    # driver keeps an instance whose creator is killed before seeing the result.
    nvml, path = _open(tmp_path, **{CREATE: 1.0})
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_create_1g(nvml, 1), done.set()))
    worker.start()
    try:
        deadline = time.monotonic() + 0.8
        while not _file_gis(path, 1) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _file_gis(path, 1), "the new GPU instance is not in the file during the call"
        assert not done.is_set()
    finally:
        worker.join()
    assert done.is_set()


def test_every_kind_of_change_is_written_back_and_a_successor_loads_it(tmp_path: Path) -> None:
    nvml, path = _open(tmp_path)
    gi_id = _create_1g(nvml, 0)
    ci = nvml.create_compute_instance(0, gi_id)
    view = SimAdmin(path).snapshot().gpus[0].gpu_instances
    assert [(g.gi_id, [c.ci_id for c in g.compute_instances]) for g in view] == [(gi_id, [ci.ci_id])]
    successor = open_nvml(f"sim-memory:{path}")  # a restarted plugin
    successor.init()
    assert [g.gi_id for g in successor.gpu_instances(0)] == [gi_id]
    assert [c.ci_id for c in successor.compute_instances(0, gi_id)] == [ci.ci_id]
    # New instances never reuse a serial the file holds: a stale handle stays stale.
    other = _create_1g(successor, 0, slot=1)
    nvml.destroy_compute_instance(0, gi_id, ci.ci_id)
    assert SimAdmin(path).snapshot().gpus[0].gpu_instances[0].compute_instances == ()
    nvml.destroy_gpu_instance(0, gi_id)
    assert _file_gis(path, 0) == []  # the first process's write back: it never saw `other`
    assert other not in _file_gis(path, 0)
    assert nvml.set_mig_mode(1, False) is None
    assert SimAdmin(path).snapshot().gpus[1].mig_pending is False


def test_read_only_calls_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml, path = _open(tmp_path)
    gi_id = _create_1g(nvml, 0)
    before = os.stat(path)
    writes = 0
    real_store = StateFile.store_raw

    def counting_store(self: StateFile, raw: dict[str, object]) -> None:
        nonlocal writes
        writes += 1
        real_store(self, raw)

    monkeypatch.setattr(StateFile, "store_raw", counting_store)
    for index in range(nvml.device_count()):
        nvml.gpu(index)
        nvml.mig_mode(index)
        nvml.gi_profiles(index)
        nvml.gpu_instances(index)
    nvml.compute_instances(0, gi_id)
    with pytest.raises(NvmlError):  # a failed change changes nothing, so it writes nothing either
        nvml.destroy_gpu_instance(0, gi_id + 100)
    assert writes == 0
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_calls_on_different_gpus_run_in_parallel_and_on_one_gpu_in_turn(tmp_path: Path) -> None:
    nvml, path = _open(tmp_path, gpus=4, **{CREATE: 0.4})

    def timed(targets: list[tuple[int, int]]) -> float:
        threads = [threading.Thread(target=_create_1g, args=(nvml, *target)) for target in targets]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - start

    assert timed([(i, 0) for i in range(4)]) < 1.0  # 4 x 0.4 s if the node were serialised
    assert timed([(0, 1), (0, 2)]) >= 0.8  # one GPU: its calls wait for each other
    assert [len(_file_gis(path, i)) for i in range(4)] == [3, 1, 1, 1]  # every write kept the others'
