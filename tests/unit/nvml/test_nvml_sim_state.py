"""Simulator persistence, fault injection, latency and health events."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim
from driver.nvml.sim.state import SCHEMA_VERSION
from driver.nvml.types import HealthEvent, HealthEventKind, NvmlError, NvmlErrorCode
from tests.unit.nvml.conftest import SimFactory

REPO = Path(__file__).resolve().parents[3]


def test_unknown_sku_names_field_and_lists_allowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"gpus\[1\]\.sku.*'V100'.*A100-40GB.*RTX-PRO-6000"):
        init_sim_state(tmp_path / "s.json", [SimGpuSpec("A30-24GB"), SimGpuSpec("V100")])


def test_overwrite_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    init_sim_state(path, [SimGpuSpec("A30-24GB", uuid="GPU-fixed")])
    with pytest.raises(FileExistsError):
        init_sim_state(path, [SimGpuSpec("A30-24GB")])
    init_sim_state(path, [SimGpuSpec("H20-96GB")], overwrite=True)
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA_VERSION and raw["gpus"][0]["sku"] == "H20-96GB"


def test_gpu_uuid_given_or_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    init_sim_state(a, [SimGpuSpec("A100-40GB"), SimGpuSpec("A100-40GB", uuid="GPU-given")])
    init_sim_state(b, [SimGpuSpec("A100-40GB")])
    with open_sim(a) as na, open_sim(b) as nb:
        assert na.gpu(0).uuid == nb.gpu(0).uuid
        assert na.gpu(1).uuid == "GPU-given"


def test_state_shared_between_port_instances(make_sim: SimFactory) -> None:
    nvml, _, path = make_sim("H100-80GB")
    gi = nvml.create_gpu_instance(0, 9, 4)
    nvml.create_compute_instance(0, gi.gi_id)
    with open_sim(path) as other:
        assert other.gpu_instances(0) == nvml.gpu_instances(0)
        assert other.mig_devices(0) == nvml.mig_devices(0)
        other.destroy_compute_instance(0, gi.gi_id, 0)
    assert nvml.compute_instances(0, gi.gi_id) == []


def test_subprocess_sees_parent_state_and_vice_versa(make_sim: SimFactory) -> None:
    nvml, _, path = make_sim("A100-40GB")
    gi = nvml.create_gpu_instance(0, 14, 2)
    nvml.create_compute_instance(0, gi.gi_id)
    uuid = nvml.mig_uuid(0, gi.gi_id, 0)
    script = textwrap.dedent(
        f"""
        from driver.nvml.sim import open_sim
        with open_sim({str(path)!r}) as n:
            print(n.mig_uuid(0, {gi.gi_id}, 0))
            print(n.create_gpu_instance(0, 9, 4).gi_id)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[0] == uuid
    assert [g.gi_id for g in nvml.gpu_instances(0)] == sorted([gi.gi_id, int(out[1])])


def test_fault_on_nth_call(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("H100-80GB")
    fn = "nvmlDeviceCreateGpuInstanceWithPlacement"
    admin.inject_fault(fn, 2, NvmlErrorCode.UNKNOWN)
    nvml.create_gpu_instance(0, 19, 0)
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, 19, 1)
    assert exc.value.code is NvmlErrorCode.UNKNOWN and exc.value.function == fn
    assert [g.placement.start for g in nvml.gpu_instances(0)] == [0]  # the faulted call did nothing
    nvml.create_gpu_instance(0, 19, 1)  # one-shot
    assert admin.call_counts()[fn] == 3


def test_fault_counts_across_port_instances_and_processes(make_sim: SimFactory) -> None:
    nvml, admin, path = make_sim("A100-40GB")
    admin.inject_fault("nvmlDeviceGetCount", 3, NvmlErrorCode.GPU_IS_LOST)
    nvml.device_count()
    with open_sim(path) as other:
        other.device_count()
        with pytest.raises(NvmlError) as exc:
            nvml.device_count()
    assert exc.value.code is NvmlErrorCode.GPU_IS_LOST
    admin.inject_fault("nvmlDeviceGetCount", 1, NvmlErrorCode.TIMEOUT)
    script = textwrap.dedent(
        f"""
        from driver.nvml.sim import open_sim
        from driver.nvml.types import NvmlError
        with open_sim({str(path)!r}) as n:
            try:
                n.device_count()
            except NvmlError as e:
                print(e.code.name)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "TIMEOUT"
    assert nvml.device_count() == 1
    admin.inject_fault("nvmlDeviceGetCount", 1, NvmlErrorCode.TIMEOUT)
    admin.clear_faults()
    assert nvml.device_count() == 1


def test_latency_default_and_per_function(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A30-24GB")
    admin.set_latency(nvmlDeviceGetCount=0.3)
    start = time.monotonic()
    nvml.device_count()
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    nvml.mig_mode(0)
    assert time.monotonic() - start < 0.3
    admin.set_latency(default_s=0.15)
    start = time.monotonic()
    nvml.mig_mode(0)  # one call: GetMigMode (the device handle was looked up by the first mig_mode)
    assert time.monotonic() - start >= 0.15
    admin.clear_latency()


def test_health_events_are_one_shot(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB", "H100-80GB")
    assert nvml.wait_health_events(10) == []
    admin.inject_health_event(1, HealthEventKind.XID, xid=79)
    admin.inject_health_event(0, HealthEventKind.ECC_DOUBLE_BIT, gi_id=1, ci_id=0)
    events = nvml.wait_health_events(200)
    assert events == [
        HealthEvent(1, HealthEventKind.XID, 79, None, None),
        HealthEvent(0, HealthEventKind.ECC_DOUBLE_BIT, 0, 1, 0),
    ]
    assert nvml.wait_health_events(10) == []
    assert admin.snapshot().pending_events == 0


def test_health_event_wait_times_out(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H200-141GB")
    start = time.monotonic()
    assert nvml.wait_health_events(150) == []
    assert time.monotonic() - start >= 0.15


def test_snapshot_view(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB")
    gi = nvml.create_gpu_instance(0, 9, 0)
    nvml.create_compute_instance(0, gi.gi_id)
    snap = admin.snapshot().gpus[0]
    assert snap.sku == "A100-40GB" and snap.mig_current
    (view,) = snap.gpu_instances
    assert (view.profile_name, view.start, view.size) == ("3g.20gb", 0, 4)
    assert view.compute_instances[0].mig_uuid == nvml.mig_uuid(0, gi.gi_id, 0)


def test_calls_before_init_are_uninitialized(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    init_sim_state(path, [SimGpuSpec("A30-24GB")])
    nvml = open_sim(path)
    with pytest.raises(NvmlError) as exc:
        nvml.device_count()
    assert exc.value.code is NvmlErrorCode.UNINITIALIZED
    missing = open_sim(tmp_path / "absent.json")
    with pytest.raises(NvmlError) as exc:
        missing.init()
    assert exc.value.code is NvmlErrorCode.DRIVER_NOT_LOADED
    assert SimAdmin(path).call_counts() == {}


def test_kill_during_call_latency_leaves_effect_and_no_lock(make_sim: SimFactory) -> None:
    nvml, admin, path = make_sim("H100-80GB")
    admin.set_latency(nvmlDeviceCreateGpuInstanceWithPlacement=30.0)
    script = textwrap.dedent(
        f"""
        from driver.nvml.sim import open_sim
        with open_sim({str(path)!r}) as n:
            n.create_gpu_instance(0, 9, 4)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not admin.snapshot().gpus[0].gpu_instances and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL, as the crash tests do
        proc.wait()
    assert [(g.profile_id, g.placement.start) for g in nvml.gpu_instances(0)] == [(9, 4)]


def test_device_handles_are_looked_up_once_per_init(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB", "H100-80GB")
    for _ in range(3):
        for index in (0, 1):
            nvml.mig_mode(index)
            nvml.gpu_instances(index)
    assert admin.call_counts().get("nvmlDeviceGetHandleByIndex") == 2
    nvml.shutdown()
    nvml.init()  # a new init may hand out new handles: none is kept across it
    nvml.mig_mode(0)
    assert admin.call_counts().get("nvmlDeviceGetHandleByIndex") == 3


def test_health_waits_do_not_count_and_look_up_gpus_every_slice(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("A100-40GB", "H100-80GB")
    for _ in range(5):  # the plugin waits in 100 ms slices
        assert nvml.wait_health_events(1) == []
    counts = admin.call_counts()
    assert counts.get("nvmlDeviceGetCount") == 1
    assert counts.get("nvmlDeviceGetHandleByIndex") == 2
    admin.inject_health_event(1, HealthEventKind.XID, xid=79)
    (event,) = nvml.wait_health_events(10)  # still registered: events arrive between scans
    assert event.gpu_index == 1
