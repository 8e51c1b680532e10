"""Issue 23: the writes of different pods overlap (controller/allocation/writepool.py), and every rule of
docs/reliability.md holds whatever order they finish in.

The in-memory API server of fake_apiserver.py is put behind `SlowServer`: each request takes a fixed
time outside the server's lock (the network) and is applied under it (the server), and the server
counts how many requests were in flight at once. Assertions are on what the server saw and stores,
never on wall time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from ctl_helpers import claim
from fake_apiserver import FakeApiServer, Harness

from controller.allocation import writepool
from controller.allocation.writepool import WritePool
from flexmig.cli import build_parser
from flexmig.commands import controller as ctl_cmd

SEVEN = 'device.attributes["gpu.flexmig.dev"].profile == "7g.40gb"'
"""A whole A100-40GB as one MIG device: one per GPU, so a device given twice is easy to see."""


class SlowServer:
    """`FakeApiServer.send` with a latency per request and a count of requests in flight at once."""

    def __init__(self, api: FakeApiServer, latency_s: float = 0.02) -> None:
        self.api = api
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.applied: list[tuple[str, str]] = []  # (method, path), in the order the server applied them
        self.on_request: Any = None  # called under the lock with each request before it is applied

    def send(self, api_client: Any, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.latency_s)
            with self.lock:
                if self.on_request is not None:
                    self.on_request(method, path)
                self.applied.append((method, path))
                return self.api.send(api_client, method, path, body, **kw)
        finally:
            with self.lock:
                self.active -= 1


def _harness(pods: int, concurrency: int) -> tuple[Harness, SlowServer]:
    h = Harness({"n1": ("A100-40GB", pods)})
    h.ctl.writes = _pool(concurrency)
    server = SlowServer(h.api)
    h.writer._send = server.send
    for i in range(pods):
        h.add_claim(claim(f"c{i}", SEVEN))
        h.add_pod(f"p{i}", [f"c{i}"])
    h.deliver()
    return h, server


def _no_device_twice(api: FakeApiServer) -> None:
    devices = [d for held in api.allocations().values() for d in held]
    assert len(devices) == len(set(devices)), api.allocations()
    assert api.audit() == []


def _cycles(h: Harness, n: int = 3) -> None:
    for _ in range(n):
        h.deliver()
        h.cycle()


def _released(h: Harness, pods: int) -> list[str]:
    return [f"p{i}" for i in range(pods) if not h.gated(f"p{i}")]


_POOLS: list[WritePool] = []


def _pool(concurrency: int) -> WritePool:
    pool = WritePool(concurrency)
    _POOLS.append(pool)
    return pool


@pytest.fixture(autouse=True)
def _close_pools() -> Any:
    yield
    while _POOLS:
        _POOLS.pop().close()


def test_the_writes_of_different_pods_overlap_and_each_pod_keeps_its_order() -> None:
    h, server = _harness(8, concurrency=4)
    h.cycle()
    assert _released(h, 8) == [f"p{i}" for i in range(8)]
    assert server.max_active > 1, "the server never saw two writes at once"
    assert server.max_active <= 4
    for i in range(8):
        mine = [
            n for n, (m, p) in enumerate(server.applied) if p.endswith((f"/c{i}", f"/c{i}/status", f"/p{i}"))
        ]
        steps = [server.applied[n] for n in mine]
        assert [m for m, _ in steps] == ["PUT", "PUT", "PATCH"], steps
        assert steps[0][1].endswith(f"/c{i}") and steps[1][1].endswith(f"/c{i}/status")
    _no_device_twice(h.api)
    assert len(h.ctl.writes) == 0 and h.writer.drain(0.0)


def test_one_write_at_a_time_with_concurrency_one() -> None:
    h, server = _harness(4, concurrency=1)
    h.cycle()
    assert _released(h, 4) == ["p0", "p1", "p2", "p3"]
    assert server.max_active == 1


def test_a_lost_answer_on_one_pod_leaves_the_others_alone() -> None:
    h, server = _harness(6, concurrency=4)
    h.api.lose.append(("PUT", "/resourceclaims/c2/status", TimeoutError("read timed out")))
    h.cycle()
    assert server.max_active > 1
    assert h.api.allocations().get("ns/c2"), "the write landed on the server"
    assert h.gated("p2") and "uid-c2" in h.ctl.uncertain.entries
    assert _released(h, 6) == ["p0", "p1", "p3", "p4", "p5"]
    # What c2's allocation holds stays held: a new pod does not get its device.
    h.add_claim(claim("late", SEVEN))
    h.add_pod("plate", ["late"])
    for _ in range(3):  # the watch never shows c2's write
        for event in h.pending_watch():
            if event.obj is None or event.obj["metadata"]["name"] not in ("c2", "p2"):
                h.ctl.cache.events.put(event)
        h.delivered = len(h.api.watch)
        h.cycle()
    assert h.gated("plate") and not h.api.allocations().get("ns/late")
    _no_device_twice(h.api)


def test_a_conflict_on_one_pod_rereads_only_its_claim() -> None:
    h, server = _harness(4, concurrency=4)
    h.api.fail.append(("PUT", "/resourceclaims/c1", 409))
    h.cycle()
    reads = [p for m, p in server.applied if m == "GET"]
    assert len(reads) == 1 and reads[0].endswith("/resourceclaims/c1"), reads
    assert h.gated("p1") and "ns/p1" in h.ctl.dirty
    _cycles(h)
    assert _released(h, 4) == ["p0", "p1", "p2", "p3"]
    _no_device_twice(h.api)


def test_losing_leadership_mid_batch_stops_the_writes_and_drains_the_pool() -> None:
    h, server = _harness(12, concurrency=4)
    leading = [True]
    h.writer.is_leader = lambda: leading[0]
    h.ctl.is_leader = lambda: leading[0]
    sent_after: list[tuple[str, str]] = []

    def lost_at_the_fifth(method: str, path: str) -> None:
        if not leading[0]:
            sent_after.append((method, path))
        elif len(server.applied) == 4:  # this fifth request was sent while leading: it is applied
            leading[0] = False

    server.on_request = lost_at_the_fifth
    h.cycle()
    assert not leading[0]
    # Only writes already on the wire when leadership went (at most one per other worker) arrive.
    assert len(sent_after) <= 3, sent_after
    assert len(server.applied) <= 5 + 3
    assert len(h.ctl.writes) == 0 and server.active == 0 and h.writer.drain(0.0)
    released = _released(h, 12)
    assert len(released) < 12
    assert {f"ns/p{i}" for i in range(12) if f"p{i}" not in released} <= h.ctl.dirty
    _no_device_twice(h.api)
    # Leading again: every pod is placed, none twice.
    leading[0] = True
    _cycles(h, 4)
    assert len(_released(h, 12)) == 12
    _no_device_twice(h.api)


def test_two_pods_sharing_a_claim_are_written_one_after_the_other() -> None:
    h = Harness({"n1": ("A100-40GB", 2)})
    h.ctl.writes = _pool(4)
    server = SlowServer(h.api)
    h.writer._send = server.send
    h.add_claim(claim("shared", SEVEN))
    h.add_pod("pa", ["shared"])
    h.add_pod("pb", ["shared"])
    h.deliver()
    h.cycle()
    assert not h.gated("pa") and not h.gated("pb")
    allocation_writes = [p for m, p in server.applied if p.endswith("/resourceclaims/shared/status")]
    assert len(allocation_writes) == 1, "the shared claim was decided twice"
    _no_device_twice(h.api)


def test_the_flag_defaults_and_range() -> None:
    assert (ctl_cmd.DEFAULT_WRITE_CONCURRENCY, ctl_cmd.MAX_WRITE_CONCURRENCY) == (
        writepool.DEFAULT_WRITE_CONCURRENCY,
        writepool.MAX_WRITE_CONCURRENCY,
    )
    args = build_parser().parse_args(["controller"])
    assert args.write_concurrency == writepool.DEFAULT_WRITE_CONCURRENCY
    assert ctl_cmd._validate(args) is None
    for bad in ("0", "65"):
        problem = ctl_cmd._validate(build_parser().parse_args(["controller", "--write-concurrency", bad]))
        assert problem is not None and problem.startswith("--write-concurrency:")
    with pytest.raises(ValueError):
        WritePool(0)


def test_a_refused_write_of_one_pod_frees_only_its_devices() -> None:
    h, _server = _harness(4, concurrency=4)
    h.api.fail.append(("PUT", "/resourceclaims/c3/status", 422))
    h.cycle()
    assert h.gated("p3") and not h.api.allocations().get("ns/c3")
    assert _released(h, 4) == ["p0", "p1", "p2"]
    assert "uid-c3" not in h.ctl.ledger.assumed
    _cycles(h)
    _no_device_twice(h.api)
