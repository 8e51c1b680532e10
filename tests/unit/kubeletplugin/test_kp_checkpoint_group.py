"""Group commit of checkpoint writes: concurrent updates share one write + fsync, each returns only after
its change is durable, and a failed write fails every update of its batch and keeps the previous file."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.checkpoint.model import Checkpoint, ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.checkpoint.store import CheckpointStore

BOOT = "4c8e2a4e-0000-4000-8000-000000000002"
DEADLINE_S = 10.0


def _claim(uid: str, state: ClaimState = ClaimState.PREPARE_STARTED) -> ClaimCheckpoint:
    dev = PreparedDeviceRecord(
        request_names=("gpu",), pool="n", device_name=f"gpu-{uid}", gpu_index=0, gpu_uuid="GPU-a"
    )
    return ClaimCheckpoint(uid, "ns", f"c-{uid}", state, (dev,))


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _on_disk(path: Path) -> set[str]:
    return set(CheckpointStore(path, BOOT).load().claims)


class FsyncGate:
    """Wraps os.fsync: records the claims each fsynced checkpoint file holds, and holds the first file
    fsync until `release` is set, so that other writers queue up behind it."""

    def __init__(self) -> None:
        self.real = os.fsync
        self.entered = threading.Event()
        self.release = threading.Event()
        self.synced: list[set[str]] = []
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            self.real(fd)
            return
        size = os.fstat(fd).st_size
        claims = set(json.loads(os.pread(fd, size, 0))["claims"])
        first = not self.entered.is_set()
        self.entered.set()
        if first:
            assert self.release.wait(DEADLINE_S)
        self.real(fd)
        with self._lock:
            self.synced.append(claims)


def _start(fn: Callable[[], Any], out: dict[str, Any], key: str) -> threading.Thread:
    def run() -> None:
        try:
            out[key] = fn()
        except Exception as exc:
            out[key] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _hold_first_writer(
    store: CheckpointStore, gate: FsyncGate, out: dict[str, Any], queued: dict[str, Callable[[], Any]]
) -> list[threading.Thread]:
    """Writer "first" enters its fsync and is held there; `queued` then all queue behind it."""
    threads = [_start(lambda: store.put_claim(_claim("first")), out, "first")]
    _wait_for(gate.entered.is_set, "the first writer's fsync")
    threads += [_start(fn, out, key) for key, fn in queued.items()]
    _wait_for(lambda: store.queued() == len(queued), f"{len(queued)} queued writers")
    return threads


def test_queued_writers_share_one_write_and_each_returns_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    gate = FsyncGate()
    monkeypatch.setattr("kubeletplugin.checkpoint.store.os.fsync", gate)
    out: dict[str, Any] = {}
    returned_durable: dict[str, bool] = {}

    def writer(uid: str) -> Callable[[], Any]:
        def run() -> Any:
            store.put_claim(_claim(uid))
            # Returned: an fsynced file already held this claim.
            returned_durable[uid] = any(uid in s for s in gate.synced)
            return uid

        return run

    uids = [f"w{i}" for i in range(12)]
    threads = _hold_first_writer(store, gate, out, {u: writer(u) for u in uids})
    assert not any(u in out for u in uids)  # nobody returned before its data was written
    gate.release.set()
    for t in threads:
        t.join(DEADLINE_S)
    assert [out[u] for u in uids] == uids and out["first"] is None
    assert store.commits == 2  # the held writer's batch, then one batch for all twelve
    assert gate.synced == [{"first"}, {"first", *uids}]
    assert all(returned_durable[u] for u in uids)
    assert _on_disk(path) == {"first", *uids}


def test_mutations_apply_in_arrival_order_and_a_failing_one_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    gate = FsyncGate()
    monkeypatch.setattr("kubeletplugin.checkpoint.store.os.fsync", gate)
    out: dict[str, Any] = {}

    def add_and_count(uid: str) -> Callable[[], Any]:
        def mutate(cp: Checkpoint) -> int:
            cp.claims[uid] = _claim(uid)
            return len(cp.claims)

        return lambda: store.update(mutate)

    threads = _hold_first_writer(store, gate, out, {"a": add_and_count("a")})
    # Queued one by one, so their arrival order is known.
    # A mutation that raises is refused when it is accepted, without waiting for any write.
    threads.append(_start(lambda: store.set_state("missing", ClaimState.PREPARE_COMPLETED), out, "bad"))
    _wait_for(lambda: "bad" in out, "the failing writer refused")
    assert store.queued() == 1 and not gate.release.is_set()
    threads.append(_start(add_and_count("b"), out, "b"))
    _wait_for(lambda: store.queued() == 2, "the third writer queued")
    gate.release.set()
    for t in threads:
        t.join(DEADLINE_S)
    assert (out["a"], out["b"]) == (2, 3)  # each saw the ones before it
    assert isinstance(out["bad"], KeyError)
    assert store.commits == 2
    assert _on_disk(tmp_path / "cp.json") == {"first", "a", "b"}


def test_failed_write_fails_every_waiter_and_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    store.put_claim(_claim("before"))
    gate = FsyncGate()
    monkeypatch.setattr("kubeletplugin.checkpoint.store.os.fsync", gate)
    real_replace = os.replace
    uids = [f"lost{i}" for i in range(5)]

    def replace(src: str, dst: str) -> None:
        # The batch holding the queued writers fails at the rename (a full disk, say).
        if set(uids) & set(json.loads(Path(src).read_text())["claims"]):
            raise OSError("simulated failed write")
        real_replace(src, dst)

    monkeypatch.setattr("kubeletplugin.checkpoint.store.os.replace", replace)
    out: dict[str, Any] = {}
    threads = _hold_first_writer(
        store, gate, out, {u: (lambda u=u: store.put_claim(_claim(u))) for u in uids}
    )
    gate.release.set()
    for t in threads:
        t.join(DEADLINE_S)
    assert out["first"] is None
    assert all(isinstance(out[u], OSError) for u in uids), out
    assert gate.synced[-1] >= set(uids)  # they were in one batch, which failed as a whole
    assert _on_disk(path) == {"before", "first"}  # the previous file
    assert set(store.load().claims) == {"before", "first"}  # and what the store answers
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    store.put_claim(_claim("after"))  # the store goes on
    assert _on_disk(path) == {"before", "first", "after"}


def test_a_change_written_by_another_process_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    ours, theirs = CheckpointStore(path, BOOT), CheckpointStore(path, BOOT)
    ours.put_claim(_claim("a"))
    theirs.put_claim(_claim("b"))  # e.g. the other plugin instance of a rolling update
    assert set(ours.load().claims) == {"a", "b"}
    theirs.remove_claim("a")
    ours.put_claim(_claim("c"))  # built on the file, not on our stale memory
    assert _on_disk(path) == {"b", "c"}


def test_concurrent_writers_all_land(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    out: dict[str, Any] = {}

    def cycle(uid: str) -> None:
        store.put_claim(_claim(uid))
        store.set_state(uid, ClaimState.PREPARE_COMPLETED)
        assert store.get_claim(uid) == _claim(uid, ClaimState.PREPARE_COMPLETED)

    threads = [_start(lambda u=f"u{i}": cycle(u), out, f"u{i}") for i in range(40)]
    for t in threads:
        t.join(DEADLINE_S)
    assert all(v is None for v in out.values()) and len(out) == 40
    loaded = CheckpointStore(path, BOOT).load().claims
    assert set(loaded) == set(out)
    assert all(c.state is ClaimState.PREPARE_COMPLETED for c in loaded.values())
