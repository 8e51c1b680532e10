"""`flexmig status`'s "held" section: devices the controller keeps free for a waiting pod. Pure.

Placements held for a preemptor or for a move (docs/preemption.md, docs/moves.md) look free in the
slice map, yet no other pod gets them: the controller's ledger holds them. The controller keeps
those promises in the ConfigMap `flexmig-room-state` of its own namespace (the document of
controller/allocation/roomstate.py), so this view reads them from there: each nomination (the
devices freed for a preemptor, or making room for it), each target a move makes room for, and each
moved pod's reserved destination. The document is read leniently: an entry it cannot read is skipped and counted, never
an error, since the view must still draw the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HeldRow:
    why: str  # "preemption", "making room", "move destination"
    pod: str  # the pod it is held for (namespace/name)
    node: str
    devices: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True, slots=True)
class Held:
    rows: tuple[HeldRow, ...]
    skipped: int = 0  # entries the view could not read


def _devices(entry: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    items = entry.get(key)
    if not isinstance(items, list):
        return None
    out = []
    for d in items:
        if not isinstance(d, Mapping) or not isinstance(d.get("device"), str):
            return None
        out.append(str(d["device"]) + (f" (share {d['shareID']})" if d.get("shareID") else ""))
    return tuple(sorted(out))


def _fields(entry: Any, names: Sequence[str], devices_key: str) -> tuple[list[str], tuple[str, ...]] | None:
    """The named text fields and the device list of one entry; None when any is missing or wrong."""
    if not isinstance(entry, Mapping):
        return None
    texts = [_text(entry, n) for n in names]
    devices = _devices(entry, devices_key)
    if devices is None or any(t is None for t in texts):
        return None
    return [t for t in texts if t is not None], devices


def _text(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    return value if isinstance(value, str) and value else None


def held_rows(doc: Any, node: str | None = None) -> Held:
    """The rows of the room-state document `doc` (None: there is none), only `node`'s if given."""
    if not isinstance(doc, Mapping):
        return Held((), 0 if doc is None else 1)
    rows: list[HeldRow] = []
    skipped = 0

    def readable(
        key: str, names: Sequence[str], devices_key: str
    ) -> Iterator[tuple[Mapping[str, Any], list[str], tuple[str, ...]]]:
        nonlocal skipped
        entries = doc.get(key)
        for entry in entries if isinstance(entries, list) else ():
            read = _fields(entry, names, devices_key)
            if read is None:
                skipped += 1
            else:
                yield entry, *read

    nominated_nodes: dict[str, str] = {}
    for n, (pod, where), devices in readable("nominations", ("pod", "node"), "devices"):
        nominated_nodes[pod] = where
        victims = n.get("victims")
        going = len(victims) if isinstance(victims, list) and n.get("allGoneAt") is None else 0
        if devices or going:
            note = f"{going} evicted pod(s) still ending" if going else ""
            rows.append(HeldRow("preemption", pod, where, devices, note))
    for t, (pod,), devices in readable("targets", ("pod",), "devices"):
        rows.append(HeldRow("making room", pod, nominated_nodes.get(pod, _pool(t)), devices))
    for m, (moved, where), devices in readable("moves", ("pod", "destNode"), "destDevices"):
        for_pod = _text(m, "forPod") or "?"
        note = f"moved from {_text(m, 'source') or '?'} to make room for {for_pod}"
        who = _text(m, "replacement") or f"the replacement of {moved}"
        rows.append(HeldRow("move destination", who, where, devices, note))
    if node is not None:
        rows = [r for r in rows if r.node == node]
    return Held(tuple(rows), skipped)


def _pool(entry: Mapping[str, Any]) -> str:
    items = entry.get("devices") or []
    pools = {d.get("pool") for d in items if isinstance(d, Mapping)}
    return str(pools.pop()) if len(pools) == 1 else "?"


def held_lines(held: Held, note: str | None = None) -> list[str]:
    """The text section (empty when there is nothing to say)."""
    lines: list[str] = []
    if held.rows:
        lines.append("Held for waiting pods (free in the maps above, kept by the controller):")
        for r in held.rows:
            devices = ", ".join(r.devices) if r.devices else "(nothing free yet)"
            extra = f"; {r.note}" if r.note else ""
            lines.append(f"  {r.pod}: {r.why} on {r.node}: {devices}{extra}")
    if held.skipped:
        lines.append(f"  ({held.skipped} entries of the room state could not be read)")
    if note:
        lines.append(note)
    return lines


def held_document(held: Held) -> list[dict[str, Any]]:
    return [
        {"for": r.pod, "why": r.why, "node": r.node, "devices": list(r.devices), "note": r.note}
        for r in held.rows
    ]


__all__ = ["Held", "HeldRow", "held_document", "held_lines", "held_rows"]
