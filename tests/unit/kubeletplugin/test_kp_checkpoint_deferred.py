"""The store's state ahead of the disk: a change nobody waits for (`update(wait=False)`) and a change
begun and finished later (`begin`/`finish`) are answered by `load` at once, reach the file only with
a durable write, and behave as documented when that write fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubeletplugin.checkpoint.model import ClaimCheckpoint, ClaimState, PreparedDeviceRecord
from kubeletplugin.checkpoint.store import CheckpointStore

BOOT = "4c8e2a4e-0000-4000-8000-000000000003"
DEVICE = "gpu-0-mig-1g5gb-19-3"


def _claim(uid: str) -> ClaimCheckpoint:
    dev = PreparedDeviceRecord(
        request_names=("gpu",),
        pool="n",
        device_name=DEVICE,
        gpu_index=0,
        gpu_uuid="GPU-a",
        profile="1g.5gb",
        gi_profile_id=19,
        placement_start=3,
        placement_size=1,
        created_gi=True,
        created_ci=True,
    )
    return ClaimCheckpoint(uid, "ns", f"c-{uid}", ClaimState.PREPARE_STARTED, (dev,))


def _disk(path: Path) -> dict[str, ClaimCheckpoint]:
    return CheckpointStore(path, BOOT).load().claims  # a fresh store reads only the file


def test_a_change_not_waited_for_is_answered_at_once_and_written_with_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    store.put_claim(_claim("a"))
    commits = store.commits
    rec = store.update_device("a", DEVICE, wait=False, gi_id=4)
    assert rec.gi_id == 4 and store.commits == commits  # returned without a write
    assert store.get_claim("a").devices[0].gi_id == 4  # type: ignore[union-attr]
    assert _disk(path)["a"].devices[0].gi_id is None  # what a crash now would leave
    store.put_claim(_claim("b"))  # any durable write carries it
    assert _disk(path)["a"].devices[0].gi_id == 4 and set(_disk(path)) == {"a", "b"}


def test_a_change_not_waited_for_survives_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    store.put_claim(_claim("a"))
    store.update_device("a", DEVICE, wait=False, gi_id=4)

    def replace(src: str, dst: str) -> None:
        raise OSError("simulated failed write")

    monkeypatch.setattr("os.replace", replace)
    with pytest.raises(OSError, match="simulated"):
        store.put_claim(_claim("b"))
    monkeypatch.undo()
    # The waited-for change is gone with its batch; the id, which nobody waits for, is kept.
    assert set(store.load().claims) == {"a"}
    assert store.get_claim("a").devices[0].gi_id == 4  # type: ignore[union-attr]
    store.update_device("a", DEVICE, ci_id=0)
    assert _disk(path)["a"].devices[0].gi_id == 4 and _disk(path)["a"].devices[0].ci_id == 0


def test_begun_change_is_seen_before_it_is_durable_and_dropped_when_its_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, BOOT)
    pending = store.begin_put(_claim("a"))
    assert "a" in store.load().claims and not path.exists()
    store.finish(pending)
    assert set(_disk(path)) == {"a"}

    pending = store.begin_put(_claim("b"))
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if "b" in json.loads(Path(src).read_text())["claims"]:
            raise OSError("simulated failed write")
        real_replace(src, dst)

    monkeypatch.setattr("os.replace", replace)
    with pytest.raises(OSError, match="simulated"):
        store.finish(pending)
    assert set(store.load().claims) == {"a"} and set(_disk(path)) == {"a"}


def test_queued_changes_are_replayed_on_a_file_another_process_wrote(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    ours, theirs = CheckpointStore(path, BOOT), CheckpointStore(path, BOOT)
    ours.put_claim(_claim("a"))
    ours.update_device("a", DEVICE, wait=False, gi_id=4)
    theirs.put_claim(_claim("b"))  # written while our id is still only in our state
    seen = ours.load().claims
    assert set(seen) == {"a", "b"} and seen["a"].devices[0].gi_id == 4
    ours.put_claim(_claim("c"))
    assert set(_disk(path)) == {"a", "b", "c"} and _disk(path)["a"].devices[0].gi_id == 4
