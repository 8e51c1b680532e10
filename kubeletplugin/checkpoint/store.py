"""The node's record of prepared claims: what flexmig created on which GPU, for which claim.

Prepare writes `PrepareStarted` before touching NVML and `PrepareCompleted` after the CDI spec exists,
so after a crash the plugin knows which instances may be half-made and which ones it owns. The records,
the file format and its checksum live in `kubeletplugin.checkpoint.model`, reading and durably
replacing the file in `kubeletplugin.checkpoint.storefile`; this module is the store. A corrupt file or
an unknown version raises `CheckpointCorrupt` rather than starting empty. A different boot ID is the
one case where starting empty is right, because GPU and compute instances do not survive a reboot.

Group commit: claims on different GPUs are prepared in parallel and each makes durable writes, so
writes that arrive while one is being fsynced queue up and the next writer to run ("the leader")
applies all of them, in arrival order, to the file's state and makes them durable with one write +
fsync. `update` returns only after the file holding its change is durable; a failed write fails every
waiting update of its batch and leaves the previous file as it was.

What the store answers (`load`, `get_claim`) is the latest accepted state: the durable file plus every
change accepted since, in order, written or not. A change is applied to that state when it is accepted
(a mutation that raises is refused at once), so a claim's entry fences its placements off from the
other claims while its write is still on its way (`begin`/`finish`); a failed write drops its batch's
waited-for changes again. `update(..., wait=False)` does not wait at all: the change is written with
the next durable write and stays queued if that write fails. The preparer uses it only for what a
crash may lose: the GI and CI ids, which the startup reconcile finds again from the durable
`PrepareStarted` intent (docs/kubelet-plugin.md, "Crash model"). The file is reread only when its
identity on disk (inode, size, times) changed, i.e. another process wrote it; the changes still queued
here are then re-applied on top of what it wrote.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from kubeletplugin.checkpoint import mutations
from kubeletplugin.checkpoint.model import (
    Checkpoint,
    ClaimCheckpoint,
    ClaimState,
    PreparedDeviceRecord,
)
from kubeletplugin.checkpoint.storefile import CheckpointFile, FileId

DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

_log = structlog.get_logger(__name__)
_T = TypeVar("_T")


def read_boot_id(path: str | os.PathLike[str] = DEFAULT_BOOT_ID_PATH) -> str:
    boot_id = Path(path).read_text(encoding="ascii").strip()
    if not boot_id:
        raise ValueError(f"boot id file {os.fspath(path)!r} is empty")
    return boot_id


def _copy(cp: Checkpoint) -> Checkpoint:
    # Claims are frozen dataclasses, so a new dict is a full copy as far as callers can mutate it.
    return Checkpoint(boot_id=cp.boot_id, claims=dict(cp.claims), idle=dict(cp.idle))


class _Write(Generic[_T]):
    """One accepted change: its mutation, whether it stays queued when its batch fails (`keep`: a
    change nobody waits for) and, once its batch is written, its result or error."""

    __slots__ = ("done", "error", "keep", "mutate", "result", "wake")

    def __init__(self, mutate: Callable[[Checkpoint], _T], keep: bool) -> None:
        self.mutate = mutate
        self.keep = keep
        self.done = False
        self.result: _T | None = None
        self.error: BaseException | None = None
        # Set while its caller waits in `finish`: woken when its batch is done, or to lead the next.
        self.wake: threading.Event | None = None


@dataclasses.dataclass(frozen=True)
class Pending(Generic[_T]):
    """A change `CheckpointStore.begin` accepted; `CheckpointStore.finish` waits for it."""

    write: _Write[_T]


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
        self._file = CheckpointFile(self.path, boot_id)
        # A plain lock: nothing takes it twice (calls made from inside a mutation use `_local`).
        self._cond = threading.Condition(threading.Lock())
        # All below are guarded by `_cond`.
        self._queue: list[_Write[Any]] = []  # accepted, not yet taken by a leader
        self._writing = False  # a leader is applying and writing a batch
        self._durable: Checkpoint | None = None  # None: (re)read the file on next use
        self._file_id: FileId = None  # identity of the file `_durable` came from / went to
        # `_durable` + the batch being written + `_queue`; None whenever `_durable` is.
        self._view: Checkpoint | None = None
        self._generation = 0  # bumped whenever `_durable` is replaced by a commit
        self.commits = 0  # batches made durable (each one write + fsync); for tests and benchmarks
        # The checkpoint a mutation is being applied to: store calls made from inside a mutation run
        # on it directly (queueing them would wait for the very batch that is running them).
        self._local = threading.local()

    # -- the state (callers hold `_cond`) --

    def _current(self) -> Checkpoint:
        """The latest accepted state, rereading the file when another process changed it."""
        while True:
            view = self._view
            if view is not None:
                if self._writing:
                    return view  # the leader checks the file itself
                file_id = self._file_id
                # The stat runs without `_cond`: a system call gives the interpreter lock away, and
                # getting it back can take a switch interval (5 ms) when other threads are busy,
                # which every thread queued on `_cond` would wait for too.
                self._cond.release()
                try:
                    on_disk = self._file.disk_id()
                finally:
                    self._cond.acquire()
                if self._view is not view or self._writing or self._file_id != file_id:
                    continue  # the state moved on meanwhile: look again
                if on_disk == file_id:
                    return view
            elif self._writing:
                self._cond.wait()  # after a failed write: the leader is done soon
                continue
            generation = self._generation
            self._cond.release()
            try:
                with self._file.flocked():
                    cp, file_id = self._file.read()
            finally:
                self._cond.acquire()
            if generation == self._generation and not self._writing:
                self._durable, self._file_id = cp, file_id
                self._view = self._replay(cp, self._queue, record=False)

    def _apply(self, cp: Checkpoint, write: _Write[_T]) -> _T:
        """Run one mutation on `cp`; one that raises leaves `cp` as it was."""
        before, idle_before = dict(cp.claims), dict(cp.idle)
        self._local.building = cp
        try:
            return write.mutate(cp)
        except BaseException:
            cp.claims.clear()
            cp.claims.update(before)
            cp.idle.clear()
            cp.idle.update(idle_before)
            raise
        finally:
            self._local.building = None

    def _replay(self, base: Checkpoint, writes: list[_Write[Any]], *, record: bool) -> Checkpoint:
        """`base` with `writes` applied in order; `record`: this is the batch being written."""
        work = _copy(base)
        for write in writes:
            try:
                result = self._apply(work, write)
            except Exception as exc:  # only this change is refused; the rest go on
                # It applied when accepted, so the file changed under it (another process wrote it).
                if record:
                    write.error = exc
                    if write.keep:
                        _log.warning("a queued checkpoint change no longer applies; dropped", error=str(exc))
                continue
            if record:
                write.result = result
        return work

    # -- reading --

    def load(self) -> Checkpoint:
        """The latest accepted checkpoint (a copy the caller may change freely)."""
        building: Checkpoint | None = getattr(self._local, "building", None)
        if building is not None:
            return _copy(building)
        with self._cond:
            return _copy(self._current())

    # -- writing --

    def begin(self, mutate: Callable[[Checkpoint], _T]) -> Pending[_T]:
        """Run `mutate` on the latest state now; `finish` waits until the change is durable.

        Between the two the change is in what `load` answers (and may already be written). A mutation
        that raises changes nothing and raises here. Inside a mutation it runs at once on the
        checkpoint being built, like `update`.
        """
        write: _Write[_T] = _Write(mutate, keep=False)
        building: Checkpoint | None = getattr(self._local, "building", None)
        if building is not None:
            write.result, write.done = mutate(building), True
            return Pending(write)
        with self._cond:
            write.result = self._apply(self._current(), write)
            self._queue.append(write)
        return Pending(write)

    def finish(self, pending: Pending[_T]) -> _T:
        """Return once `begin`'s change is durable (leading a batch if none is being written).

        Raises the write's error when its batch failed; the change is then gone from the state.
        """
        write = pending.write
        if getattr(self._local, "building", None) is not None:
            return write.result  # type: ignore[return-value]  # begun inside this mutation: applied
        with self._cond:
            while not write.done and self._writing:
                # Its own event, not `_cond.wait()`: the leader wakes only the callers of its batch
                # and the one that leads next, not every thread waiting on the store.
                wake = write.wake = threading.Event()
                self._cond.release()
                try:
                    wake.wait()
                finally:
                    self._cond.acquire()
            write.wake = None
            lead = not write.done
            if lead:
                batch, self._queue = self._queue, []
                self._writing = True
        if lead:
            self._lead(batch)
        if write.error is not None:
            raise write.error
        return write.result  # type: ignore[return-value]

    def update(self, mutate: Callable[[Checkpoint], _T], *, wait: bool = True) -> _T:
        """Run `mutate` on the latest state and, with `wait`, make the result durable before returning.

        Mutations run one at a time, in arrival order, each on the state the previous ones left. A
        mutation that raises changes nothing and its caller gets the exception; a failed write fails
        every waiting caller of its batch. Without `wait` the change is in the state at once, is
        written with the next durable write, and stays queued if that write fails. Called from inside a
        mutation, it runs at once on the checkpoint being built and becomes durable with the outer one.
        """
        building: Checkpoint | None = getattr(self._local, "building", None)
        if building is not None:
            return mutate(building)
        if wait:
            return self.finish(self.begin(mutate))
        write: _Write[_T] = _Write(mutate, keep=True)
        with self._cond:
            result = self._apply(self._current(), write)
            self._queue.append(write)
        return result

    def _lead(self, batch: list[_Write[Any]]) -> None:
        durable: Checkpoint | None = None
        file_id: FileId = None
        failure: BaseException | None = None
        try:
            with self._file.flocked():
                on_disk = self._file.disk_id()
                with self._cond:
                    cached, base_id = self._durable, self._file_id
                # While we write, nobody else in this process commits: `_durable` is the file's
                # content unless another process wrote it.
                if cached is None or on_disk != base_id:
                    base, base_id = self._file.read()
                else:
                    base = cached
                work = self._replay(base, batch, record=True)
                if work.claims == base.claims and work.idle == base.idle:
                    durable, file_id = base, base_id  # nothing changed: nothing to make durable
                else:
                    durable, file_id = work, self._file.write(work)
        except BaseException as exc:
            failure = exc
        with self._cond:
            if failure is None:
                self._durable, self._file_id = durable, file_id
                self._generation += 1
                self.commits += 1
                assert durable is not None
                self._view = self._replay(durable, self._queue, record=False)
            else:
                # The file is the previous one (or a stranger's): reread it on next use. The waiting
                # callers are told; changes nobody waits for stay queued for the next write.
                self._durable = self._view = None
                kept = [w for w in batch if w.keep and w.error is None]
                self._queue = kept + self._queue
                for write in batch:
                    if not write.keep:
                        write.error, write.result = failure, None
            for write in batch:
                write.done = True
                if write.wake is not None:
                    write.wake.set()
            self._writing = False
            # The first caller already waiting for a queued change leads the next batch (callers that
            # come later find nobody writing and lead themselves).
            nxt = next((w for w in self._queue if w.wake is not None), None)
            if nxt is not None and nxt.wake is not None:
                nxt.wake.set()
            self._cond.notify_all()  # `_current` waiting out a failed write, if any

    def save(self, cp: Checkpoint) -> None:
        if cp.boot_id != self.boot_id:
            raise ValueError(f"checkpoint boot id {cp.boot_id!r} is not this boot's {self.boot_id!r}")
        claims, idle = dict(cp.claims), dict(cp.idle)

        def _replace(current: Checkpoint) -> None:
            current.claims.clear()
            current.claims.update(claims)
            current.idle.clear()
            current.idle.update(idle)

        self.update(_replace)

    def queued(self) -> int:
        """Updates waiting for the next batch (for tests and benchmarks)."""
        with self._cond:
            return len(self._queue)

    # --- typed helpers ---

    def get_claim(self, uid: str) -> ClaimCheckpoint | None:
        return self.load().claims.get(uid)

    def put_claim(self, claim: ClaimCheckpoint) -> None:
        self.finish(self.begin_put(claim))

    def begin_put(self, claim: ClaimCheckpoint) -> Pending[None]:
        """`put_claim` in two halves: the entry is in the state now, durable after `finish`."""
        return self.begin(mutations.put_claim(claim))

    def remove_claim(self, uid: str) -> bool:
        return self.update(mutations.remove_claim(uid))

    def set_state(self, uid: str, state: ClaimState) -> ClaimCheckpoint:
        return self.update(mutations.set_state(uid, state))

    def update_device(
        self, uid: str, device_name: str, *, wait: bool = True, **changes: Any
    ) -> PreparedDeviceRecord:
        """Replace fields of one device record, e.g. the realised gi_id/ci_id/mig_uuid after creation.

        `wait=False`: see `update` (not durable on return)."""
        return self.update(mutations.update_device(uid, device_name, changes), wait=wait)

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
        return self.update(mutations.complete(uid, cdi_ids))
