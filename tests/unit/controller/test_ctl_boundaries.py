"""Issue 21, points 1-4: what the API server holds stays one device per claim when a write's response is
lost, a rollback fails, an outside writer gives one device to two claims, or leadership changes hands.

Every assertion that matters is on what the in-memory API server stores (`audit`: no device in two
claims' allocations), never on the controller's own structures alone.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from ctl_helpers import claim
from fake_apiserver import FakeApiServer, Harness
from kubernetes.client.exceptions import ApiException

from controller.allocation.loop import Controller
from controller.kube.store import Event
from controller.kube.watchcache import RESOURCES, WatchCache
from controller.kube.writer import Writer

SEVEN = 'device.attributes["gpu.flexmig.dev"].profile == "7g.40gb"'
"""The whole A100-40GB as one MIG device: exactly one per GPU, so two holders are easy to see."""

Obj = dict[str, Any]


def _allocated(api: FakeApiServer, name: str) -> list[tuple[str, str]]:
    return api.allocations().get(f"ns/{name}", [])


def _no_device_twice(api: FakeApiServer) -> None:
    seen: dict[tuple[str, str], str] = {}
    for key, devices in api.allocations().items():
        for dev in devices:
            assert dev not in seen, f"{dev} is held by {seen[dev]} and {key} on the server"
            seen[dev] = key
    assert api.audit() == []


def _deliver_only(h: Harness, keep: Callable[[Event], bool]) -> None:
    """Deliver the undelivered watch events `keep` selects; the others are dropped (a late watch that
    the test never lets catch up)."""
    for event in h.pending_watch():
        if keep(event):
            h.ctl.cache.events.put(event)
    h.delivered = len(h.api.watch)


def _about(*names: str) -> Callable[[Event], bool]:
    return lambda e: e.obj is not None and e.obj["metadata"]["name"] in names


def _cycles(h: Harness, n: int = 4, keep: Callable[[Event], bool] = lambda _e: True) -> None:
    for _ in range(n):
        _deliver_only(h, keep)
        h.cycle()


@pytest.mark.parametrize(
    "lost",
    [TimeoutError("read timed out"), ConnectionResetError("reset after send"), ApiException(status=504)],
    ids=["timeout", "connection-cut", "gateway-timeout"],
)
def test_an_allocation_whose_response_was_lost_is_never_given_again(lost: BaseException) -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    h.deliver()
    h.api.lose.append(("PUT", "/resourceclaims/x/status", lost))
    h.cycle()
    assert _allocated(h.api, "x"), "the write landed on the server"
    # The watch is late: nothing about x reaches the controller; another pod wants the same device.
    h.add_claim(claim("y", SEVEN))
    h.add_pod("py", ["y"])
    _cycles(h, keep=_about("y", "py"))
    _no_device_twice(h.api)
    assert not _allocated(h.api, "y") and h.gated("py")
    # Once settled by a read (after the write's deadline), x's pod is released with what it holds.
    h.ctl.uncertain.entries = {
        uid: dataclasses.replace(entry, settle_after=0.0) for uid, entry in h.ctl.uncertain.entries.items()
    }
    _cycles(h, keep=_about("y", "py"))
    assert not h.ctl.uncertain.entries
    assert not h.gated("px") and h.gated("py")
    _no_device_twice(h.api)


def test_a_conflict_on_our_own_claim_rereads_it_and_stops_the_step() -> None:
    """The transport of old re-sent a PUT whose response was lost and got 409: that 409 says the cache
    is stale, not that nothing was written."""
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    h.add_claim(claim("y", SEVEN))
    h.add_pod("py", ["y"])
    h.deliver()
    h.api.lose.append(("PUT", "/resourceclaims/x/status", ApiException(status=409, reason="Conflict")))
    reads_before = sum(1 for r in h.api.requests if r[0] == "GET")
    h.cycle()
    assert _allocated(h.api, "x")
    assert sum(1 for r in h.api.requests if r[0] == "GET") > reads_before, "the claim was not re-read"
    _cycles(h, keep=_about("y", "py"))  # the watch never shows x's write
    _no_device_twice(h.api)
    assert not _allocated(h.api, "y") and h.gated("py")


def test_a_failed_rollback_keeps_the_device_taken() -> None:
    """Undoing the first claim of a two-claim pod fails (API down): the server still holds it, so it
    must not go to the next pod."""
    h = Harness({"n1": ("A100-40GB", 2)})
    for name in ("a", "b", "c"):
        h.add_claim(claim(name, SEVEN))
    h.add_pod("p", ["a", "b"])
    h.deliver()
    send = h.writer._send

    def b_refused_then_down(api: Any, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        if method == "PUT" and path.endswith("/resourceclaims/b/status") and not h.api.down:
            h.api.down = True  # the API server goes away right after refusing b
            raise ApiException(status=422, reason="Invalid")
        return send(api, method, path, body, **kw)

    h.writer._send = b_refused_then_down
    h.cycle()
    assert _allocated(h.api, "a"), "the rollback could not reach the server"
    h.api.down = False
    h.writer._send = send
    h.add_pod("q", ["c"])
    _cycles(h, keep=_about("c", "q", "b", "p"))  # a's own events never arrive
    _no_device_twice(h.api)


def test_a_device_held_twice_stays_taken_until_both_let_go() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    _cycles(h)
    assert _allocated(h.api, "x") and not h.gated("px")
    # An outside writer gives y the device x holds.
    y = claim("y", SEVEN)
    y["status"] = copy.deepcopy(h.api.objects["resourceclaims"]["ns/x"]["status"])
    h.add_claim(y)
    _cycles(h)
    assert h.ctl.metrics.registry.get_sample_value("flexmig_devices_held_twice_total") == 1
    assert h.ctl.metrics.registry.get_sample_value("flexmig_devices_held_twice_now") == 1
    warned = {e["involvedObject"]["name"] for e in h.api.events if e["reason"] == "DeviceHeldTwice"}
    assert warned == {"x", "y"}
    # x's pod ends: the controller deallocates x. y still holds the device.
    h.api.delete_object("pods", "ns/px")
    _cycles(h)
    assert not _allocated(h.api, "x")
    h.add_claim(claim("z", SEVEN))
    h.add_pod("pz", ["z"])
    _cycles(h)
    assert not _allocated(h.api, "z") and h.gated("pz"), "the device y holds was given to a third claim"
    assert h.ctl.metrics.registry.get_sample_value("flexmig_devices_held_twice_now") == 0
    # y lets go (its holder clears it): now z gets it.
    y_now = copy.deepcopy(h.api.objects["resourceclaims"]["ns/y"])
    y_now.pop("status")
    h.api.put_object("resourceclaims", y_now)
    _cycles(h)
    assert _allocated(h.api, "z")
    _no_device_twice(h.api)


class _Replica:
    """A second controller on the same API server, with its own cache, writer and leadership flag."""

    def __init__(self, api: FakeApiServer) -> None:
        self.leading = False
        self.writer = Writer(None, send=api.send)
        self.ctl = Controller(
            WatchCache({r: api.list_fn(r) for r in RESOURCES}),
            self.writer,
            is_leader=lambda: self.leading,
        )
        self.ctl.apply(api.lists())


def test_a_new_leader_catches_up_before_its_first_decision() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    old_leading = [True]
    h.ctl.is_leader = lambda: old_leading[0]
    standby = _Replica(h.api)
    standby.ctl.step()  # a standby: nothing decided, nothing written
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    _cycles(h)
    assert _allocated(h.api, "x")
    # Handover: the old leader stops, the standby leads; its watch has not delivered x's writes yet.
    old_leading[0] = False
    standby.leading = True
    h.add_claim(claim("y", SEVEN))
    h.add_pod("py", ["y"])
    for event in h.api.watch:
        if event.obj is not None and event.obj["metadata"]["name"] in ("y", "py"):
            standby.ctl.cache.events.put(event)
    for _ in range(3):
        standby.ctl.apply(standby.ctl.cache.next_batch(timeout_s=0.0))
        standby.ctl.step()
    _no_device_twice(h.api)
    assert not _allocated(h.api, "y")
    assert ("LIST", "resourceclaims") in h.api.requests
    assert standby.ctl.metrics.registry.get_sample_value("flexmig_leader_catch_ups_total") == 1


def test_a_standby_that_cannot_list_decides_nothing() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    standby = _Replica(h.api)
    standby.leading = True
    h.add_claim(claim("y", SEVEN))
    h.add_pod("py", ["y"])
    for event in h.pending_watch():
        standby.ctl.cache.events.put(event)
    h.api.down = True

    def refused(**_kw: Any) -> Any:
        raise ConnectionRefusedError("list refused")

    for reflector in standby.ctl.cache.reflectors:
        reflector.list_fn = refused
    standby.ctl.apply(standby.ctl.cache.next_batch(timeout_s=0.0))
    with pytest.raises(ConnectionRefusedError):
        standby.ctl.step()
    h.api.down = False
    assert not _allocated(h.api, "y")
    assert not standby.ctl.catch_up.done
