"""Preemption's and moves' promises outlive the leader (controller/allocation/roomstate.py,
roomsync.py, controller/kube/roomstore.py): a new leader holds the room a move made, completes the
move, and keeps the rate limits and the window of the last one; a lost answer is never re-sent
blindly; a document it cannot read is reported and never stops allocation."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fake_apiserver import ROOM_NAMESPACE, Harness
from kubernetes.client.exceptions import ApiException
from test_ctl_moves import device, harness, holders, movable_setup, replacement
from test_ctl_preempt import Evictions, waiting

from controller.allocation.loop import Controller
from controller.allocation.moveplan import Destination
from controller.allocation.moves import Move, Moves, MoveSettings
from controller.allocation.nominate import Nomination
from controller.allocation.preempt import Preemption
from controller.allocation.roomstate import EMPTY, RoomStateError, dump, restore
from controller.allocation.roomsync import RoomSync
from controller.kube.roomstore import KEY, MAX_BYTES, ROOM_STATE_NAME, RoomStore, RoomStoreError
from controller.kube.watchcache import RESOURCES, WatchCache
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger, ShareUse

MAP = f"{ROOM_NAMESPACE}/{ROOM_STATE_NAME}"


def new_leader(h: Harness, **settings: Any) -> Moves:
    """Another replica takes over: a fresh controller on the same API server, same writer path."""
    moves = Moves(MoveSettings(**{"enabled": True, **settings}))
    h.ctl = Controller(
        WatchCache({r: h.api.list_fn(r) for r in RESOURCES}),
        h.writer,
        room_store=RoomStore(h.writer, ROOM_NAMESPACE),
        preemption=Preemption(moves=moves),
    )
    h.ctl.apply(h.api.lists())
    h.ctl.catch_up.finished()
    h.delivered = len(h.api.watch)
    return moves


def stored_doc(h: Harness) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(h.api.objects["configmaps"][MAP]["data"][KEY])
    return doc


def test_a_new_leader_holds_the_room_a_move_made_and_completes_the_move() -> None:
    h, _ = harness()
    ev = Evictions(h)
    movable_setup(h)
    h.cycle()
    assert ev.sent == ["mover"]
    doc = stored_doc(h)
    assert [m["pod"] for m in doc["moves"]] == ["ns/mover"] and [n["pod"] for n in doc["nominations"]] == [
        "ns/big"
    ]
    moves = new_leader(h)
    h.cycle()  # its first step: the promises read back before any decision
    assert set(moves.active) == {"pod-mover"}
    assert holders(h, "moving/") == ["moving/pod-mover"] and holders(h, "making-room/") == [
        "making-room/pod-big"
    ]
    assert len(moves.recent) == 1 and "pod-mover" in moves.moved  # rate limit and window kept
    assert h.ctl.ledger.conflicts == {}
    # The moved pod ends; its replacement and an unrelated small pod arrive together.
    ev.terminate("mover")
    replacement(h, "mover-2")
    waiting(h, "intruder", 4000, 0)
    h.deliver()
    h.cycle()
    assert device(h, "c-big") == ("n1", "gpu-0-mig-7g40gb-0-0")  # the room went to the pod it was made for
    assert device(h, "c-mover-2")[0] == "n2"  # the replacement to its reserved destination
    assert moves.results.labels("completed")._value.get() == 1
    assert ev.sent == ["mover"]  # nothing evicted again by the new leader
    assert h.api.audit() == []
    h.cycle()
    assert stored_doc(h)["moves"] == [] and stored_doc(h)["nominations"] == []


def test_a_restarted_leader_keeps_the_rate_limit_and_evicts_no_more() -> None:
    h, _ = harness(per_cluster=1)
    ev = Evictions(h)
    movable_setup(h)
    h.cycle()
    assert ev.sent == ["mover"]
    # The controller restarts before the move completed, and a second big pod could use a move too.
    moves = new_leader(h, per_cluster=1)
    h.cycle()
    assert len(moves.recent) == 1
    waiting(h, "big2", 25000, 0)
    h.deliver()
    h.cycle()
    assert ev.sent == ["mover"] and h.gated("big2")


def test_without_promises_nothing_is_written() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    waiting(h, "p", 4000, 0)
    h.deliver()
    h.cycle()
    assert not h.gated("p")
    assert h.api.objects["configmaps"] == {}
    assert not [p for m, p in h.api.requests if m != "GET" and "configmaps" in p]


# --- the store: lost answers, conflicts, bounds ------------------------------------------------------


def store_on(h: Harness) -> RoomStore:
    return RoomStore(h.writer, ROOM_NAMESPACE)


def writes_of_map(h: Harness) -> list[str]:
    return [m for m, p in h.api.requests if "configmaps" in p and m != "GET"]


def test_a_write_whose_answer_was_lost_is_read_before_anything_is_sent_again() -> None:
    h = Harness({})
    store = store_on(h)
    h.api.lose.append(("POST", "/configmaps", TimeoutError("read timed out")))
    with pytest.raises(TimeoutError):
        store.save({"a": 1})
    assert stored_doc(h) == {"a": 1}  # it landed
    assert store.save({"a": 1}) is False  # read first: the same document, not sent again
    assert writes_of_map(h) == ["POST"]
    assert store.save({"a": 2}) is True
    assert writes_of_map(h) == ["POST", "PUT"] and stored_doc(h) == {"a": 2}
    # Lost again, and this time it did not land (the server refused before applying): sent after a read.
    h.api.fail.append(("PUT", f"/configmaps/{ROOM_STATE_NAME}", 503))
    with pytest.raises(ApiException):
        store.save({"a": 3})
    assert store.save({"a": 3}) is True and stored_doc(h) == {"a": 3}


def test_a_map_changed_or_deleted_under_the_store_is_read_and_written_once_more() -> None:
    h = Harness({})
    store = store_on(h)
    assert store.save({"a": 1}) is True
    h.api.objects["configmaps"][MAP]["metadata"]["resourceVersion"] = "1"  # someone else's write
    assert store.save({"a": 2}) is True and stored_doc(h) == {"a": 2}
    del h.api.objects["configmaps"][MAP]
    assert store.save({"a": 3}) is True and stored_doc(h) == {"a": 3}


def test_an_oversized_document_is_refused_and_nothing_is_sent() -> None:
    h = Harness({})
    store = store_on(h)
    with pytest.raises(RoomStoreError, match="exceeds"):
        store.save({"pad": "x" * MAX_BYTES})
    assert writes_of_map(h) == []
    h.api.objects["configmaps"][MAP] = {
        "metadata": {"name": ROOM_STATE_NAME, "namespace": ROOM_NAMESPACE, "resourceVersion": "5"},
        "data": {KEY: "x" * (MAX_BYTES + 1)},
    }
    with pytest.raises(RoomStoreError, match="over"):
        store.load()


# --- the document: round trip and hostile content -----------------------------------------------------


def populated() -> Preemption:
    p = Preemption(moves=Moves(MoveSettings(enabled=True)))
    now = time.monotonic()
    share = ShareUse("n1", "gpu-1", "s1", 1000, None, 2)
    p.nominations.entries["ns/big"] = Nomination(
        "ns/big", "pod-big", "n1", frozenset({"pod-a"}), frozenset({("n1", "gpu-0"), share}), now - 5, None
    )
    move = Move(
        "ns/a", "pod-a", "rs-1", (("gpu", "small"),), "n1",
        Destination("n2", frozenset({("n2", "gpu-0-mig-1g5gb-19-3")})), "ns/big", now - 5, now - 1,
        "ns/a-2", "pod-a2",
    )  # fmt: skip
    p.moves.active["pod-a"] = move
    p.moves.targets["ns/big"] = ("pod-big", frozenset({("n1", "gpu-0-mig-7g40gb-0-0")}))
    p.moves.moved["pod-a"] = now - 5
    p.moves.recent.append((now - 5, "n1"))
    p.moves.refused["pod-b"] = now + 30
    p.refused["pod-c"] = now + 20
    return p


def test_a_document_reads_back_to_the_same_state() -> None:
    mono, wall = time.monotonic(), time.time()
    assert dump(Preemption(), mono, wall) == EMPTY  # what "nothing promised" is compared with
    doc = json.loads(json.dumps(dump(populated(), mono, wall)))
    fresh = Preemption(moves=Moves(MoveSettings(enabled=True)))
    restore(fresh, Ledger(Inventory(())), doc, mono, wall)
    assert dump(fresh, mono, wall) == doc
    assert fresh.nominations.entries["ns/big"].devices == populated().nominations.entries["ns/big"].devices


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("schema",), 2, "state.schema"),
        (("nominations", 0, "devices"), "all", "state.nominations[0].devices"),
        (("nominations", 0, "since"), "yesterday", "state.nominations[0].since"),
        (("moves", 0, "shape", 0), ["gpu"], "state.moves[0].shape[0]"),
        (("moves", 0, "destNode"), "", "state.moves[0].destNode"),
        (("moves", 0, "replacementUID"), ["u"], "state.moves[0].replacementUID"),
        (("evictions",), [{"at": 1.0}], "state.evictions[0].node"),
        (("moved",), [{"uid": "u", "at": float("nan")}], "state.moved[0].at"),
    ],
)
def test_a_wrong_field_is_named_and_changes_nothing(path: tuple[Any, ...], value: Any, field: str) -> None:
    mono, wall = time.monotonic(), time.time()
    doc = json.loads(json.dumps(dump(populated(), mono, wall)))
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    live = populated()
    before = dump(live, mono, wall)
    with pytest.raises(RoomStateError, match=field.replace("[", r"\[").replace("]", r"\]")):
        restore(live, Ledger(Inventory(())), doc, mono, wall)
    assert dump(live, mono, wall) == before


def test_times_in_the_future_are_taken_as_now_and_deadlines_are_bounded() -> None:
    mono, wall = time.monotonic(), time.time()
    doc = dump(populated(), mono, wall)
    doc["nominations"][0]["since"] = wall + 1e9
    doc["preemptionRefused"][0]["until"] = wall + 1e9
    fresh = Preemption(moves=Moves(MoveSettings(enabled=True)))
    restore(fresh, Ledger(Inventory(())), doc, mono, wall)
    assert fresh.nominations.entries["ns/big"].since == mono
    assert fresh.refused["pod-c"] <= mono + 60


def _unreadable(h: Harness) -> None:
    h.api.objects["configmaps"][MAP] = {
        "metadata": {"name": ROOM_STATE_NAME, "namespace": ROOM_NAMESPACE, "resourceVersion": "5"},
        "data": {KEY: json.dumps({"schema": 1, "nominations": "everything"})},
    }


def _forbidden(h: Harness) -> None:
    h.api.fail.append(("GET", f"/configmaps/{ROOM_STATE_NAME}", 403))


@pytest.mark.parametrize("problem", [_unreadable, _forbidden], ids=["unreadable document", "403"])
def test_a_document_it_cannot_read_is_reported_and_allocation_goes_on(problem: Any) -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    problem(h)
    h.ctl.room.lost()  # as after a handover: read at the next leading step
    waiting(h, "p", 4000, 0)
    h.deliver()
    h.cycle()
    assert not h.gated("p")
    assert h.ctl.metrics.reconcile_errors.labels("room-state-read")._value.get() == 1


def test_a_failed_read_holds_back_decisions_until_it_succeeds() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.ctl.room.lost()
    h.api.fail.append(("GET", f"/configmaps/{ROOM_STATE_NAME}", 503))
    waiting(h, "p", 4000, 0)
    h.deliver()
    with pytest.raises(ApiException):
        h.cycle()
    assert h.gated("p")
    h.ctl.step()
    assert not h.gated("p")


def test_a_document_too_big_for_the_map_keeps_the_newest_nominations(monkeypatch: pytest.MonkeyPatch) -> None:
    import controller.kube.roomstore as roomstore

    h = Harness({})
    now = time.monotonic()
    p = h.ctl.preemption
    for i in range(40):
        devices = frozenset(("n1", f"gpu-{i}-mig-1g5gb-19-{s}") for s in range(7))
        p.nominations.entries[f"ns/p{i}"] = Nomination(
            f"ns/p{i}", f"u{i}", "n1", frozenset(), devices, now - 100 + i
        )
    whole = len(json.dumps(dump(p, now, time.time())))
    monkeypatch.setattr(roomstore, "MAX_BYTES", whole // 3)
    h.ctl.room.save(p)
    kept = [n["pod"] for n in stored_doc(h)["nominations"]]
    assert 0 < len(kept) < 40 and kept == [f"ns/p{i}" for i in range(39, 39 - len(kept), -1)]
    assert h.ctl.metrics.reconcile_errors.labels("room-state-write")._value.get() == 0


class Crashed(BaseException):
    """The process died here (a BaseException: no handler of the controller catches it)."""


def test_the_moves_are_written_before_anything_else_happens_after_their_evictions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import controller.allocation.moves as moves_mod

    def crash(point: str) -> None:
        if point == "after-move-evictions":
            raise Crashed(point)

    monkeypatch.setattr(moves_mod.crashpoints, "reach", crash)
    h = Harness({"n1": ("A100-40GB", 1), "n2": ("A100-40GB", 1)})
    moves = Moves(MoveSettings(enabled=True))
    h.ctl.preemption = Preemption(moves=moves)
    h.ctl.preemption.persist = lambda: h.ctl.room.save(h.ctl.preemption)
    ev = Evictions(h)
    movable_setup(h)
    with pytest.raises(Crashed):
        h.cycle()
    assert ev.sent == ["mover"]
    doc = stored_doc(h)  # written although the step never ended
    assert [m["pod"] for m in doc["moves"]] == ["ns/mover"] and len(doc["evictions"]) == 1


def test_an_unchanged_state_is_not_written_again_however_the_two_clocks_jitter() -> None:
    h = Harness({})
    readings = iter(range(1000))
    mono = lambda: 1000.0 + next(readings) * 0.25  # noqa: E731
    # The wall clock read a few hundred microseconds apart from the monotonic one, differently each time.
    jitter = iter([0.0004, 0.0, 0.0007, 0.0002] * 250)
    wall = lambda: 1.8e9 + mono() + next(jitter)  # noqa: E731
    sync = RoomSync(RoomStore(h.writer, ROOM_NAMESPACE), mono=mono, wall=wall)
    p = populated()
    sync.restore_once(Preemption(), h.ctl.ledger)  # a leadership begins (nothing stored yet)
    for _ in range(20):
        sync.save(p)
    assert writes_of_map(h) == ["POST"]
