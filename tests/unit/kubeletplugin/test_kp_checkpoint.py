"""Checkpoint: round trip, corruption, version, boot ID change, crash atomicity, locking."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from kubeletplugin.checkpoint.model import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    ClaimCheckpoint,
    ClaimState,
    PreparedDeviceRecord,
    checkpoint_to_json,
)
from kubeletplugin.checkpoint.store import CheckpointStore, read_boot_id
from kubeletplugin.shared.capacity import SharedShare

BOOT = "4c8e2a4e-0000-4000-8000-000000000001"


def _claim(uid: str = "uid-1", state: ClaimState = ClaimState.PREPARE_STARTED) -> ClaimCheckpoint:
    return ClaimCheckpoint(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        state=state,
        devices=(
            PreparedDeviceRecord(
                request_names=("gpu",),
                pool="node-a",
                device_name="gpu-0-mig-1g5gb-19-3",
                gpu_index=0,
                gpu_uuid="GPU-aaaa",
                profile="1g.5gb",
                gi_profile_id=19,
                placement_start=3,
                placement_size=1,
            ),
            PreparedDeviceRecord(
                request_names=("whole",), pool="node-a", device_name="gpu-1", gpu_index=1, gpu_uuid="GPU-b"
            ),
        ),
    )


def test_missing_file_is_empty(tmp_path: Path) -> None:
    cp = CheckpointStore(tmp_path / "cp.json", BOOT).load()
    assert cp == Checkpoint(boot_id=BOOT)


def test_round_trip_and_typed_helpers(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "sub" / "cp.json", BOOT)
    store.put_claim(_claim())
    rec = store.record_mig_realised(
        "uid-1", "gpu-0-mig-1g5gb-19-3", gi_id=0, ci_id=0, mig_uuid="MIG-x", created_gi=True, created_ci=True
    )
    assert rec.realised and rec.gi_id == 0 and rec.is_mig
    done = store.complete(
        "uid-1", {"gpu-0-mig-1g5gb-19-3": ("gpu.flexmig.dev/mig=uid-1-gpu-0-mig-1g5gb-19-3",)}
    )
    assert done.state is ClaimState.PREPARE_COMPLETED
    reloaded = CheckpointStore(tmp_path / "sub" / "cp.json", BOOT).load()
    claim = reloaded.claims["uid-1"]
    assert claim == done
    assert claim.device("gpu-1") is not None and not claim.device("gpu-1").is_mig  # type: ignore[union-attr]
    assert store.set_state("uid-1", ClaimState.PREPARE_STARTED).state is ClaimState.PREPARE_STARTED
    assert store.remove_claim("uid-1") is True and store.remove_claim("uid-1") is False
    assert store.load().claims == {}


def test_helpers_reject_unknown_claims_and_fields(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    with pytest.raises(KeyError, match="not in the checkpoint"):
        store.set_state("nope", ClaimState.PREPARE_COMPLETED)
    store.put_claim(_claim())
    with pytest.raises(KeyError, match="no device"):
        store.update_device("uid-1", "gpu-9", gi_id=1)
    with pytest.raises(TypeError, match="unknown"):
        store.update_device("uid-1", "gpu-1", colour="red")
    with pytest.raises(KeyError, match="no devices"):
        store.complete("uid-1", {"gpu-9": ()})


def test_file_format(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    CheckpointStore(path, BOOT).put_claim(_claim())
    doc = json.loads(path.read_text())
    assert doc["version"] == CHECKPOINT_VERSION and doc["bootID"] == BOOT
    assert len(doc["checksum"]) == 64
    dev = doc["claims"]["uid-1"]["devices"][0]
    assert (
        dev["deviceName"] == "gpu-0-mig-1g5gb-19-3" and dev["migUUID"] is None and dev["createdGI"] is False
    )


def test_checksum_mismatch_raises(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    CheckpointStore(path, BOOT).put_claim(_claim())
    doc = json.loads(path.read_text())
    doc["claims"]["uid-1"]["devices"][0]["giID"] = 7  # edit without re-checksumming
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        CheckpointStore(path, BOOT).load()


@pytest.mark.parametrize("text", ["{not json", "", "[]"])
def test_garbage_raises(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cp.json"
    path.write_text(text)
    with pytest.raises(CheckpointCorrupt):
        CheckpointStore(path, BOOT).load()


def test_unknown_version_raises(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    doc = checkpoint_to_json(Checkpoint(boot_id=BOOT))
    doc["version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match="unknown checkpoint version 99"):
        CheckpointStore(path, BOOT).load()


def test_structurally_bad_but_checksummed_raises(tmp_path: Path) -> None:
    # A bug that wrote a consistent checksum over a bad claim must still be refused, naming the field.
    import hashlib

    path = tmp_path / "cp.json"
    payload = {"version": CHECKPOINT_VERSION, "bootID": BOOT, "claims": {"u": {"uid": "u", "namespace": "n"}}}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    payload["checksum"] = hashlib.sha256(canonical).hexdigest()
    path.write_text(json.dumps(payload))
    with pytest.raises(CheckpointCorrupt, match="claim u: field 'name'"):
        CheckpointStore(path, BOOT).load()


def test_boot_id_change_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    CheckpointStore(path, "old-boot").put_claim(_claim())
    store = CheckpointStore(path, BOOT)
    assert store.load() == Checkpoint(boot_id=BOOT)
    store.put_claim(_claim("uid-2"))  # the next save replaces the stale file
    assert set(store.load().claims) == {"uid-2"}
    with pytest.raises(ValueError, match="boot id"):
        store.save(Checkpoint(boot_id="other"))


def test_crash_leaves_old_checkpoint_and_temp_is_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    store.put_claim(_claim())
    before = path.read_bytes()
    # A writer that died between writing the temp file and the rename.
    stray = tmp_path / ".cp.json.abc123.tmp"
    stray.write_text('{"half": ')

    def boom(src: str, dst: str) -> None:
        raise OSError("simulated crash before rename")

    monkeypatch.setattr("kubeletplugin.checkpoint.store.os.replace", boom)
    with pytest.raises(OSError, match="simulated crash"):
        store.put_claim(_claim("uid-2"))
    monkeypatch.undo()
    assert path.read_bytes() == before  # old checkpoint intact
    assert set(store.load().claims) == {"uid-1"}
    assert not stray.exists()  # load removed the stray temp file
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_concurrent_updates_are_serialised(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    threads = [threading.Thread(target=store.put_claim, args=(_claim(f"uid-{i}"),)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(store.load().claims) == {f"uid-{i}" for i in range(16)}


def test_read_boot_id(tmp_path: Path) -> None:
    f = tmp_path / "boot_id"
    f.write_text(BOOT + "\n")
    assert read_boot_id(f) == BOOT
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_boot_id(f)
    with pytest.raises(ValueError, match="boot_id"):
        CheckpointStore(tmp_path / "cp.json", "")


def _shared_claim() -> ClaimCheckpoint:
    rec = PreparedDeviceRecord(
        request_names=("gpus",),
        pool="node-a",
        device_name="gpu-2-shared",
        gpu_index=2,
        gpu_uuid="GPU-c",
        shares=(SharedShare("7d9c6c0e-2f4b-4b8e-9d71-5b7e8f0a1c23", 8000, 30, 1), SharedShare(None, 1, 0, 1)),
    )
    return ClaimCheckpoint("uid-s", "ns", "s", ClaimState.PREPARE_COMPLETED, (rec,))


def test_shared_records_round_trip_and_older_files_still_load(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    store.put_claim(_shared_claim())
    store.put_claim(_claim())
    loaded = store.load().claims
    assert loaded["uid-s"] == _shared_claim() and loaded["uid-s"].devices[0].is_shared
    assert not loaded["uid-1"].devices[0].is_shared
    doc = json.loads((tmp_path / "cp.json").read_text())
    # MIG/whole records keep the layout of earlier versions: files written before shares load.
    assert all("shares" not in d for d in doc["claims"]["uid-1"]["devices"])
    assert doc["claims"]["uid-s"]["devices"][0]["shares"][1] == {
        "shareID": None,
        "memoryMiB": 1,
        "cores": 0,
        "shares": 1,
    }


@pytest.mark.parametrize(
    "bad", [{}, [{"shareID": 3, "memoryMiB": 1, "cores": 0, "shares": 1}], [{"memoryMiB": True, "cores": 0}]]
)
def test_bad_shares_are_corrupt(tmp_path: Path, bad: object) -> None:
    payload = checkpoint_to_json(Checkpoint(BOOT, {"uid-s": _shared_claim()}))
    payload["claims"]["uid-s"]["devices"][0]["shares"] = bad
    del payload["checksum"]
    payload["checksum"] = hashlib.sha256(
        json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()
    (tmp_path / "cp.json").write_text(json.dumps(payload))
    with pytest.raises(CheckpointCorrupt, match="shares"):
        CheckpointStore(tmp_path / "cp.json", BOOT).load()


def _in_thread(fn: object, timeout_s: float = 5.0) -> list[object]:
    """Run `fn` in a daemon thread; a deadlock fails the test (the thread is left blocked) instead of
    hanging the whole run."""
    out: list[object] = []

    def run() -> None:
        out.append(fn())  # type: ignore[operator]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "a nested checkpoint store call deadlocked"
    return out


def test_nested_store_calls_do_not_deadlock(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    store.put_claim(_claim("a"))

    def nested() -> object:
        # A mutation that itself reads and writes through the store, three levels deep.
        def mutate(cp: Checkpoint) -> object:
            inner = store.get_claim("a")
            store.put_claim(_claim("b"))
            return (inner, store.update(lambda cp2: sorted(cp2.claims)))

        return store.update(mutate)

    [(inner, seen)] = _in_thread(nested)
    assert inner is not None and inner.uid == "a"
    assert seen == ["a", "b"]


def test_flock_released_after_nesting_other_process_can_lock(tmp_path: Path) -> None:
    import fcntl
    import os

    store = CheckpointStore(tmp_path / "cp.json", BOOT)
    _in_thread(lambda: store.update(lambda cp: store.load()))
    fd = os.open(tmp_path / "cp.json.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held
    finally:
        os.close(fd)
