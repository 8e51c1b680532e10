"""The node's record of prepared claims: what flexmig created on which GPU, for which claim.

Prepare writes `PrepareStarted` before touching NVML and `PrepareCompleted` after the CDI spec exists,
so after a crash the plugin knows which instances may be half-made and which ones it owns. The records,
the file format and its checksum live in `kubeletplugin.checkpoint.model`; this module is the store.
A corrupt file or an unknown version raises `CheckpointCorrupt` rather than starting empty. A different
boot ID is the one case where starting empty is right, because GPU and compute instances do not survive
a reboot.

Writes go to a temp file in the same directory, are fsynced, renamed over the target and the directory
is fsynced (driver/atomicfile.py), so a crash leaves either the old or the new checkpoint (plus, at
worst, a stray temp file that the next load removes).

Group commit: claims on different GPUs are prepared in parallel and each makes several durable writes,
so writes that arrive while one is being fsynced queue up and the next writer to run ("the leader")
applies all of them, in arrival order, and makes them durable with one write + fsync. Every `update`
still returns only after the file holding its change is durable; a failed write fails every update of
its batch and leaves the previous file (and what `load` returns) as it was. `load` answers from the
last durable state kept in memory, rereading the file only when its identity on disk (inode, size,
times) changed, i.e. when another process wrote it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from driver.atomicfile import write_atomically
from kubeletplugin.checkpoint.model import (
    Checkpoint,
    CheckpointCorrupt,
    ClaimCheckpoint,
    ClaimState,
    PreparedDeviceRecord,
    checkpoint_from_json,
    checkpoint_to_json,
)

DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

_log = structlog.get_logger(__name__)
_T = TypeVar("_T")
_FileId = tuple[int, int, int, int] | None  # (inode, size, mtime ns, ctime ns); None: no file


def read_boot_id(path: str | os.PathLike[str] = DEFAULT_BOOT_ID_PATH) -> str:
    boot_id = Path(path).read_text(encoding="ascii").strip()
    if not boot_id:
        raise ValueError(f"boot id file {os.fspath(path)!r} is empty")
    return boot_id


def _copy(cp: Checkpoint) -> Checkpoint:
    # Claims are frozen dataclasses, so a new dict is a full copy as far as callers can mutate it.
    return Checkpoint(boot_id=cp.boot_id, claims=dict(cp.claims))


class _Write(Generic[_T]):
    """One queued `update`: its mutation and, once its batch is written, its result or error."""

    __slots__ = ("done", "error", "mutate", "result")

    def __init__(self, mutate: Callable[[Checkpoint], _T]) -> None:
        self.mutate = mutate
        self.done = False
        self.result: _T | None = None
        self.error: BaseException | None = None


# --- the store -----------------------------------------------------------------------------------


class CheckpointStore:
    """Durable, group-committed load/modify/save of the checkpoint at `path`.

    An flock on `<path>.lock` is held while a batch is written (and while the file is reread), so a
    second plugin instance during a rolling update never interleaves its writes with ours.
    """

    def __init__(self, path: str | os.PathLike[str], boot_id: str) -> None:
        if not boot_id:
            raise ValueError("boot_id must not be empty")
        self.path = Path(path)
        self.boot_id = boot_id
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._cond = threading.Condition()
        # All below are guarded by `_cond`.
        self._queue: list[_Write[Any]] = []
        self._writing = False  # a leader is applying and writing a batch
        self._durable: Checkpoint | None = None  # None: (re)read the file on next use
        self._file_id: _FileId = None  # identity of the file `_durable` came from / went to
        self._generation = 0  # bumped whenever `_durable` is replaced by a commit
        self.commits = 0  # batches made durable (each one write + fsync); for tests and benchmarks
        # The checkpoint a leader thread is building: store calls made from inside a mutation run on
        # it directly (queueing them would wait for the very batch that is running them).
        self._local = threading.local()

    # -- file access (callers hold the flock) --

    @contextlib.contextmanager
    def _flocked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _disk_id(self) -> _FileId:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _temp_prefix(self) -> str:
        return f".{self.path.name}."

    def _remove_stale_temps(self) -> None:
        # Only a writer that crashed (or failed) between mkstemp and rename leaves these; we hold the
        # flock, so no live writer owns one.
        for stray in self.path.parent.glob(self._temp_prefix() + "*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                _log.info("removed temp file left by an interrupted checkpoint write", path=str(stray))

    def _read_disk(self) -> tuple[Checkpoint, _FileId]:
        self._remove_stale_temps()
        file_id = self._disk_id()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id), None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointCorrupt(f"{self.path}: not valid JSON ({exc})") from exc
        cp = checkpoint_from_json(doc, str(self.path))
        if cp.boot_id != self.boot_id:
            _log.warning(
                "node rebooted since the checkpoint was written; its GPU and compute instances no longer"
                " exist, starting with an empty checkpoint",
                path=str(self.path),
                checkpoint_boot_id=cp.boot_id,
                current_boot_id=self.boot_id,
                dropped_claims=sorted(cp.claims),
            )
            return Checkpoint(boot_id=self.boot_id), file_id
        return cp, file_id

    def _write_disk(self, cp: Checkpoint) -> _FileId:
        # Compact JSON: the C encoder is used only without indentation, and this runs per batch.
        data = json.dumps(checkpoint_to_json(cp), sort_keys=True).encode() + b"\n"
        # File and directory fsync: `update` promises a durable change when it returns. The temp name
        # is the one `_remove_stale_temps` looks for.
        write_atomically(self.path, data, durable=True, prefix=self._temp_prefix(), suffix=".tmp")
        return self._disk_id()

    # -- reading --

    def load(self) -> Checkpoint:
        """The last durable checkpoint (a copy the caller may change freely)."""
        building: Checkpoint | None = getattr(self._local, "building", None)
        if building is not None:
            return _copy(building)
        with self._cond:
            if self._durable is not None and (self._writing or self._disk_id() == self._file_id):
                return _copy(self._durable)
            generation = self._generation
        with self._flocked():
            cp, file_id = self._read_disk()
        with self._cond:
            # A commit that finished meanwhile is newer than what we read: keep it.
            if generation == self._generation and not self._writing:
                self._durable, self._file_id = cp, file_id
        return _copy(cp)

    # -- writing --

    def update(self, mutate: Callable[[Checkpoint], _T]) -> _T:
        """Run `mutate` on the current checkpoint and make the result durable before returning.

        Mutations run one at a time, in arrival order, each on the state the previous ones left. A
        mutation that raises changes nothing and its caller gets the exception; a failed write fails
        every caller of its batch. Called from inside a mutation, it runs at once on the checkpoint
        being built and becomes durable with the outer mutation's batch.
        """
        building: Checkpoint | None = getattr(self._local, "building", None)
        if building is not None:
            return mutate(building)
        write: _Write[_T] = _Write(mutate)
        with self._cond:
            self._queue.append(write)
            while not write.done and self._writing:
                self._cond.wait()
            lead = not write.done
            if lead:
                batch, self._queue = self._queue, []
                self._writing = True
        if lead:
            self._lead(batch)
        if write.error is not None:
            raise write.error
        return write.result  # type: ignore[return-value]

    def _lead(self, batch: list[_Write[Any]]) -> None:
        durable: Checkpoint | None = None
        file_id: _FileId = None
        failure: BaseException | None = None
        try:
            with self._flocked():
                with self._cond:
                    cached = self._durable if self._disk_id() == self._file_id else None
                base, base_id = (cached, self._file_id) if cached is not None else self._read_disk()
                work = self._apply(base, batch)
                if work.claims == base.claims:
                    durable, file_id = base, base_id  # nothing changed: nothing to make durable
                else:
                    durable, file_id = work, self._write_disk(work)
        except BaseException as exc:
            failure = exc
        with self._cond:
            if failure is None:
                self._durable, self._file_id = durable, file_id
                self._generation += 1
                self.commits += 1
            else:
                # The file is the previous one (or a stranger's); reread it, sweeping our temp files.
                self._durable = None
                for write in batch:
                    write.error, write.result = failure, None
            for write in batch:
                write.done = True
            self._writing = False
            self._cond.notify_all()

    def _apply(self, base: Checkpoint, batch: list[_Write[Any]]) -> Checkpoint:
        work = _copy(base)
        self._local.building = work
        try:
            for write in batch:
                before = dict(work.claims)
                try:
                    write.result = write.mutate(work)
                except Exception as exc:  # only this caller's mutation failed; the batch goes on
                    work.claims.clear()
                    work.claims.update(before)
                    write.error = exc
        finally:
            self._local.building = None
        return work

    def save(self, cp: Checkpoint) -> None:
        if cp.boot_id != self.boot_id:
            raise ValueError(f"checkpoint boot id {cp.boot_id!r} is not this boot's {self.boot_id!r}")
        claims = dict(cp.claims)

        def _replace(current: Checkpoint) -> None:
            current.claims.clear()
            current.claims.update(claims)

        self.update(_replace)

    def queued(self) -> int:
        """Updates waiting for the next batch (for tests and benchmarks)."""
        with self._cond:
            return len(self._queue)

    # --- typed helpers ---

    def get_claim(self, uid: str) -> ClaimCheckpoint | None:
        return self.load().claims.get(uid)

    def put_claim(self, claim: ClaimCheckpoint) -> None:
        def _put(cp: Checkpoint) -> None:
            cp.claims[claim.uid] = claim

        self.update(_put)

    def remove_claim(self, uid: str) -> bool:
        return self.update(lambda cp: cp.claims.pop(uid, None) is not None)

    def set_state(self, uid: str, state: ClaimState) -> ClaimCheckpoint:
        def _set(cp: Checkpoint) -> ClaimCheckpoint:
            claim = _require(cp, uid)
            cp.claims[uid] = dataclasses.replace(claim, state=state)
            return cp.claims[uid]

        return self.update(_set)

    def update_device(self, uid: str, device_name: str, **changes: Any) -> PreparedDeviceRecord:
        """Replace fields of one device record, e.g. the realised gi_id/ci_id/mig_uuid after creation."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(PreparedDeviceRecord)}
        if unknown:
            raise TypeError(f"unknown PreparedDeviceRecord fields: {sorted(unknown)}")

        def _upd(cp: Checkpoint) -> PreparedDeviceRecord:
            claim = _require(cp, uid)
            old = claim.device(device_name)
            if old is None:
                raise KeyError(f"claim {uid} has no device {device_name!r} in the checkpoint")
            new = dataclasses.replace(old, **changes)
            devices = tuple(new if d.device_name == device_name else d for d in claim.devices)
            cp.claims[uid] = dataclasses.replace(claim, devices=devices)
            return new

        return self.update(_upd)

    def record_mig_realised(
        self,
        uid: str,
        device_name: str,
        *,
        gi_id: int,
        ci_id: int,
        mig_uuid: str,
        created_gi: bool,
        created_ci: bool,
    ) -> PreparedDeviceRecord:
        return self.update_device(
            uid,
            device_name,
            gi_id=gi_id,
            ci_id=ci_id,
            mig_uuid=mig_uuid,
            created_gi=created_gi,
            created_ci=created_ci,
        )

    def complete(self, uid: str, cdi_ids: Mapping[str, tuple[str, ...]]) -> ClaimCheckpoint:
        """Store each device's CDI ids and mark the claim `PrepareCompleted` in one write."""

        def _done(cp: Checkpoint) -> ClaimCheckpoint:
            claim = _require(cp, uid)
            missing = set(cdi_ids) - {d.device_name for d in claim.devices}
            if missing:
                raise KeyError(f"claim {uid} has no devices {sorted(missing)} in the checkpoint")
            devices = tuple(
                dataclasses.replace(d, cdi_device_ids=cdi_ids.get(d.device_name, d.cdi_device_ids))
                for d in claim.devices
            )
            cp.claims[uid] = dataclasses.replace(claim, devices=devices, state=ClaimState.PREPARE_COMPLETED)
            return cp.claims[uid]

        return self.update(_done)


def _require(cp: Checkpoint, uid: str) -> ClaimCheckpoint:
    claim = cp.claims.get(uid)
    if claim is None:
        raise KeyError(f"claim {uid} is not in the checkpoint")
    return claim
