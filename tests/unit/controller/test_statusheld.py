"""`flexmig status`'s held section (controller/views/statusheld.py): what the room state says the
controller keeps free for waiting pods, read leniently."""

from __future__ import annotations

import time
from typing import Any

from controller.allocation.moveplan import Destination
from controller.allocation.moves import Move, Moves, MoveSettings
from controller.allocation.nominate import Nomination
from controller.allocation.preempt import Preemption
from controller.allocation.roomstate import dump
from controller.views.statusheld import held_document, held_lines, held_rows


def document() -> dict[str, Any]:
    p = Preemption(moves=Moves(MoveSettings(enabled=True)))
    now = time.monotonic()
    p.nominations.entries["ns/urgent"] = Nomination(
        "ns/urgent", "u1", "n1", frozenset({"v1", "v2"}), frozenset({("n1", "gpu-0-mig-3g20gb-9-4")}), now
    )
    p.nominations.entries["ns/big"] = Nomination(
        "ns/big", "u2", "n2", frozenset({"m"}), frozenset(), now, now
    )
    p.moves.targets["ns/big"] = ("u2", frozenset({("n2", "gpu-0-mig-7g40gb-0-0")}))
    p.moves.active["m"] = Move(
        "ns/mover", "m", "rs", (("gpu", "small"),), "n2",
        Destination("n3", frozenset({("n3", "gpu-1-mig-1g5gb-19-6")})), "ns/big", now,
        replacement="ns/mover-2",
    )  # fmt: skip
    return dump(p, now, time.time())


def test_every_promise_is_a_row_naming_the_pod_the_node_and_the_devices() -> None:
    held = held_rows(document())
    rows = {(r.why, r.pod, r.node, r.devices) for r in held.rows}
    assert rows == {
        ("preemption", "ns/urgent", "n1", ("gpu-0-mig-3g20gb-9-4",)),
        ("making room", "ns/big", "n2", ("gpu-0-mig-7g40gb-0-0",)),
        ("move destination", "ns/mover-2", "n3", ("gpu-1-mig-1g5gb-19-6",)),
    }
    text = "\n".join(held_lines(held))
    assert "ns/urgent: preemption on n1: gpu-0-mig-3g20gb-9-4; 2 evicted pod(s) still ending" in text
    assert "moved from n2 to make room for ns/big" in text
    assert [r["for"] for r in held_document(held_rows(document(), node="n3"))] == ["ns/mover-2"]


def test_nothing_held_says_nothing_and_a_bad_entry_is_skipped_and_counted() -> None:
    assert held_lines(held_rows(None)) == [] and held_lines(held_rows({"schema": 1})) == []
    assert held_rows("not a document").skipped == 1
    doc = document()
    doc["nominations"].append({"pod": "ns/x", "node": 7, "devices": []})
    doc["moves"].append("not an object")
    doc["targets"] = {"not": "a list"}
    held = held_rows(doc)
    assert held.skipped == 2 and {r.why for r in held.rows} == {"preemption", "move destination"}
    assert "  (2 entries of the room state could not be read)" in held_lines(held)
