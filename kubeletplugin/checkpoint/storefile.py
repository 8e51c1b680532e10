"""The checkpoint file itself: its flock, reading and verifying it, and replacing it durably.

`kubeletplugin.checkpoint.store` decides when to read and write; this module is how. Writes go to a
temp file in the same directory, are fsynced, renamed over the target and the directory is fsynced
(driver/atomicfile.py), so a crash leaves either the old or the new checkpoint (plus, at worst, a stray
temp file that the next read removes). The flock on `<path>.lock` keeps a second plugin instance (a
rolling update) from interleaving its writes with ours.

Each write holds every claim, so the encoded text of each claim is cached (by the claim object, which
is immutable) and only the claims that changed since the last write are encoded again: with many
claims in flight, encoding the whole file for every batch made a write's cost grow with the number of
claims on the node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import structlog

from driver.atomicfile import write_atomically
from kubeletplugin.checkpoint.model import (
    Checkpoint,
    CheckpointCorrupt,
    ClaimCheckpoint,
    checkpoint_bytes,
    checkpoint_from_json,
    claim_entry,
)

_log = structlog.get_logger(__name__)

FileId = tuple[int, int, int, int] | None  # (inode, size, mtime ns, ctime ns); None: no file


class CheckpointFile:
    """Read and write the checkpoint at `path`; callers hold `flocked()` around both."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self._lock_path = path.with_name(path.name + ".lock")
        # uid -> (the claim object last encoded, its text). Only the writer (one at a time, under the
        # flock and the store's writing flag) touches it.
        self._encoded: dict[str, tuple[ClaimCheckpoint, str]] = {}

    @contextlib.contextmanager
    def flocked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def disk_id(self) -> FileId:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _temp_prefix(self) -> str:
        return f".{self.path.name}."

    def _remove_stale_temps(self) -> None:
        # Only a writer that crashed (or failed) between mkstemp and rename leaves these; the caller
        # holds the flock, so no live writer owns one.
        for stray in self.path.parent.glob(self._temp_prefix() + "*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()
                _log.info("removed temp file left by an interrupted checkpoint write", path=str(stray))

    def read(self) -> tuple[Checkpoint, FileId]:
        self._remove_stale_temps()
        file_id = self.disk_id()
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
                dropped_idle_instances=sorted(cp.idle),
            )
            return Checkpoint(boot_id=self.boot_id), file_id
        return cp, file_id

    def write(self, cp: Checkpoint) -> FileId:
        """Replace the file with `cp`, durably (file and directory fsync), and return its identity."""
        encoded: dict[str, tuple[ClaimCheckpoint, str]] = {}
        for uid, claim in cp.claims.items():
            cached = self._encoded.get(uid)
            encoded[uid] = (
                cached if cached is not None and cached[0] is claim else (claim, claim_entry(uid, claim))
            )
        data = checkpoint_bytes(cp.boot_id, {uid: text for uid, (_, text) in encoded.items()}, cp.idle)
        # The temp name is the one `_remove_stale_temps` looks for.
        write_atomically(self.path, data, durable=True, prefix=self._temp_prefix(), suffix=".tmp")
        self._encoded = encoded
        return self.disk_id()
