"""The node's record of prepared claims: what flexmig created on which GPU, for which claim.

Prepare writes `PrepareStarted` before touching NVML and `PrepareCompleted` after the CDI spec exists,
so after a crash the plugin knows which instances may be half-made and which ones it owns. The records,
the file format and its checksum live in `kubeletplugin.checkpoint_model`; this module is the store.
A corrupt file or an unknown version raises `CheckpointCorrupt` rather than starting empty. A different
boot ID is the one case where starting empty is right, because GPU and compute instances do not survive
a reboot.

Writes go to a temp file in the same directory, are fsynced, renamed over the target and the directory
is fsynced, so a crash leaves either the old or the new checkpoint (plus, at worst, a stray temp file
that the next load removes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import structlog

from kubeletplugin.checkpoint_model import (
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


def read_boot_id(path: str | os.PathLike[str] = DEFAULT_BOOT_ID_PATH) -> str:
    boot_id = Path(path).read_text(encoding="ascii").strip()
    if not boot_id:
        raise ValueError(f"boot id file {os.fspath(path)!r} is empty")
    return boot_id


# --- the store -----------------------------------------------------------------------------------


class CheckpointStore:
    """Load/modify/save under one lock: a thread lock for this process, an flock for other processes
    (a second plugin instance during a rolling update must not interleave its writes with ours)."""

    def __init__(self, path: str | os.PathLike[str], boot_id: str) -> None:
        if not boot_id:
            raise ValueError("boot_id must not be empty")
        self.path = Path(path)
        self.boot_id = boot_id
        self._lock = threading.RLock()
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        # The flock fd and how deeply the owning thread is nested in `_locked`. Both are only read or
        # changed while holding `_lock`. One fd for the whole nesting: a second open() of the lock
        # file is a second open file description, and flock on it would wait for the first one,
        # i.e. for ourselves, forever.
        self._fd: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    fd, self._fd = self._fd, None
                    os.close(fd)  # closing releases the flock

    def _temp_prefix(self) -> str:
        return f".{self.path.name}."

    def _remove_stale_temps(self) -> None:
        # Only a writer that crashed between mkstemp and rename leaves these; we hold the lock, so no
        # live writer owns one.
        for stray in self.path.parent.glob(self._temp_prefix() + "*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                _log.info("removed temp file left by an interrupted checkpoint write", path=str(stray))

    def _load_unlocked(self) -> Checkpoint:
        self._remove_stale_temps()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id)
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
            return Checkpoint(boot_id=self.boot_id)
        return cp

    def _save_unlocked(self, cp: Checkpoint) -> None:
        if cp.boot_id != self.boot_id:
            raise ValueError(f"checkpoint boot id {cp.boot_id!r} is not this boot's {self.boot_id!r}")
        data = json.dumps(checkpoint_to_json(cp), indent=1, sort_keys=True).encode() + b"\n"
        directory = self.path.parent
        fd, tmp = tempfile.mkstemp(prefix=self._temp_prefix(), suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def load(self) -> Checkpoint:
        with self._locked():
            return self._load_unlocked()

    def save(self, cp: Checkpoint) -> None:
        with self._locked():
            self._save_unlocked(cp)

    def update(self, mutate: Callable[[Checkpoint], _T]) -> _T:
        """Run `mutate` on the freshly loaded checkpoint and save it, all under the lock."""
        with self._locked():
            cp = self._load_unlocked()
            result = mutate(cp)
            self._save_unlocked(cp)
            return result

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
