"""The changes the plugin makes to its checkpoint, as mutations `CheckpointStore.update` applies.

Each function returns a mutation of a `Checkpoint` (kubeletplugin/checkpoint/model.py): it changes the
state in place and returns what the caller wants back. A mutation raises (KeyError, TypeError) when
the change makes no sense on the state it is applied to, and the store then refuses the change whole.
Kept apart from the store so that the store is only about ordering and durability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kubeletplugin.checkpoint.model import (
    Checkpoint,
    ClaimCheckpoint,
    ClaimState,
    IdleInstance,
    PreparedDeviceRecord,
)

_DEVICE_FIELDS = frozenset(f.name for f in dataclasses.fields(PreparedDeviceRecord))


def put_claim(claim: ClaimCheckpoint) -> Callable[[Checkpoint], None]:
    def _put(cp: Checkpoint) -> None:
        cp.claims[claim.uid] = claim

    return _put


def remove_claim(uid: str) -> Callable[[Checkpoint], bool]:
    return lambda cp: cp.claims.pop(uid, None) is not None


def set_state(uid: str, state: ClaimState) -> Callable[[Checkpoint], ClaimCheckpoint]:
    def _set(cp: Checkpoint) -> ClaimCheckpoint:
        claim = require(cp, uid)
        cp.claims[uid] = dataclasses.replace(claim, state=state)
        return cp.claims[uid]

    return _set


def update_device(
    uid: str, device_name: str, changes: Mapping[str, Any]
) -> Callable[[Checkpoint], PreparedDeviceRecord]:
    """Replace fields of one device record; unknown field names are refused before anything is queued."""
    unknown = set(changes) - _DEVICE_FIELDS
    if unknown:
        raise TypeError(f"unknown PreparedDeviceRecord fields: {sorted(unknown)}")

    def _upd(cp: Checkpoint) -> PreparedDeviceRecord:
        claim = require(cp, uid)
        old = claim.device(device_name)
        if old is None:
            raise KeyError(f"claim {uid} has no device {device_name!r} in the checkpoint")
        new = dataclasses.replace(old, **changes)
        devices = tuple(new if d.device_name == device_name else d for d in claim.devices)
        cp.claims[uid] = dataclasses.replace(claim, devices=devices)
        return new

    return _upd


def complete(uid: str, cdi_ids: Mapping[str, tuple[str, ...]]) -> Callable[[Checkpoint], ClaimCheckpoint]:
    """Each device's CDI ids stored and the claim marked `PrepareCompleted`, in one change."""

    def _done(cp: Checkpoint) -> ClaimCheckpoint:
        claim = require(cp, uid)
        missing = set(cdi_ids) - {d.device_name for d in claim.devices}
        if missing:
            raise KeyError(f"claim {uid} has no devices {sorted(missing)} in the checkpoint")
        devices = tuple(
            dataclasses.replace(d, cdi_device_ids=cdi_ids.get(d.device_name, d.cdi_device_ids))
            for d in claim.devices
        )
        cp.claims[uid] = dataclasses.replace(claim, devices=devices, state=ClaimState.PREPARE_COMPLETED)
        return cp.claims[uid]

    return _done


def put_claim_adopting(claim: ClaimCheckpoint, idle_keys: Collection[str]) -> Callable[[Checkpoint], None]:
    """The claim's entry in, the idle records it adopts out, in one change: ownership of each GI moves
    from the idle record to the claim atomically, so no crash leaves it with both or neither."""

    def _put(cp: Checkpoint) -> None:
        missing = [k for k in idle_keys if k not in cp.idle]
        if missing:
            raise KeyError(f"idle instances {missing} are no longer in the checkpoint")
        for key in idle_keys:
            del cp.idle[key]
        cp.claims[claim.uid] = claim

    return _put


def keep_idle(uid: str, idle: Collection[IdleInstance]) -> Callable[[Checkpoint], None]:
    """An unprepared claim's entry out, the GIs it leaves idle in, in one change (same reason)."""

    def _keep(cp: Checkpoint) -> None:
        require(cp, uid)
        del cp.claims[uid]
        for rec in idle:
            cp.idle[rec.key] = rec

    return _keep


def remove_idle(keys: Collection[str]) -> Callable[[Checkpoint], int]:
    """Idle records out (their GIs destroyed or gone); returns how many were there."""
    return lambda cp: sum(cp.idle.pop(k, None) is not None for k in keys)


def require(cp: Checkpoint, uid: str) -> ClaimCheckpoint:
    claim = cp.claims.get(uid)
    if claim is None:
        raise KeyError(f"claim {uid} is not in the checkpoint")
    return claim


__all__ = [
    "complete",
    "keep_idle",
    "put_claim",
    "put_claim_adopting",
    "remove_claim",
    "remove_idle",
    "require",
    "set_state",
    "update_device",
]
