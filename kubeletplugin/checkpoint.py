"""The node's record of prepared claims: what flexmig created on which GPU, for which claim.

Prepare writes `PrepareStarted` before touching NVML and `PrepareCompleted` after the CDI spec exists,
so after a crash the plugin knows which instances may be half-made and which ones it owns. The file is

    {"version": 1, "bootID": "...", "checksum": "<sha256 hex>", "claims": {"<uid>": {...}}}

`checksum` is the SHA-256 of the canonical JSON (sorted keys, no whitespace) of the object without the
checksum field. A mismatch or an unknown version raises `CheckpointCorrupt` instead of starting empty:
an empty checkpoint would make the plugin forget instances it created and then either leak them or,
worse, treat them as someone else's. A different boot ID is the one case where starting empty is right,
because GPU and compute instances do not survive a reboot.

Writes go to a temp file in the same directory, are fsynced, renamed over the target and the directory
is fsynced, so a crash leaves either the old or the new checkpoint (plus, at worst, a stray temp file
that the next load removes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from kubeletplugin.sharedcapacity import SharedShare, shares_from_json, shares_to_json

CHECKPOINT_VERSION = 1
DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

_log = structlog.get_logger(__name__)
_T = TypeVar("_T")


class CheckpointCorrupt(Exception):
    """The checkpoint exists but cannot be trusted; an operator has to look at it."""


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class PreparedDeviceRecord:
    """One allocated device of a claim. The MIG fields are None for a whole or shared GPU.

    `shares` is set only for a HAMi-core shared GPU (`gpu-<i>-shared`): one entry per allocation result
    naming the device (normally one), with its share id and consumed memory/cores. Nothing is created
    through NVML for it.

    `gi_id`, `ci_id`, `mig_uuid` stay None until NVML created the instance. `created_gi` / `created_ci`
    say that *this plugin* created them, which is what allows reconcile to destroy them; an instance we
    merely adopted is never destroyed by us.
    """

    request_names: tuple[str, ...]
    pool: str
    device_name: str
    gpu_index: int
    gpu_uuid: str
    profile: str | None = None
    gi_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    mig_uuid: str | None = None
    created_gi: bool = False
    created_ci: bool = False
    cdi_device_ids: tuple[str, ...] = ()
    shares: tuple[SharedShare, ...] = ()

    @property
    def is_mig(self) -> bool:
        return self.profile is not None

    @property
    def is_shared(self) -> bool:
        return bool(self.shares)

    @property
    def realised(self) -> bool:
        return self.gi_id is not None and self.ci_id is not None and self.mig_uuid is not None


@dataclass(frozen=True, slots=True)
class ClaimCheckpoint:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDeviceRecord, ...] = ()

    def device(self, device_name: str) -> PreparedDeviceRecord | None:
        return next((d for d in self.devices if d.device_name == device_name), None)


@dataclass(slots=True)
class Checkpoint:
    boot_id: str
    claims: dict[str, ClaimCheckpoint] = field(default_factory=dict)


# --- (de)serialisation ---------------------------------------------------------------------------

_DEVICE_FIELDS: tuple[tuple[str, str, tuple[type, ...], bool], ...] = (
    # (python attribute, JSON key, accepted types, nullable)
    ("request_names", "requestNames", (list,), False),
    ("pool", "pool", (str,), False),
    ("device_name", "deviceName", (str,), False),
    ("gpu_index", "gpuIndex", (int,), False),
    ("gpu_uuid", "gpuUUID", (str,), False),
    ("profile", "profile", (str,), True),
    ("gi_profile_id", "giProfileID", (int,), True),
    ("placement_start", "placementStart", (int,), True),
    ("placement_size", "placementSize", (int,), True),
    ("gi_id", "giID", (int,), True),
    ("ci_id", "ciID", (int,), True),
    ("mig_uuid", "migUUID", (str,), True),
    ("created_gi", "createdGI", (bool,), False),
    ("created_ci", "createdCI", (bool,), False),
    ("cdi_device_ids", "cdiDeviceIDs", (list,), False),
)


def _device_to_json(d: PreparedDeviceRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr, key, _, _ in _DEVICE_FIELDS:
        value = getattr(d, attr)
        out[key] = list(value) if isinstance(value, tuple) else value
    if d.shares:  # only shared GPUs: MIG/whole records keep the exact layout of earlier versions
        out["shares"] = shares_to_json(d.shares)
    return out


def _device_from_json(where: str, raw: Any) -> PreparedDeviceRecord:
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(f"{where}: must be an object")
    kwargs: dict[str, Any] = {}
    for attr, key, types, nullable in _DEVICE_FIELDS:
        if key not in raw:
            raise CheckpointCorrupt(f"{where}: field {key!r} is missing")
        value = raw[key]
        if value is None and nullable:
            kwargs[attr] = None
            continue
        # bool is an int subclass: never accept it where an integer id is expected.
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise CheckpointCorrupt(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise CheckpointCorrupt(f"{where}: field {key!r} must be a list of strings")
            value = tuple(value)
        kwargs[attr] = value
    try:
        # Absent in files of plugins that predate shared GPUs (and for MIG/whole records).
        shares = shares_from_json(raw.get("shares"))
    except ValueError as exc:
        raise CheckpointCorrupt(f"{where}: {exc}") from None
    return PreparedDeviceRecord(**kwargs, shares=shares)


def _claim_to_json(c: ClaimCheckpoint) -> dict[str, Any]:
    return {
        "uid": c.uid,
        "namespace": c.namespace,
        "name": c.name,
        "state": c.state.value,
        "devices": [_device_to_json(d) for d in c.devices],
    }


def _claim_from_json(uid: str, raw: Any) -> ClaimCheckpoint:
    where = f"claim {uid}"
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(f"{where}: must be an object")
    for key in ("uid", "namespace", "name", "state"):
        if not isinstance(raw.get(key), str):
            raise CheckpointCorrupt(f"{where}: field {key!r} is missing or not a string")
    if raw["uid"] != uid:
        raise CheckpointCorrupt(f"{where}: stored under a key that differs from its uid {raw['uid']!r}")
    try:
        state = ClaimState(raw["state"])
    except ValueError:
        allowed = ", ".join(s.value for s in ClaimState)
        raise CheckpointCorrupt(f"{where}: state {raw['state']!r} is not one of {allowed}") from None
    devices = raw.get("devices")
    if not isinstance(devices, list):
        raise CheckpointCorrupt(f"{where}: field 'devices' is missing or not a list")
    return ClaimCheckpoint(
        uid=uid,
        namespace=raw["namespace"],
        name=raw["name"],
        state=state,
        devices=tuple(_device_from_json(f"{where} device {i}", d) for i, d in enumerate(devices)),
    )


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def checkpoint_to_json(cp: Checkpoint) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "version": CHECKPOINT_VERSION,
        "bootID": cp.boot_id,
        "claims": {uid: _claim_to_json(c) for uid, c in sorted(cp.claims.items())},
    }
    payload["checksum"] = hashlib.sha256(_canonical(payload)).hexdigest()
    return payload


def checkpoint_from_json(doc: Any, source: str = "checkpoint") -> Checkpoint:
    """Verify version and checksum, then decode. Raises CheckpointCorrupt naming what is wrong."""
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(f"{source}: top level must be a JSON object")
    version = doc.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointCorrupt(
            f"{source}: unknown checkpoint version {version!r} (this plugin reads version"
            f" {CHECKPOINT_VERSION}); refusing to guess which GPU instances it describes"
        )
    checksum = doc.get("checksum")
    payload = {k: v for k, v in doc.items() if k != "checksum"}
    expected = hashlib.sha256(_canonical(payload)).hexdigest()
    if checksum != expected:
        raise CheckpointCorrupt(
            f"{source}: checksum mismatch (stored {checksum!r}, computed {expected!r}); the file was"
            " modified or partially written"
        )
    boot_id, claims = doc.get("bootID"), doc.get("claims")
    if not isinstance(boot_id, str) or not isinstance(claims, dict):
        raise CheckpointCorrupt(f"{source}: 'bootID' must be a string and 'claims' an object")
    return Checkpoint(boot_id=boot_id, claims={uid: _claim_from_json(uid, c) for uid, c in claims.items()})


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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
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
