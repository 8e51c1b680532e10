"""The simulator's persistent state: one JSON file, guarded by an exclusive flock per call.

Every simulated NVML call loads the file, mutates it and writes it back atomically (temp file, fsync,
rename) while holding the lock, so a second or restarted process sees exactly the same "hardware".
Nothing is cached between calls. The lock lives in a sidecar `<path>.lock` because the rename replaces
the state file's inode, which would silently drop a lock taken on the file itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from driver.atomicfile import write_atomically

SCHEMA_VERSION = 1


class MigOffQueries(StrEnum):
    """What a Hopper-or-newer GPU does with MIG profile queries while its MIG mode is off.

    `nvml.h` says the profile-info calls return NOT_SUPPORTED with MIG disabled; NVIDIA's own DRA
    driver relies on them answering on GB200. Which one a given Hopper part and driver does is not
    confirmed, so the simulator can do either. Ampere always refuses (it is not switched by this).
    """

    ANSWER = "answer"
    REFUSE = "refuse"


@dataclass
class CiState:
    id: int
    profile_id: int
    start: int  # compute-slice placement inside the GI
    size: int
    serial: int  # unique per creation, so handles of a destroyed CI stay stale after id reuse


@dataclass
class GiState:
    id: int
    profile_id: int
    start: int  # memory-slice placement
    size: int
    serial: int
    cis: list[CiState] = field(default_factory=list)


@dataclass
class ProcessState:
    pid: int
    gi_id: int | None  # None: a process on the whole (non-MIG) GPU
    ci_id: int | None


@dataclass
class GpuState:
    sku: str
    uuid: str
    mig_current: bool
    mig_pending: bool
    gis: list[GiState] = field(default_factory=list)
    processes: list[ProcessState] = field(default_factory=list)
    # A MigOffQueries value (kept as its string so the state file stays plain JSON).
    mig_off_queries: str = MigOffQueries.ANSWER.value


@dataclass
class FaultState:
    function: str
    at_call: int  # absolute per-function call number that fails
    code: int


@dataclass
class EventState:
    gpu_index: int
    event_type: int  # pynvml nvmlEventType* bit
    data: int  # XID number for XID events
    gi_id: int | None
    ci_id: int | None


@dataclass
class SimState:
    gpus: list[GpuState]
    schema: int = SCHEMA_VERSION
    next_serial: int = 1
    default_latency_s: float = 0.0
    latency_s: dict[str, float] = field(default_factory=dict)
    faults: list[FaultState] = field(default_factory=list)
    call_counts: dict[str, int] = field(default_factory=dict)
    events: list[EventState] = field(default_factory=list)
    # The in-memory mode creates instances on several GPUs at once; serials must stay unique.
    _serial_lock: ClassVar[threading.Lock] = threading.Lock()

    def new_serial(self) -> int:
        with self._serial_lock:
            serial = self.next_serial
            self.next_serial += 1
            return serial

    def latency_for(self, function: str) -> float:
        return self.latency_s.get(function, self.default_latency_s)

    def count_call(self, function: str) -> int:
        n = self.call_counts.get(function, 0) + 1
        self.call_counts[function] = n
        return n

    def take_fault(self, function: str, call_number: int) -> int | None:
        """Remove and return the code of a fault armed for this call of `function`, if any."""
        for fault in self.faults:
            if fault.function == function and fault.at_call == call_number:
                self.faults.remove(fault)
                return fault.code
        return None

    def to_json(self) -> dict[str, Any]:
        result = plain(self)
        assert isinstance(result, dict)
        return result

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SimState:
        schema = raw.get("schema")
        if schema != SCHEMA_VERSION:
            raise ValueError(f"simulator state schema {schema!r} is not supported (want {SCHEMA_VERSION})")
        gpus = [
            GpuState(
                sku=g["sku"],
                uuid=g["uuid"],
                mig_current=g["mig_current"],
                mig_pending=g["mig_pending"],
                gis=[
                    GiState(
                        id=gi["id"],
                        profile_id=gi["profile_id"],
                        start=gi["start"],
                        size=gi["size"],
                        serial=gi["serial"],
                        cis=[CiState(**ci) for ci in gi["cis"]],
                    )
                    for gi in g["gis"]
                ],
                processes=[ProcessState(**p) for p in g["processes"]],
                # Absent in state files written before the switch existed: they answered.
                mig_off_queries=g.get("mig_off_queries", MigOffQueries.ANSWER.value),
            )
            for g in raw["gpus"]
        ]
        return cls(
            gpus=gpus,
            schema=schema,
            next_serial=raw["next_serial"],
            default_latency_s=raw["default_latency_s"],
            latency_s=dict(raw["latency_s"]),
            faults=[FaultState(**f) for f in raw["faults"]],
            call_counts=dict(raw["call_counts"]),
            events=[EventState(**e) for e in raw["events"]],
        )


def plain(value: Any) -> Any:
    """The state tree as JSON data. Every leaf is a primitive, so unlike `dataclasses.asdict` no
    deep copy is needed; this runs on every simulated NVML call."""
    if is_dataclass(value) and not isinstance(value, type):
        return {name: plain(item) for name, item in vars(value).items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def _without_counts(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: item for key, item in raw.items() if key != "call_counts"}


class StateFile:
    """Locked load/modify/store of a `SimState` at `path`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def exists(self) -> bool:
        return self.path.exists()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            # Closing the descriptor releases the flock, also when the process is killed.
            os.close(fd)

    def _load_raw(self) -> dict[str, Any]:
        with self.path.open("r", encoding="utf-8") as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"simulator state {self.path} is not a JSON object")
        return raw

    def _load(self) -> SimState:
        return SimState.from_json(self._load_raw())

    def _store(self, state: SimState, *, durable: bool = True) -> None:
        self._store_raw(state.to_json(), durable=durable)

    def _store_raw(self, raw: dict[str, Any], *, durable: bool) -> None:
        # Never a directory fsync: the rename is what a killed process can observe (see `transaction`).
        data = json.dumps(raw, indent=1, sort_keys=True).encode("utf-8")
        write_atomically(self.path, data, durable=durable, sync_dir=False, prefix=self.path.name + ".")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SimState]:
        """Yield the current state under the lock; store it on normal exit.

        The write is always atomic (rename), which is all a killed process can observe. It is fsynced
        only when more than the call counters changed: counting every read-only query durably would
        cost an fsync per NVML call for bookkeeping nobody needs after a power loss.
        """
        with self._locked():
            before = self._load_raw()
            state = SimState.from_json(before)
            yield state
            after = state.to_json()
            self._store_raw(after, durable=_without_counts(after) != _without_counts(before))

    def store_raw(self, raw: dict[str, Any]) -> None:
        """Replace the state with `raw` (JSON data of a `SimState`), atomically but not fsynced: the
        in-memory mode's write-back (driver/nvml/sim/writeback.py)."""
        with self._locked():
            self._store_raw(raw, durable=False)

    def read(self) -> SimState:
        """A consistent snapshot (taken under the lock, not written back)."""
        with self._locked():
            return self._load()

    def create(self, state: SimState, *, overwrite: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.path.exists() and not overwrite:
                raise FileExistsError(f"simulator state {self.path} exists (pass overwrite=True)")
            self._store(state)
