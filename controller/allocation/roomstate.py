"""What preemption and moves have promised, as a document that outlives the leader (docs/moves.md).

Nominations (controller/allocation/nominate.py), moves under way, their reservations, the rate-limit
window, the pods moved lately and the pods a PodDisruptionBudget refused all lived in the leader's
memory. After a leader change (a rollout, a crash) they were gone: the room made for a waiting pod
could go to a third pod, a replacement was placed anywhere, and, worst, a controller that restarted
again and again could evict `per_cluster` more pods after every start and move the same pod twice
within the window. So the leader writes them here right after each set of evictions and after every
step that changed them (controller/kube/roomstore.py keeps the document in a ConfigMap) and a new
leader reads them back before its first decision.

`dump` turns the state into plain JSON; `restore` replaces the state with a document's, each field
checked (`RoomStateError` names the first that is wrong; the caller then starts empty, as before).
Times are monotonic in memory and wall-clock seconds in the document: each side converts them
against one reading of both of its clocks (controller/allocation/roomsync.py takes it once per
leadership), so a clock skew between two replicas shifts the timers by that skew and no more; times in the future (a skewed clock, or a forged document) are taken as now.
Bounds: at most `MAX_ENTRIES` entries of each kind are written (the newest), and at most
`MAX_ITEMS` uids or devices in one entry are read back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from controller.allocation.moveplan import Destination
from controller.allocation.moves import Move
from controller.allocation.nominate import Nomination
from controller.state.ledger import Held, Ledger, ShareUse

if TYPE_CHECKING:
    from controller.allocation.preempt import Preemption

SCHEMA = 1
MAX_ENTRIES = 512
MAX_ITEMS = 4096
MAX_NAME = 512  # longer than any pod key or uid the API server accepts

Obj = dict[str, Any]
KINDS = ("nominations", "moves", "targets", "moved", "evictions", "moveRefused", "preemptionRefused")
EMPTY: Obj = {"schema": SCHEMA, **{kind: [] for kind in KINDS}}
"""The document of a state with no promise (what `dump` gives for one)."""


class RoomStateError(ValueError):
    """A document that cannot be read back; the message names the field."""


class _Clock:
    """Monotonic <-> wall-clock seconds, against one reading of each."""

    def __init__(self, mono: float, wall: float) -> None:
        self.mono, self.wall = mono, wall

    def to_wall(self, t: float) -> float:
        return round(self.wall - (self.mono - t), 3)

    def to_mono(self, wall: float) -> float:
        return self.mono - max(0.0, self.wall - wall)

    def until_to_mono(self, wall: float, longest: float) -> float:
        """A deadline: never further away than `longest`, whatever the document says."""
        return self.mono + min(max(0.0, wall - self.wall), longest)


# --- writing --------------------------------------------------------------------------------------


def _held_out(key: Held) -> Obj:
    if isinstance(key, ShareUse):
        return {
            "pool": key.pool,
            "device": key.device,
            "shareID": key.share_id,
            "memoryMiB": key.memory_mib,
            "cores": key.cores,
            "shares": key.shares,
        }
    return {"pool": key[0], "device": key[1]}


def _devices_out(devices: frozenset[Held]) -> list[Obj]:
    return sorted(
        (_held_out(d) for d in devices), key=lambda d: (d["pool"], d["device"], d.get("shareID", ""))
    )


def _newest(items: list[Obj], field: str) -> list[Obj]:
    return sorted(items, key=lambda i: i[field], reverse=True)[:MAX_ENTRIES]


def dump(preemption: Preemption, now_mono: float, now_wall: float) -> Obj:
    """The state to write: plain JSON, deterministic for one state (so an unchanged state is not
    written again)."""
    clock = _Clock(now_mono, now_wall)
    moves = preemption.moves
    nominations = [
        {
            "pod": n.pod_key,
            "uid": n.pod_uid,
            "node": n.node,
            "victims": sorted(n.victims),
            "devices": _devices_out(n.devices),
            "since": clock.to_wall(n.since),
            "allGoneAt": None if n.all_gone_at is None else clock.to_wall(n.all_gone_at),
        }
        for n in preemption.nominations.entries.values()
    ]
    active = [
        {
            "pod": m.pod_key,
            "uid": m.pod_uid,
            "owner": m.owner,
            "shape": [list(pair) for pair in m.shape],
            "source": m.source,
            "destNode": m.dest.node,
            "destDevices": _devices_out(m.dest.devices),
            "forPod": m.for_pod,
            "since": clock.to_wall(m.since),
            "goneAt": None if m.gone_at is None else clock.to_wall(m.gone_at),
            "replacement": m.replacement,
            "replacementUID": m.replacement_uid or None,
        }
        for m in moves.active.values()
    ]
    targets = [
        {"pod": key, "uid": uid, "devices": _devices_out(devices)}
        for key, (uid, devices) in sorted(moves.targets.items())
    ]
    return {
        "schema": SCHEMA,
        "nominations": _newest(nominations, "since"),
        "moves": _newest(active, "since"),
        "targets": targets[:MAX_ENTRIES],
        "moved": _newest([{"uid": u, "at": clock.to_wall(t)} for u, t in moves.moved.items()], "at"),
        "evictions": _newest([{"at": clock.to_wall(t), "node": n} for t, n in moves.recent], "at"),
        "moveRefused": _newest(
            [{"uid": u, "until": clock.to_wall(t)} for u, t in moves.refused.items()], "until"
        ),
        "preemptionRefused": _newest(
            [{"uid": u, "until": clock.to_wall(t)} for u, t in preemption.refused.items()], "until"
        ),
    }


# --- reading --------------------------------------------------------------------------------------


def _field(obj: Any, name: str, where: str) -> Any:
    if not isinstance(obj, Mapping):
        raise RoomStateError(f"{where}: must be an object")
    if name not in obj:
        raise RoomStateError(f"{where}.{name}: missing")
    return obj[name]


def _str(obj: Any, name: str, where: str, *, optional: bool = False) -> Any:
    value = _field(obj, name, where)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise RoomStateError(f"{where}.{name}: must be a non-empty string of at most {MAX_NAME} characters")
    return value


def _time(obj: Any, name: str, where: str, *, optional: bool = False) -> float | None:
    value = _field(obj, name, where)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RoomStateError(f"{where}.{name}: must be a number of seconds (wall clock)")
    return float(value)


def _list(obj: Any, name: str, where: str, limit: int = MAX_ENTRIES) -> list[Any]:
    value = _field(obj, name, where)
    if not isinstance(value, list):
        raise RoomStateError(f"{where}.{name}: must be a list")
    if len(value) > limit:
        raise RoomStateError(f"{where}.{name}: at most {limit} entries, not {len(value)}")
    return value


def _opt_int(obj: Mapping[str, Any], name: str, where: str) -> int | None:
    value = obj.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RoomStateError(f"{where}.{name}: must be a non-negative integer or null")
    return value


def _held_in(obj: Any, where: str) -> Held:
    pool, device = _str(obj, "pool", where), _str(obj, "device", where)
    if "shareID" not in obj:
        return (pool, device)
    return ShareUse(
        pool,
        device,
        _str(obj, "shareID", where),
        _opt_int(obj, "memoryMiB", where),
        _opt_int(obj, "cores", where),
        _opt_int(obj, "shares", where),
    )


def _devices_in(obj: Any, name: str, where: str) -> frozenset[Held]:
    items = _list(obj, name, where, MAX_ITEMS)
    return frozenset(_held_in(d, f"{where}.{name}[{i}]") for i, d in enumerate(items))


def _uids_in(obj: Any, name: str, where: str) -> frozenset[str]:
    items = _list(obj, name, where, MAX_ITEMS)
    out = set()
    for i, uid in enumerate(items):
        if not isinstance(uid, str) or not uid or len(uid) > MAX_NAME:
            raise RoomStateError(f"{where}.{name}[{i}]: must be a non-empty string")
        out.add(uid)
    return frozenset(out)


def _entries(doc: Any, name: str, read: Callable[[Any, str], None]) -> None:
    for i, item in enumerate(_list(doc, name, "state")):
        read(item, f"state.{name}[{i}]")


def restore(preemption: Preemption, ledger: Ledger, doc: Any, now_mono: float, now_wall: float) -> None:
    """Replace the nominations, moves and their windows with the document's (the ledger's holds of the
    old ones are given back; the next step's `start_step` takes the new ones). Raises RoomStateError,
    changing nothing, when any field is wrong."""
    from controller.allocation.moves import RATE_WINDOW_S, REFUSED_RETRY_S
    from controller.allocation.preempt import REFUSED_RETRY_S as PDB_RETRY_S

    clock = _Clock(now_mono, now_wall)
    if _field(doc, "schema", "state") != SCHEMA:
        raise RoomStateError(f"state.schema: must be {SCHEMA}")
    nominations: dict[str, Nomination] = {}
    active: dict[str, Move] = {}
    targets: dict[str, tuple[str, frozenset[Held]]] = {}
    moved: dict[str, float] = {}
    recent: list[tuple[float, str]] = []
    move_refused: dict[str, float] = {}
    pdb_refused: dict[str, float] = {}

    def mono(obj: Any, name: str, where: str) -> float:
        value = _time(obj, name, where)
        assert value is not None
        return clock.to_mono(value)

    def opt_mono(obj: Any, name: str, where: str) -> float | None:
        value = _time(obj, name, where, optional=True)
        return None if value is None else clock.to_mono(value)

    def nomination(item: Any, where: str) -> None:
        key = _str(item, "pod", where)
        nominations[key] = Nomination(
            key,
            _str(item, "uid", where),
            _str(item, "node", where),
            _uids_in(item, "victims", where),
            _devices_in(item, "devices", where),
            mono(item, "since", where),
            opt_mono(item, "allGoneAt", where),
        )

    def move(item: Any, where: str) -> None:
        shape_items = _list(item, "shape", where, MAX_ITEMS)
        shape = []
        for i, pair in enumerate(shape_items):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise RoomStateError(f"{where}.shape[{i}]: must be a pair of strings")
            shape.append((pair[0], pair[1]))
        uid = _str(item, "uid", where)
        active[uid] = Move(
            _str(item, "pod", where),
            uid,
            _str(item, "owner", where),
            tuple(shape),
            _str(item, "source", where),
            Destination(_str(item, "destNode", where), _devices_in(item, "destDevices", where)),
            _str(item, "forPod", where),
            mono(item, "since", where),
            opt_mono(item, "goneAt", where),
            _str(item, "replacement", where, optional=True),
            _str(item, "replacementUID", where, optional=True) or "",
        )

    def target(item: Any, where: str) -> None:
        targets[_str(item, "pod", where)] = (_str(item, "uid", where), _devices_in(item, "devices", where))

    def moved_pod(item: Any, where: str) -> None:
        moved[_str(item, "uid", where)] = mono(item, "at", where)

    def eviction(item: Any, where: str) -> None:
        recent.append((mono(item, "at", where), _str(item, "node", where)))

    def refused_into(into: dict[str, float], longest: float) -> Callable[[Any, str], None]:
        def read(item: Any, where: str) -> None:
            until = _time(item, "until", where)
            assert until is not None
            into[_str(item, "uid", where)] = clock.until_to_mono(until, longest)

        return read

    _entries(doc, "nominations", nomination)
    _entries(doc, "moves", move)
    _entries(doc, "targets", target)
    _entries(doc, "moved", moved_pod)
    _entries(doc, "evictions", eviction)
    _entries(doc, "moveRefused", refused_into(move_refused, REFUSED_RETRY_S))
    _entries(doc, "preemptionRefused", refused_into(pdb_refused, PDB_RETRY_S))

    # Every field read: now replace (nothing above touched the live state).
    noms, moves = preemption.nominations, preemption.moves
    for key in list(noms.entries):
        noms.drop(ledger, key)
    for old in list(moves.active.values()):
        ledger.forget(old.holder)
    for key in list(moves.targets):
        moves.drop_target(ledger, key)
    noms.entries = nominations
    moves.active, moves.targets, moves.moved = active, targets, moved
    moves.recent = deque(sorted(t for t in recent if now_mono - t[0] < RATE_WINDOW_S))
    moves.refused = move_refused
    preemption.refused = pdb_refused


__all__ = ["EMPTY", "KINDS", "MAX_ENTRIES", "SCHEMA", "RoomStateError", "dump", "restore"]
