"""The changes the plugin makes to its checkpoint, as mutations `CheckpointStore.update` applies.

Each function returns a mutation of a `Checkpoint` (kubeletplugin/checkpoint/model.py): it changes the
state in place and returns what the caller wants back. A mutation raises (KeyError, TypeError) when
the change makes no sense on the state it is applied to, and the store then refuses the change whole.
Kept apart from the store so that the store is only about ordering and durability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from kubeletplugin.checkpoint.model import Checkpoint, ClaimCheckpoint, ClaimState, PreparedDeviceRecord

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


def require(cp: Checkpoint, uid: str) -> ClaimCheckpoint:
    claim = cp.claims.get(uid)
    if claim is None:
        raise KeyError(f"claim {uid} is not in the checkpoint")
    return claim


__all__ = ["complete", "put_claim", "remove_claim", "require", "set_state", "update_device"]
