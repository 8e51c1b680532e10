"""Leader election (defect 2 of issue 10): expiry on local observed time, the renew window starting
before the PUT, leadership checked before every write, and a resync that is linear in pods + claims."""

from __future__ import annotations

import copy
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import pytest
from ctl_helpers import claim
from fake_apiserver import Harness
from kubernetes.client.exceptions import ApiException

import controller.allocation.intake as intake_mod
import controller.kube.leader as leader_mod
from controller.kube.leader import LeaderElector
from controller.kube.store import Event

Obj = dict[str, Any]


class LeaseApi:
    """One Lease with resourceVersion checks; `put_delay_s` makes every PUT take that long."""

    def __init__(self, spec: Obj | None = None) -> None:
        self.lease: Obj | None = None
        self.rv = 1
        self.put_delay_s = 0.0
        if spec is not None:
            self.lease = {"metadata": {"name": "l", "namespace": "ns", "resourceVersion": "1"}, "spec": spec}

    def __call__(self, _api: Any, method: str, path: str, body: Any = None, **_kw: Any) -> Obj:
        if method == "GET":
            if self.lease is None:
                raise ApiException(status=404)
            return copy.deepcopy(self.lease)
        if method == "PUT":
            time.sleep(self.put_delay_s)
            assert self.lease is not None
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise ApiException(status=409)
        self.rv += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.lease)


def _wall(offset_s: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeClock:
    """The elector's monotonic clock, moved only by the test: what "0.5 s later" means does not depend
    on how long a loaded machine takes to wake a sleeping test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _elector(
    monkeypatch: pytest.MonkeyPatch,
    api: LeaseApi,
    clock: Callable[[], float] = time.monotonic,
    **kw: float,
) -> LeaderElector:
    monkeypatch.setattr(leader_mod, "request", api)
    timings = {"lease_s": 1.0, "renew_deadline_s": 0.6, "retry_s": 0.1} | kw
    return LeaderElector(None, "ns", "me", name="l", clock=clock, **timings)


@pytest.mark.parametrize("renewed_s_ago", [100.0, -3600.0], ids=["holder-clock-behind", "holder-clock-ahead"])
def test_expiry_is_measured_on_local_observed_time(
    monkeypatch: pytest.MonkeyPatch, renewed_s_ago: float
) -> None:
    """The holder's renewTime says nothing about our clock: we wait a full lease duration of seeing no
    change, whether its clock is behind (old code took over at once) or ahead (old code waited an hour)."""
    spec = {"holderIdentity": "other", "leaseDurationSeconds": 1, "renewTime": _wall(-renewed_s_ago)}
    api = LeaseApi(spec)
    clock = FakeClock()
    e = _elector(monkeypatch, api, clock)
    assert not e._try_acquire_or_renew(), "took over a lease it had never seen unchanged for its duration"
    clock.advance(0.5)
    assert not e._try_acquire_or_renew()
    clock.advance(0.7)  # > 1 s of seeing no change
    assert e._try_acquire_or_renew()
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "me"


def test_a_renewing_holder_is_never_taken_over(monkeypatch: pytest.MonkeyPatch) -> None:
    api = LeaseApi({"holderIdentity": "other", "leaseDurationSeconds": 1, "renewTime": _wall(-100)})
    clock = FakeClock()
    e = _elector(monkeypatch, api, clock)
    for i in range(8):  # 1.6 s in all, longer than the lease: only the renewals keep it
        assert not e._try_acquire_or_renew()
        assert api.lease is not None
        # The holder renews (its clock far behind ours).
        api.lease["spec"]["renewTime"] = _wall(-99 + i)
        clock.advance(0.2)


def test_a_slow_put_does_not_extend_leadership(monkeypatch: pytest.MonkeyPatch) -> None:
    """The renew window starts before the request is sent: a PUT that outlasts the renew deadline leaves
    the replica NOT leading (old code started the window when the PUT returned)."""
    api = LeaseApi({"holderIdentity": "me", "leaseDurationSeconds": 1, "renewTime": _wall(0)})
    e = _elector(monkeypatch, api)
    api.put_delay_s = 0.7  # > renew deadline 0.6
    if hasattr(e, "_round"):
        e._round()
    else:  # the old elector's round, as its run() did it
        if e._try_acquire_or_renew():
            e._last_renew = time.monotonic()  # type: ignore[attr-defined]
    assert api.lease is not None and api.lease["spec"]["holderIdentity"] == "me"  # the PUT did land
    assert not e.is_leader()
    api.put_delay_s = 0.0
    e._round()
    assert e.is_leader()


def test_the_elector_survives_any_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib3.exceptions

    api = LeaseApi()
    calls = [0]

    def flaky(*args: Any, **kw: Any) -> Obj:
        calls[0] += 1
        if calls[0] <= 3:
            raise urllib3.exceptions.MaxRetryError(None, "/leases", reason="refused")  # type: ignore[arg-type]
        return api(*args, **kw)

    monkeypatch.setattr(leader_mod, "request", flaky)
    e = LeaderElector(None, "ns", "me", name="l", lease_s=1.0, renew_deadline_s=0.6, retry_s=0.1)
    e.start()
    try:
        deadline = time.monotonic() + 10
        while not e.is_leader() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert e.is_leader() and e.runner.health().ok
    finally:
        e.stop()
        e.join(5)


# --- leadership before every write ------------------------------------------------------------------


def test_leadership_is_checked_before_every_write() -> None:
    """Leadership lost in the middle of a step: not one more write goes out (old code checked once per
    step and kept writing every dirty pod)."""
    leading = [True]
    h = Harness({"n1": ("A100-40GB", 2)})
    h.ctl.is_leader = lambda: leading[0]
    writer_leads = h.writer.is_leader
    h.writer.is_leader = lambda: writer_leads() and leading[0]
    for name in ("a", "b", "c"):
        h.add_claim(claim(name, 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"'))
        h.add_pod(f"p-{name}", [name])
    h.deliver()
    sent: list[tuple[str, str]] = []
    send = h.api.send

    def losing_after_first_write(api: Any, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        out = send(api, method, path, body, **kw)
        sent.append((method, path))
        leading[0] = False  # the lease lapsed while this write was in flight
        return out

    h.writer._send = losing_after_first_write
    h.cycle()
    assert len(sent) == 1, sent
    assert sum(not h.gated(p) for p in ("p-a", "p-b", "p-c")) == 0
    # Leading again: the half-done pod is finished and the rest placed, without duplicates.
    leading[0] = True
    h.writer._send = send
    for _ in range(5):
        h.deliver()
        h.cycle()
    assert h.api.audit() == []
    assert not any(h.gated(p) for p in ("p-a", "p-b", "p-c"))


# --- linear resync ----------------------------------------------------------------------------------


def test_resync_of_claims_is_linear_in_pods_and_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting work, not time: a resync that checks C claims against P pods reads each pod's claim
    references O(1) times, not C times (old code: C x P)."""
    pods, claims = 600, 300
    h = Harness({"n1": ("A100-40GB", 1)})
    ctl = h.ctl
    items_c, items_p = [], []
    for i in range(claims):
        c = claim(f"c{i}", "true")
        c["metadata"]["resourceVersion"] = "1"
        c["metadata"]["finalizers"] = ["gpu.flexmig.dev/allocation-protection"]
        c["metadata"]["annotations"] = {"gpu.flexmig.dev/allocated-for-pod": f"gone-{i}"}
        c["status"] = {"allocation": {"devices": {"results": []}}, "reservedFor": []}
        items_c.append(c)
    for i in range(pods):
        items_p.append(
            {
                "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": "1"},
                "spec": {"resourceClaims": [{"name": "x", "resourceClaimName": f"c{i % claims}"}]},
            }
        )
    ctl.writer = None  # count reads only: nothing to deallocate is written
    ctl.apply(
        [
            Event("resourceclaims", "REPLACE", items=tuple(items_c)),
            Event("pods", "REPLACE", items=tuple(items_p)),
        ]
    )
    calls = [0]
    real = intake_mod.referenced_claims

    def counting(pod: Obj) -> set[str]:
        calls[0] += 1
        return real(pod)

    monkeypatch.setattr(intake_mod, "referenced_claims", counting)
    ctl.claims_to_check = {f"ns/c{i}" for i in range(claims)}
    for key in sorted(ctl.claims_to_check):
        ctl._check_claim(key)
    assert calls[0] <= pods, f"{calls[0]} pod reads for one resync of {claims} claims over {pods} pods"
    assert all(ctl.live_refs.in_use(f"ns/c{i}") for i in range(claims))
