"""The checkpoint's records and their JSON form: what a claim's prepared devices are, and how they are
written to and verified from disk. The store that locks, loads and atomically saves them is
`kubeletplugin.checkpoint.store`.

The file is

    {"version": 1, "bootID": "...", "checksum": "<sha256 hex>", "claims": {"<uid>": {...}}}

or, while the node keeps idle MIG instances for reuse (`--idle-grace-period`), version 2 with one more
key, `"idle": {"<gpu>-<gi id>": {...}}`. A file without idle records is still written as version 1, so
a plugin that predates idle instances (a rollback of the DaemonSet) keeps reading it; version 1 is read
as version 2 with no idle records (the migration: nothing else changed).

`checksum` is the SHA-256 of the canonical JSON (sorted keys, no whitespace) of the object without the
checksum field. A mismatch or an unknown version raises `CheckpointCorrupt` instead of starting empty:
an empty checkpoint would make the plugin forget instances it created and then either leak them or,
worse, treat them as someone else's.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeletplugin.shared.capacity import SharedShare, shares_from_json, shares_to_json

CHECKPOINT_VERSION = 1  # written while no instance is idle (the layout every version reads)
CHECKPOINT_VERSION_IDLE = 2  # written while the node keeps idle instances (adds "idle")
_READABLE_VERSIONS = (CHECKPOINT_VERSION, CHECKPOINT_VERSION_IDLE)


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
    # adminAccess: an existing instance or GPU exposed for monitoring; nothing was created for it, it
    # holds nothing (no overlap, no placement ownership) and unprepare destroys nothing.
    admin: bool = False

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


@dataclass(frozen=True, slots=True)
class IdleInstance:
    """A GPU instance flexmig created for a claim that has ended, kept (without a compute instance) so
    that the next claim of the same profile at the same placement skips the GI create.

    The record is what makes the GI ours: reconcile and the sweeper destroy it by `gi_id` checked
    against profile and placement, exactly like a claim's device record. `released_at` is wall-clock
    (epoch seconds), so the grace period survives a plugin restart. `namespace` is the previous claim's:
    reuse across namespaces needs the administrator's opt-in (docs/kubelet-plugin.md, "Idle instances").
    """

    gpu_index: int
    gpu_uuid: str
    profile: str
    gi_profile_id: int
    placement_start: int
    placement_size: int
    gi_id: int
    mig_uuid: str  # the ended claim's MIG device (its CI is gone); for logs and metrics only
    released_at: float
    namespace: str

    @property
    def key(self) -> str:
        return idle_key(self.gpu_index, self.gi_id)

    def overlaps(self, start: int, size: int) -> bool:
        return self.placement_start < start + size and start < self.placement_start + self.placement_size


def idle_key(gpu_index: int, gi_id: int) -> str:
    return f"{gpu_index}-{gi_id}"


@dataclass(slots=True)
class Checkpoint:
    boot_id: str
    claims: dict[str, ClaimCheckpoint] = field(default_factory=dict)
    idle: dict[str, IdleInstance] = field(default_factory=dict)  # idle_key -> record


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
    if d.admin:  # only admin records: the others keep the layout of earlier versions
        out["adminAccess"] = True
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
    admin = raw.get("adminAccess", False)
    if not isinstance(admin, bool):
        raise CheckpointCorrupt(f"{where}: field 'adminAccess' has the wrong type ({type(admin).__name__})")
    return PreparedDeviceRecord(**kwargs, shares=shares, admin=admin)


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


_IDLE_FIELDS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("gpu_index", "gpuIndex", (int,)),
    ("gpu_uuid", "gpuUUID", (str,)),
    ("profile", "profile", (str,)),
    ("gi_profile_id", "giProfileID", (int,)),
    ("placement_start", "placementStart", (int,)),
    ("placement_size", "placementSize", (int,)),
    ("gi_id", "giID", (int,)),
    ("mig_uuid", "migUUID", (str,)),
    ("released_at", "releasedAt", (int, float)),
    ("namespace", "namespace", (str,)),
)


def _idle_to_json(i: IdleInstance) -> dict[str, Any]:
    return {key: getattr(i, attr) for attr, key, _ in _IDLE_FIELDS}


def _idle_from_json(key: str, raw: Any) -> IdleInstance:
    where = f"idle instance {key}"
    if not isinstance(raw, dict):
        raise CheckpointCorrupt(f"{where}: must be an object")
    kwargs: dict[str, Any] = {}
    for attr, field_key, types in _IDLE_FIELDS:
        value: Any = raw.get(field_key)
        if not isinstance(value, types) or isinstance(value, bool):
            raise CheckpointCorrupt(f"{where}: field {field_key!r} is missing or has the wrong type")
        kwargs[attr] = value
    kwargs["released_at"] = float(kwargs["released_at"])
    idle = IdleInstance(**kwargs)
    if idle.key != key:
        raise CheckpointCorrupt(f"{where}: stored under a key that differs from its GPU and GI id")
    return idle


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def claim_entry(uid: str, c: ClaimCheckpoint) -> str:
    """One claim as it stands in the canonical `claims` object, `"<uid>":{...}`: the text
    `checkpoint_bytes` joins (a store caches it per claim)."""
    text = json.dumps(_claim_to_json(c), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"{json.dumps(uid)}:{text}"


def checkpoint_bytes(
    boot_id: str, entries: Mapping[str, str], idle: Mapping[str, IdleInstance] | None = None
) -> bytes:
    """The file's bytes from each claim's `claim_entry` text (uid -> text).

    The same document as `checkpoint_to_json`, written in canonical form, so the checksum is taken
    over text that already exists instead of re-encoding every claim: a store writing the whole file
    for each batch of changes then pays per changed claim, not per claim. Top-level keys in sorted
    order (bootID < checksum < claims < idle < version), as `_canonical` orders them. Without idle
    records the file is version 1, byte for byte what earlier versions wrote.
    """
    body = ",".join(entries[uid] for uid in sorted(entries))
    head = '{"bootID":' + json.dumps(boot_id)
    tail = ',"claims":{' + body + "}"
    if idle:
        tail += ',"idle":' + json.dumps(
            {k: _idle_to_json(v) for k, v in idle.items()}, sort_keys=True, separators=(",", ":")
        )
    tail += ',"version":' + json.dumps(CHECKPOINT_VERSION_IDLE if idle else CHECKPOINT_VERSION) + "}"
    checksum = hashlib.sha256((head + tail).encode()).hexdigest()
    return (head + ',"checksum":"' + checksum + '"' + tail + "\n").encode()


def checkpoint_to_json(cp: Checkpoint) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "version": CHECKPOINT_VERSION_IDLE if cp.idle else CHECKPOINT_VERSION,
        "bootID": cp.boot_id,
        "claims": {uid: _claim_to_json(c) for uid, c in sorted(cp.claims.items())},
    }
    if cp.idle:
        payload["idle"] = {k: _idle_to_json(v) for k, v in sorted(cp.idle.items())}
    payload["checksum"] = hashlib.sha256(_canonical(payload)).hexdigest()
    return payload


def checkpoint_from_json(doc: Any, source: str = "checkpoint") -> Checkpoint:
    """Verify version and checksum, then decode. Raises CheckpointCorrupt naming what is wrong."""
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(f"{source}: top level must be a JSON object")
    version = doc.get("version")
    if version not in _READABLE_VERSIONS or isinstance(version, bool):
        raise CheckpointCorrupt(
            f"{source}: unknown checkpoint version {version!r} (this plugin reads versions"
            f" {', '.join(map(str, _READABLE_VERSIONS))}); refusing to guess which GPU instances it"
            " describes"
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
    # Version 1 has no idle records (migration: read as version 2 with none).
    idle = doc.get("idle", {}) if version == CHECKPOINT_VERSION_IDLE else {}
    if not isinstance(idle, dict):
        raise CheckpointCorrupt(f"{source}: 'idle' must be an object")
    return Checkpoint(
        boot_id=boot_id,
        claims={uid: _claim_from_json(uid, c) for uid, c in claims.items()},
        idle={key: _idle_from_json(key, raw) for key, raw in idle.items()},
    )
