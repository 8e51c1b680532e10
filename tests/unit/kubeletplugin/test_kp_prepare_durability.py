"""What prepare makes durable when, and that a crash at each point that is no longer fsynced recovers.

Prepare waits for two durable checkpoint writes: PrepareStarted (the ownership intent, before any
NVML change) and PrepareCompleted (before kubelet is answered). The GI and CI ids are recorded in the
store's state at once but reach the disk only with the next durable write, and the CDI spec is renamed
into place without an fsync (docs/kubelet-plugin.md, "Crash model"). Here the plugin is "killed" at
the crashpoints after those steps (kubeletplugin/agent/crashpoints.py: the thread blocks for good,
nothing more is written), and a second plugin on the same simulator state and checkpoint file runs
the startup reconcile: what the disk held must be enough to leave no instance behind and to let the
claim be prepared again. The simulator runs on its state file, so the second plugin sees exactly the
GPU state the first one left.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimAdmin, SimGpuSpec
from kubeletplugin.checkpoint.model import ClaimState
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef

NODE = "n1"
DEADLINE_S = 30.0


def _start(tmp_path: Path, api: FakeApi, crash: frozenset[str] = frozenset()) -> SimNode:
    """The plugin on the file-backed simulator; made again in `tmp_path`, a restart."""
    return make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], api=api, crash=crash)


def _claim(api: FakeApi, n: int, device: str) -> ClaimRef:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    result = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
    api.claims[("ns", f"c{n}")] = ClaimView(
        "ns", f"c{n}", uid, (result,), (PodRef("ns", f"p{n}", f"pod-{n}"),)
    )
    return ClaimRef(namespace="ns", uid=uid, name=f"c{n}")


def _on_disk(tmp_path: Path) -> dict[str, dict[str, object]]:
    """The checkpoint's claims as the file holds them (what a crash leaves)."""
    doc = json.loads((tmp_path / "state" / "checkpoint.json").read_text())
    claims: dict[str, dict[str, object]] = doc["claims"]
    return claims


def _instances(tmp_path: Path) -> list[tuple[int, int]]:
    """(GI start, number of CIs) of every GI on the simulated GPU."""
    gpu = SimAdmin(tmp_path / "sim.json").snapshot().gpus[0]
    return [(gi.start, len(gi.compute_instances)) for gi in gpu.gpu_instances]


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _kill_at(tmp_path: Path, api: FakeApi, point: str, ref: ClaimRef) -> None:
    """Prepare `ref` in a plugin armed at `point`; return once it stopped there for good."""
    doomed = _start(tmp_path, api, frozenset({point}))
    threading.Thread(target=doomed.preparer.prepare, args=([ref],), daemon=True).start()
    _wait_for(lambda: (tmp_path / "marker").exists(), f"crashpoint {point}")
    doomed.preparer.close()  # the blocked thread stays blocked: this plugin writes nothing more


@pytest.mark.parametrize(
    ("point", "cis"),
    [("after-gi-create", 0), ("after-ci-create", 1), ("after-cdi-write", 1), ("before-checkpoint-commit", 1)],
)
def test_crash_before_the_ids_are_durable_is_rolled_back_by_the_intent(
    tmp_path: Path, point: str, cis: int
) -> None:
    api = FakeApi()
    ref = _claim(api, 1, "gpu-0-mig-1g5gb-19-3")
    _kill_at(tmp_path, api, point, ref)
    # The crash model's newly non-durable point: the instance exists, the disk has only the intent.
    assert _instances(tmp_path) == [(3, cis)]
    [entry] = _on_disk(tmp_path).values()
    assert entry["state"] == ClaimState.PREPARE_STARTED.value
    [dev] = entry["devices"]  # type: ignore[misc]
    assert dev["createdGI"] is True and dev["giID"] is None and dev["ciID"] is None

    restarted = _start(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.rolled_back == [ref.uid] and report.destroyed_instances == 1, report
        assert report.foreign_instances == [] and report.errors == []
        assert _instances(tmp_path) == [] and _on_disk(tmp_path) == {}
        assert not (tmp_path / "cdi" / f"{DRIVER_NAME}-{ref.uid}.json").exists()
        # kubelet's retry prepares the claim from scratch.
        assert restarted.preparer.prepare([ref])[ref.uid].error == ""
        assert _instances(tmp_path) == [(3, 1)]
        assert _on_disk(tmp_path)[ref.uid]["state"] == ClaimState.PREPARE_COMPLETED.value
    finally:
        restarted.preparer.close()


def test_answered_prepare_is_durable_and_its_spec_is_rewritten_at_start(tmp_path: Path) -> None:
    """PrepareCompleted (with the ids) is on disk when kubelet is answered; the spec, renamed into
    place without an fsync, is rewritten from the checkpoint by the startup reconcile."""
    api = FakeApi()
    ref = _claim(api, 1, "gpu-0-mig-1g5gb-19-3")
    first = _start(tmp_path, api)
    try:
        assert first.preparer.prepare([ref])[ref.uid].error == ""
    finally:
        first.preparer.close()
    [dev] = _on_disk(tmp_path)[ref.uid]["devices"]  # type: ignore[misc]
    assert dev["giID"] is not None and dev["ciID"] is not None and dev["migUUID"]
    spec = tmp_path / "cdi" / f"{DRIVER_NAME}-{ref.uid}.json"
    written = json.loads(spec.read_text())
    spec.write_bytes(b"")  # what a power loss may leave of a file that was never fsynced

    restarted = _start(tmp_path, api)
    try:
        report = restarted.reconcile()
        assert report.adopted == [ref.uid] and report.errors == []
        assert json.loads(spec.read_text()) == written
        assert stat.S_IMODE(os.stat(spec).st_mode) == 0o644
        assert _instances(tmp_path) == [(3, 1)]
    finally:
        restarted.preparer.close()


class HeldFsync:
    """os.fsync that holds the first checkpoint file fsync (the intent's) until released."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.real = os.fsync
        self.dir = checkpoint_dir
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        held = not self.entered.is_set() and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == self.dir
        if held and stat.S_ISREG(os.fstat(fd).st_mode):
            self.entered.set()
            assert self.release.wait(DEADLINE_S)
        self.real(fd)


def test_no_gpu_lock_is_held_while_the_intent_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While claim A's intent waits for its fsync, another claim of the same GPU prepares, and a claim
    overlapping A's placement is refused: A's entry fences it off before it is durable."""
    api = FakeApi()
    a = _claim(api, 1, "gpu-0-mig-1g5gb-19-3")
    other = _claim(api, 2, "gpu-0-mig-1g5gb-19-5")
    overlapping = _claim(api, 3, "gpu-0-mig-2g10gb-14-2")
    plugin = _start(tmp_path, api)
    gate = HeldFsync(tmp_path / "state")
    monkeypatch.setattr("os.fsync", gate)
    out: dict[str, str] = {}
    t = threading.Thread(target=lambda: out.update(a=plugin.preparer.prepare([a])[a.uid].error), daemon=True)
    try:
        t.start()
        _wait_for(gate.entered.is_set, "claim A's intent fsync")
        assert plugin.store.get_claim(a.uid) is not None  # in the store's state, not yet on disk
        assert not (tmp_path / "state" / "checkpoint.json").exists()
        # Without a GPU lock held across A's fsync, these would wait for it (and time out the test).
        # The other claim's writes queue behind A's held one, so it is released from here.
        done: dict[str, str] = {}
        t2 = threading.Thread(
            target=lambda: done.update(o=plugin.preparer.prepare([other])[other.uid].error), daemon=True
        )
        t2.start()
        refused: dict[str, str] = {}
        t3 = threading.Thread(
            target=lambda: refused.update(e=plugin.preparer.prepare([overlapping])[overlapping.uid].error),
            daemon=True,
        )
        t3.start()
        t3.join(DEADLINE_S)
        assert not t3.is_alive(), "the overlapping claim waited for claim A's fsync"
        assert a.uid in refused["e"] and "overlaps" in refused["e"], refused
        _wait_for(lambda: plugin.store.queued() >= 1, "the other claim's intent queued")
        gate.release.set()
        t.join(DEADLINE_S)
        t2.join(DEADLINE_S)
        assert out == {"a": ""} and done == {"o": ""}
        assert _instances(tmp_path) == [(3, 1), (5, 1)]
        assert set(_on_disk(tmp_path)) == {a.uid, other.uid}
    finally:
        gate.release.set()
        plugin.preparer.close()


def test_a_failed_intent_write_fails_the_claim_with_nothing_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi()
    ref = _claim(api, 1, "gpu-0-mig-1g5gb-19-3")
    plugin = _start(tmp_path, api)
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if Path(dst).name == "checkpoint.json":
            raise OSError("simulated full disk")
        real_replace(src, dst)

    try:
        monkeypatch.setattr("os.replace", replace)
        assert "simulated full disk" in plugin.preparer.prepare([ref])[ref.uid].error
        assert _instances(tmp_path) == [] and plugin.store.load().claims == {}
        monkeypatch.undo()
        assert plugin.preparer.prepare([ref])[ref.uid].error == ""  # the retry goes through
        assert _instances(tmp_path) == [(3, 1)]
    finally:
        plugin.preparer.close()
