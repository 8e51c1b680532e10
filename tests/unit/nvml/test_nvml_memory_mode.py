"""The in-memory simulator mode against the file-backed one: same answers, same placement rules, same
state after the same calls; and its locking: one GPU's call never waits for another GPU's."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.nvml.port import Nvml
from driver.nvml.sim import (
    MemoryState,
    SimAdmin,
    SimGpuSpec,
    init_memory_sim,
    init_sim_state,
    open_sim,
)
from driver.nvml.types import HealthEventKind, NvmlError, NvmlErrorCode

SKUS = ("A100-40GB", "H100-80GB", "A30-24GB", "B200-180GB")
DEADLINE_S = 10.0


def _both(tmp_path: Path, specs: list[SimGpuSpec]) -> list[tuple[Nvml, SimAdmin]]:
    path = tmp_path / "sim.json"
    init_sim_state(path, specs)
    memory = init_memory_sim(specs)
    out = [(open_sim(path), SimAdmin(path)), (open_sim(memory), SimAdmin(memory))]
    for nvml, _ in out:
        nvml.init()
    return out


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except NvmlError as exc:
        return ("error", exc.code)


def _random_step(rng: random.Random, nvml: Nvml, gpu_count: int) -> Callable[[], Any]:
    """One random call, chosen from what the GPU currently has (both modes make the same choice)."""
    index = rng.randrange(gpu_count)
    profiles = nvml.gi_profiles(index)
    gis = nvml.gpu_instances(index)
    roll = rng.random()
    if roll < 0.5 or not gis:
        prof = rng.choice(profiles)
        start = rng.choice(prof.placements).start
        return lambda: nvml.create_gpu_instance(index, prof.profile_id, start)
    gi = rng.choice(gis)
    cis = nvml.compute_instances(index, gi.gi_id)
    if roll < 0.7:
        return lambda: nvml.create_compute_instance(index, gi.gi_id)
    if roll < 0.85 and cis:
        ci = rng.choice(cis)
        return lambda: nvml.destroy_compute_instance(index, gi.gi_id, ci.ci_id)
    return lambda: nvml.destroy_gpu_instance(index, gi.gi_id)  # IN_USE while it has CIs


@pytest.mark.parametrize("seed", [1, 2])
def test_random_call_sequences_give_the_same_results_and_state(tmp_path: Path, seed: int) -> None:
    specs = [SimGpuSpec(s) for s in SKUS]
    (file_nvml, file_admin), (mem_nvml, mem_admin) = _both(tmp_path, specs)
    rng_file, rng_mem = random.Random(seed), random.Random(seed)
    errors = 0
    for step in range(100):
        if step == 40:  # armed faults behave the same: the call fails and changes nothing
            for admin in (file_admin, mem_admin):
                admin.inject_fault("nvmlGpuInstanceCreateComputeInstance", 1, NvmlErrorCode.UNKNOWN)
                admin.inject_fault("nvmlDeviceCreateGpuInstanceWithPlacement", 2, NvmlErrorCode.UNKNOWN)
        a = _outcome(_random_step(rng_file, file_nvml, len(specs)))
        b = _outcome(_random_step(rng_mem, mem_nvml, len(specs)))
        assert a == b, f"step {step}"
        errors += a[0] == "error"
    assert 5 < errors < 95  # the sequence exercised both refusals and successes
    assert file_admin.snapshot() == mem_admin.snapshot()
    assert file_admin.call_counts() == mem_admin.call_counts()
    for index in range(len(specs)):
        assert file_nvml.mig_devices(index) == mem_nvml.mig_devices(index)


def test_admin_changes_and_health_events_work_in_memory(tmp_path: Path) -> None:
    memory = init_memory_sim([SimGpuSpec("A100-40GB"), SimGpuSpec("H100-80GB")])
    nvml, admin = open_sim(memory), SimAdmin(memory)
    with nvml:
        gi = nvml.create_gpu_instance(1, 19, 3)
        ci = nvml.create_compute_instance(1, gi.gi_id)
        admin.add_process(1, gi.gi_id, ci.ci_id, pid=42)
        with pytest.raises(NvmlError) as exc:
            nvml.destroy_compute_instance(1, gi.gi_id, ci.ci_id)
        assert exc.value.code is NvmlErrorCode.IN_USE
        with pytest.raises(NvmlError):
            admin.reset_gpu(1)  # processes run: refused, and nothing changed
        assert [g.gi_id for g in nvml.gpu_instances(1)] == [gi.gi_id]
        admin.remove_process(1, 42)
        admin.reboot()  # Hopper comes back with MIG off
        assert not nvml.mig_mode(1).current and admin.snapshot().gpus[1].gpu_instances == ()
        admin.inject_health_event(0, HealthEventKind.XID, xid=79)
        [event] = nvml.wait_health_events(int(DEADLINE_S * 1000))
        assert event.gpu_index == 0 and event.kind is HealthEventKind.XID and event.xid == 79
        assert admin.snapshot().pending_events == 0


def test_memory_state_loads_a_state_file_and_then_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    init_sim_state(path, [SimGpuSpec("A100-40GB")])
    before = path.read_bytes()
    with open_sim(MemoryState.from_file(path)) as nvml:
        nvml.create_gpu_instance(0, 19, 0)
        assert len(nvml.gpu_instances(0)) == 1
    assert path.read_bytes() == before
    with pytest.raises(FileNotFoundError, match="does not exist"):
        MemoryState.from_file(tmp_path / "missing.json")


def _blocked_call(memory: MemoryState, gpu: int | None) -> tuple[threading.Event, threading.Thread]:
    """A call on `gpu` whose work blocks until the returned event is set."""
    release = threading.Event()
    entered = threading.Event()

    def op(_st: Any) -> None:
        entered.set()
        assert release.wait(DEADLINE_S)

    t = threading.Thread(target=memory.call, args=("nvmlDeviceGetName", op, gpu), daemon=True)
    t.start()
    assert entered.wait(DEADLINE_S)
    return release, t


def _call_finishes(memory: MemoryState, gpu: int, within_s: float) -> bool:
    done = threading.Event()
    threading.Thread(
        target=lambda: (memory.call("nvmlDeviceGetUUID", lambda st: None, gpu), done.set()), daemon=True
    ).start()
    return done.wait(within_s)


def test_a_call_on_one_gpu_does_not_wait_for_another_gpu() -> None:
    memory = init_memory_sim([SimGpuSpec("A100-40GB") for _ in range(3)])
    release, blocked = _blocked_call(memory, 1)
    try:
        assert _call_finishes(memory, 0, DEADLINE_S) and _call_finishes(memory, 2, DEADLINE_S)
        # The same GPU waits (checked with a short window: a pass here cannot be a false failure).
        assert not _call_finishes(memory, 1, 0.2)
    finally:
        release.set()
    blocked.join(DEADLINE_S)
    assert _call_finishes(memory, 1, DEADLINE_S)


def test_latency_is_spent_holding_only_the_gpu_it_addresses() -> None:
    memory = init_memory_sim([SimGpuSpec("A100-40GB") for _ in range(2)])
    SimAdmin(memory).set_latency(nvmlDeviceCreateGpuInstanceWithPlacement=60.0)
    nvml = open_sim(memory)
    nvml.init()
    threading.Thread(target=lambda: nvml.create_gpu_instance(0, 19, 0), daemon=True).start()
    deadline = time.monotonic() + DEADLINE_S
    while SimAdmin(memory).call_counts().get("nvmlDeviceCreateGpuInstanceWithPlacement", 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    # GPU 0 sleeps its 60 s; GPU 1 answers at once (a serialised simulator would make this wait).
    assert _call_finishes(memory, 1, DEADLINE_S)
    assert nvml.gpu(1).uuid


def test_failed_mutation_leaves_the_gpu_untouched() -> None:
    memory = init_memory_sim([SimGpuSpec("A100-40GB")])

    def half_done(st: Any) -> None:
        st.gpus[0].gis.clear()  # a change, then a failure
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    with open_sim(memory) as nvml:
        nvml.create_gpu_instance(0, 19, 0)
        with pytest.raises(pynvml.NVMLError):
            memory.call("nvmlGpuInstanceDestroy", half_done, 0)
        assert len(nvml.gpu_instances(0)) == 1
