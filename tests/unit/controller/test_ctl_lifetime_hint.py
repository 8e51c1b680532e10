"""The `gpu.flexmig.dev/expected-duration` annotation: parsing, the warning for a bad value, and the
decision and ledger paths that make hinted pods ending together share a GPU."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from ctl_helpers import CLASSES, claim, decider, mem
from fake_apiserver import Harness

from api.constants import ANNOTATION_EXPECTED_DURATION
from controller.allocation.allocate import PodAllocation
from controller.allocation.lifetime import DurationError, decision_hint, parse_duration, running_end
from controller.state.inventory import PublishedDevice
from controller.state.ledger import Ledger
from driver.policy.model import GpuRef


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("45m", 2700.0), ("2h30m", 9000.0), ("1.5h", 5400.0), ("500ms", 0.5), ("3600", 3600.0)],
)
def test_go_durations_and_plain_seconds_are_read(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-5s", "0", "0s", "10d", "1h-5m", "5 m", "1e3", "inf", "99999h"])
def test_bad_durations_name_the_annotation_the_value_and_the_accepted_forms(text: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(text)
    message = str(info.value)
    assert ANNOTATION_EXPECTED_DURATION in message and repr(text) in message and "2h30m" in message


def _pod(duration: str | None, **metadata: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "uid-p", **metadata}
    if duration is not None:
        meta["annotations"] = {ANNOTATION_EXPECTED_DURATION: duration}
    return {"metadata": meta, "spec": {}}


def test_a_gated_pod_ends_a_duration_from_now_and_a_running_one_from_its_start() -> None:
    hint, problem = decision_hint(_pod("10m"), now=1000.0)
    assert problem is None and hint is not None and (hint.end, hint.remaining) == (1600.0, 600.0)
    assert decision_hint(_pod(None), now=1000.0) == (None, None)
    running = _pod("1h", creationTimestamp="2026-01-01T00:00:00Z")
    created = 1767225600.0  # 2026-01-01T00:00:00Z
    # Not started: the end known from its decision, else a duration from now; never from its creation.
    assert running_end(running, now=created + 7200, known=created + 7000) == created + 7000
    assert running_end(running, now=created + 7200) == created + 7200 + 3600
    running["status"] = {"startTime": "2026-01-01T00:10:00Z"}
    assert running_end(running, now=0.0, known=5.0) == created + 600 + 3600
    assert running_end(_pod("soon"), now=5.0) is None


class _Writer:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, obj: Any, kind: str, event_type: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


def test_a_bad_annotation_warns_once_per_value_and_the_pod_is_placed_unhinted() -> None:
    allocation = PodAllocation()
    allocation.hint_warned = {}
    writer = _Writer()
    allocation.writer = writer  # type: ignore[assignment]
    assert allocation._end_hint(_pod("ten minutes")) is None
    assert allocation._end_hint(_pod("ten minutes")) is None  # same value: no second event
    ((reason, message),) = writer.events
    assert reason == "InvalidLifetimeHint"
    assert ANNOTATION_EXPECTED_DURATION in message and "'ten minutes'" in message and "90s" in message
    assert allocation._end_hint(_pod("-1")) is None
    assert len(writer.events) == 2
    assert allocation._end_hint(_pod("20m")) is not None


def _device(ledger: Ledger, node: str, gpu: int, profile: str, start: int) -> PublishedDevice:
    for pool in ledger.inventory.pools.values():
        for dev in pool.devices.values():
            if dev.gpu == GpuRef(node, gpu) and dev.profile == profile and dev.start == start:
                return dev
    raise AssertionError(f"no {profile}@{start} published on {node}/gpu-{gpu}")


def test_a_hinted_pod_joins_the_gpu_of_the_running_pod_that_ends_with_it() -> None:
    d = decider({"n": ("A100-40GB", 2)})
    ledger = d.ledger
    # Two running pods, one 1g each at start 0 on GPUs 0 and 1: GPU 0's ends at t=100, GPU 1's at 1000.
    for gpu, end in ((0, 100.0), (1, 1000.0)):
        dev = _device(ledger, "n", gpu, "1g.5gb", 0)
        ledger.expect_end(f"running-{gpu}", end)  # the pod is seen before its claim: kept until then
        ledger.observe(f"running-{gpu}", [(dev.pool, dev.name)])
    assert ledger.cluster.latest_end(GpuRef("n", 1)) == 1000.0
    # Without a hint the tie between the two equal GPUs goes to GPU 0.
    plain = d.decide([claim("c", mem(4000))], CLASSES)
    assert plain.ok and plain.allocations[0].devices[0].gpu == GpuRef("n", 0)
    # Hinted to end at t=950 (from t=50), it goes beside the pod ending at 1000: GPU 0 can empty at 100.
    hint, _ = decision_hint(_pod("900s"), now=50.0)
    hinted = d.decide([claim("c", mem(4000))], CLASSES, end_hint=hint)
    assert hinted.ok and hinted.allocations[0].devices[0].gpu == GpuRef("n", 1)


def test_ledger_keeps_claims_ends_across_allocation_changes_and_rebuilds() -> None:
    ledger = decider({"n": ("A100-40GB", 1)}).ledger
    dev = _device(ledger, "n", 0, "2g.10gb", 0)
    ref = GpuRef("n", 0)
    ledger.assume("u", [(dev.pool, dev.name)])
    ledger.expect_end("u", 300.0)
    assert ledger.cluster.latest_end(ref) == 300.0
    ledger.forget("u")  # a rollback: the instance goes, the hint stays for the claim
    assert ledger.cluster.latest_end(ref) is None
    ledger.observe("u", [(dev.pool, dev.name)])
    assert ledger.cluster.latest_end(ref) == 300.0
    rebuilt = ledger.rebuilt(ledger.inventory)
    assert rebuilt.cluster.latest_end(ref) == 300.0
    rebuilt.expect_end("u", None)
    assert rebuilt.cluster.latest_end(ref) is None and not rebuilt.cluster.hinted


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _deliver(h: Harness, resource: str) -> None:
    """Deliver the undelivered watch events of `resource` only (the rest stay queued, in order)."""
    mine = [e for e in h.pending_watch() if e.resource == resource]
    others = [e for e in h.pending_watch() if e.resource != resource]
    h.api.watch[h.delivered :] = mine + others
    h.deliver(len(mine))
    h.cycle()


def _hinted_pod(h: Harness, name: str, claims: list[str], created: float, duration: str) -> None:
    h.add_pod(
        name,
        claims,
        metadata={
            "creationTimestamp": _iso(created),
            "annotations": {ANNOTATION_EXPECTED_DURATION: duration},
        },
    )


def test_a_decided_pods_end_survives_our_own_writes_a_release_before_it_starts_and_its_start() -> None:
    """Reviewer's repro: a pod created 2h ago with a 1h hint. Its end is decision time + 1h through
    our claim write coming back on the watch (the pod still gated in the cache), its release (no
    status.startTime yet: not creation + 1h, which is in the past) and its start; nothing is left once
    the pod and its claim are gone."""
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("c", mem(4000)))
    _hinted_pod(h, "p", ["c"], created=time.time() - 2 * 3600, duration="1h")
    h.deliver()
    before = time.time()
    h.cycle()  # decided, claim written, gate removed
    after = time.time()
    assert not h.gated("p")

    def end() -> float | None:
        return h.ctl.ledger.expected_ends.get("uid-c")

    def near_decision(value: float | None, slack: float = 0.0) -> bool:
        return value is not None and before + 3600 - slack <= value <= after + 3600 + slack

    assert near_decision(end())
    _deliver(h, "resourceclaims")  # our protect and allocation writes come back; the pod is still gated
    assert near_decision(end())
    _deliver(h, "pods")  # our release comes back: no startTime yet
    assert near_decision(end())
    started = h.api.objects["pods"]["ns/p"]
    started["status"] = {**(started.get("status") or {}), "startTime": _iso(after)}
    h.api.put_object("pods", started)  # the kubelet starts it (the timestamp has whole seconds)
    h.deliver()
    h.cycle()
    assert near_decision(end(), slack=1.0)
    gpu = GpuRef("n1", 0)
    assert near_decision(h.ctl.ledger.cluster.latest_end(gpu), slack=1.0)

    h.api.delete_object("pods", "ns/p")
    h.deliver()
    h.cycle()  # the pod is gone: its hint goes, and the claim is deallocated
    assert end() is None and not h.ctl.claim_ends
    h.api.delete_object("resourceclaims", "ns/c")
    h.deliver()
    h.cycle()
    assert not h.ctl.ledger.expected_ends and not h.ctl.claim_ends and not h.ctl.ledger.cluster.hinted


def test_two_pods_sharing_a_claim_keep_the_latest_end_and_one_leaving_keeps_the_others() -> None:
    h = Harness({"n1": ("A100-40GB", 1)})
    h.add_claim(claim("c", mem(4000)))
    now = time.time()
    _hinted_pod(h, "short", ["c"], created=now, duration="10m")
    h.deliver()
    h.cycle()
    _hinted_pod(h, "long", ["c"], created=now, duration="1h")
    h.deliver()
    h.cycle()  # the claim is allocated already: released at once
    assert not h.gated("short") and not h.gated("long")
    for name, offset in (("short", 0), ("long", 60)):
        pod = h.api.objects["pods"][f"ns/{name}"]
        pod["status"] = {"startTime": _iso(now + offset)}
        h.api.put_object("pods", pod)
    h.deliver()
    h.cycle()
    whole_seconds = float(int(now))
    assert h.ctl.ledger.expected_ends["uid-c"] == whole_seconds + 60 + 3600
    h.api.delete_object("pods", "ns/long")
    h.deliver()
    h.cycle()
    assert h.ctl.ledger.expected_ends["uid-c"] == whole_seconds + 600
    h.api.delete_object("pods", "ns/short")
    h.deliver()
    h.cycle()
    assert "uid-c" not in h.ctl.ledger.expected_ends and not h.ctl.claim_ends
