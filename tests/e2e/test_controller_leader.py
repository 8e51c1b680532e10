"""Leader election on a real Lease: two replicas never lead at once, and a standby takes over."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from controller.kube.leader import LeaderElector
from controller.kube.rest import lease_path, request

from .cluster import ControlPlane
from .k8sobjects import create_namespace


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_two_replicas_never_lead_together_and_standby_takes_over(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    with control_plane.api_client() as api:
        namespace = f"lease-{suffix}"
        create_namespace(api, namespace)
        # A long lease: a takeover by release (one retry, ~0.5 s) and one by expiry (>= the lease after
        # the last renewal) stay far apart even when a loaded machine slows every round.
        timings = {"lease_s": 20.0, "renew_deadline_s": 14.0, "retry_s": 0.5}
        a = LeaderElector(api, namespace, "replica-a", name=f"lease-{suffix}", **timings)
        b = LeaderElector(api, namespace, "replica-b", name=f"lease-{suffix}", **timings)
        a.start()
        b.start()
        try:
            _wait(lambda: a.is_leader() or b.is_leader(), 20, "one replica to lead")
            # Watch for a while: at no sample do both believe they lead.
            end = time.monotonic() + 4
            while time.monotonic() < end:
                assert not (a.is_leader() and b.is_leader())
                time.sleep(0.02)
            leader, standby = (a, b) if a.is_leader() else (b, a)
            lease = request(api, "GET", lease_path(namespace, f"lease-{suffix}"))
            assert lease["spec"]["holderIdentity"] == leader.identity

            # A clean shutdown releases the Lease: the standby leads well before the lease would expire.
            leader.stop_event.set()
            leader.join(timeout=10)
            assert not leader.is_leader()
            started = time.monotonic()
            _wait(standby.is_leader, 10, "the standby to take over")
            assert time.monotonic() - started < timings["lease_s"] / 2
        finally:
            for elector in (a, b):
                elector.stop_event.set()
                elector.join(timeout=10)


def test_an_expired_lease_of_a_dead_holder_is_taken_over(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    with control_plane.api_client() as api:
        namespace = f"lease-dead-{suffix}"
        create_namespace(api, namespace)
        stale = "2020-01-01T00:00:00.000000Z"
        request(
            api,
            "POST",
            lease_path(namespace),
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "held", "namespace": namespace},
                "spec": {
                    "holderIdentity": "crashed-replica",
                    "leaseDurationSeconds": 4,
                    "acquireTime": stale,
                    "renewTime": stale,
                    "leaseTransitions": 3,
                },
            },
        )
        elector = LeaderElector(
            api, namespace, "survivor", name="held", lease_s=4, renew_deadline_s=3, retry_s=0.5
        )
        elector.start()
        try:
            _wait(elector.is_leader, 15, "the survivor to take the expired lease")
            spec = request(api, "GET", lease_path(namespace, "held"))["spec"]
            assert spec["holderIdentity"] == "survivor" and spec["leaseTransitions"] == 4
        finally:
            elector.stop_event.set()
            elector.join(timeout=10)
