"""What the controller leaves kube-scheduler to do for a pod it releases (docs/architecture.md, steps
4-5): the claim is allocated *and* reserved for the pod in one write, a rollback clears both, and the
gate waits until the controller's own claim watch has delivered the allocation (controller/kube/echo.py).
"""

from __future__ import annotations

import threading
import time

from ctl_helpers import claim
from fake_apiserver import Harness

from controller.kube import echo as echo_module
from controller.kube.echo import WatchEcho

SEVEN = 'device.attributes["gpu.flexmig.dev"].profile == "7g.40gb"'


def _cycles(h: Harness, n: int = 4) -> None:
    for _ in range(n):
        h.deliver()
        h.cycle()


def test_the_allocation_reserves_the_claim_for_the_pod_it_releases() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    _cycles(h)
    assert not h.gated("px")
    status = h.api.objects["resourceclaims"]["ns/x"]["status"]
    assert status["allocation"]["devices"]["results"]
    assert status["reservedFor"] == [{"resource": "pods", "name": "px", "uid": "pod-px"}]
    # The claim and its reservation were one write, before the gate's.
    writes = [(m, p) for m, p in h.api.requests if m != "GET"]
    assert [p.rsplit("/", 2)[-2:] for m, p in writes if "resourceclaims" in p][-1] == ["x", "status"]
    assert writes[-1][1].endswith("/pods/px")


def test_a_rolled_back_allocation_leaves_no_reservation() -> None:
    h = Harness({"n1": ("A100-40GB", 2)})
    for name in ("a", "b"):
        h.add_claim(claim(name, SEVEN))
    h.add_pod("p", ["a", "b"])
    h.api.fail.append(("PUT", "/resourceclaims/b/status", 422))
    h.deliver()
    h.cycle()
    a = h.api.objects["resourceclaims"]["ns/a"]
    assert not (a.get("status") or {}).get("allocation")
    assert not (a.get("status") or {}).get("reservedFor"), "a reservation without an allocation"
    assert h.gated("p")


def test_the_deallocation_pass_frees_the_claim_once_the_pod_and_its_reservation_are_gone() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    _cycles(h)
    h.api.delete_object("pods", "ns/px")  # the fake drops the reservation, as kube-controller-manager does
    _cycles(h)
    assert not (h.api.objects["resourceclaims"]["ns/x"].get("status") or {}).get("allocation")


def test_echo_seen_before_the_wait_does_not_block() -> None:
    echo = WatchEcho()
    echo.seen("ns/x", 12)
    started = time.monotonic()
    assert echo.wait({"ns/x": 11}, 5.0) and echo.wait({"ns/x": 12}, 5.0)
    assert time.monotonic() - started < 1.0
    assert echo.waiting == 0


def test_echo_wait_ends_when_the_watch_delivers_the_version() -> None:
    echo = WatchEcho()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(echo.wait({"ns/x": 20, "ns/y": 21}, 10.0)))
    waiter.start()
    deadline = time.monotonic() + 5
    while echo.waiting < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    echo.seen("ns/x", 19)  # older: not it
    echo.seen("ns/x", 20)
    assert waiter.is_alive(), "released before y was delivered"
    echo.seen("ns/y", 25)
    waiter.join(5)
    assert result == [True] and echo.waiting == 0


def test_echo_wait_times_out_and_forgets_its_waiters() -> None:
    echo = WatchEcho()
    echo.seen("ns/x", 5)
    assert not echo.wait({"ns/x": 6}, 0.05)
    assert echo.waiting == 0


def test_echo_remembers_a_bounded_number_of_keys(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(echo_module, "RECENT", 3)
    echo = WatchEcho()
    for i in range(5):
        echo.seen(f"ns/c{i}", 100 + i)
    assert len(echo._recent) == 3
    assert echo.wait({"ns/c4": 104}, 0.0 + 1.0)
    assert not echo.wait({"ns/c0": 100}, 0.05), "the oldest key was forgotten: it is waited for again"


def test_the_gate_waits_for_the_claim_watch_to_deliver_the_allocation() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.ctl.cache.started = True  # as if reflectors fed the echo (the harness feeds events by hand)
    h.add_claim(claim("x", SEVEN))
    h.add_pod("px", ["x"])
    h.deliver()
    cycle = threading.Thread(target=h.cycle)
    cycle.start()
    deadline = time.monotonic() + 5
    while h.ctl.cache.claim_echo.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    written = h.api.objects["resourceclaims"]["ns/x"]
    assert written["status"]["allocation"] and h.gated("px"), "the gate went before the watch showed x"
    h.ctl.cache.claim_echo.seen("ns/x", int(written["metadata"]["resourceVersion"]))
    cycle.join(5)
    assert not cycle.is_alive() and not h.gated("px")
    assert (
        h.ctl.metrics.registry.get_sample_value(
            "flexmig_controller_gate_echo_wait_seconds_count", {"outcome": "seen"}
        )
        == 1
    )
