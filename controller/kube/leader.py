"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never allocate at once.

The holder renews `renewTime` every `retry_s`; a candidate takes the Lease over only once it has seen
no change to it for `leaseDurationSeconds` of its OWN clock. Expiry is measured on local observed time
(monotonic, from when this replica last saw the holder or renewTime change), as client-go does: the
other holder's wall-clock `renewTime` is never compared with the local wall clock, so clock skew between
nodes cannot make two replicas lead.

A write the leader sends must also land before the Lease can pass: `write_budget()` is the time left
until a candidate could take it over (the start of the last successful round plus the lease duration),
less `WRITE_SAFETY_S`; the writer sends nothing with less left and bounds each write by it. On shutdown
the process `resign()`s (no write is sent from then on), waits for the writes in flight, and only then
is the Lease released for a standby to take at once.

Every write carries the Lease's resourceVersion, so of two candidates racing for an expired Lease exactly
one wins (the other gets 409). A leader stops acting as leader `renew_deadline_s` after the START of its
last successful round (taken before the GET and PUT are sent), so a PUT that hangs for 30 s cannot
extend leadership, and it stops before any candidate can see its Lease expire. The controller's writer
checks `is_leader()` before every write (controller/kube/writer.py).

The round runs in a `LoopRunner` (driver/looprunner.py): any exception is retried with backoff capped
at `retry_s`, and `runner` reports a dead or stuck elector to /healthz.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.kube.rest import lease_path, request
from driver.looprunner import LoopRunner

log = structlog.get_logger(__name__)

LEASE_NAME = "flexmig-controller"
WRITE_SAFETY_S = 1.0
"""Kept between a write's deadline and the earliest takeover: for the rate at which two clocks drift
apart over one lease, and the network between the API server and etcd."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _fmt(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector(threading.Thread):
    def __init__(
        self,
        api_client: Any,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        lease_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        super().__init__(name="leader-election", daemon=True)
        if not retry_s < renew_deadline_s < lease_s:
            raise ValueError(
                f"leader election timings must satisfy retry ({retry_s}) < renew deadline "
                f"({renew_deadline_s}) < lease duration ({lease_s})"
            )
        self.api = api_client
        self.namespace, self.identity, self.lease_name = namespace, identity, name
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.stop_event = threading.Event()
        self._clock = clock
        # Local monotonic time at the START of our last successful acquire/renew round (None: never).
        self._renewed_at: float | None = None
        # The Lease record as last seen (holder, renewTime, acquireTime, transitions) and when it changed.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        # Each request must end well within the renew deadline, so a hung one cannot block the round.
        self._timeout_s = max(0.5, renew_deadline_s / 2)
        self._resigned = False  # resign() was called: never lead again in this process
        self._release_on_stop = True
        self.runner = LoopRunner(
            "leader-election",
            self._round,
            interval_s=retry_s,
            stop=self.stop_event,
            backoff_start_s=min(0.5, retry_s),
            backoff_max_s=retry_s,
            stuck_after_s=max(60.0, 4 * lease_s),
            on_error=on_error,
        )

    def is_leader(self) -> bool:
        at = self._renewed_at
        return at is not None and self._clock() - at < self.renew_deadline_s

    def write_budget(self) -> float:
        """Seconds a write sent now may take and still land before another replica can lead (<= 0:
        none)."""
        at = self._renewed_at
        if at is None or not self.is_leader():
            return 0.0
        return at + self.lease_s - WRITE_SAFETY_S - self._clock()

    def resign(self, release: bool = True) -> None:
        """Stop leading now (no write is sent from here on); give the Lease up when the elector stops,
        if `release` (the caller has waited for the writes in flight), else let it expire."""
        self._resigned, self._release_on_stop = True, release
        self._renewed_at = None

    def run(self) -> None:
        self.runner.run()
        self.release()

    def stop(self) -> None:
        self.runner.stop()

    def _round(self) -> None:
        if self._resigned:
            return
        was = self.is_leader()
        started = self._clock()  # before anything is sent: the renew window starts here
        try:
            if self._try_acquire_or_renew() and not self._resigned:
                self._renewed_at = started
        finally:
            now = self.is_leader()
            if now != was:
                log.info("leadership changed", leader=now, identity=self.identity)

    def _send(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return request(self.api, method, path, body, timeout_s=self._timeout_s)

    def _spec(self, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_s),
            "acquireTime": acquire_time,
            "renewTime": _fmt(_now()),
            "leaseTransitions": transitions,
        }

    def _expired(self, spec: dict[str, Any]) -> bool:
        """Whether the Lease has not changed for its duration, on OUR clock since we saw it change."""
        record = (
            spec.get("holderIdentity"),
            spec.get("renewTime"),
            spec.get("acquireTime"),
            spec.get("leaseTransitions"),
        )
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        return now - self._observed_at > duration

    def _try_acquire_or_renew(self) -> bool:
        try:
            lease = self._send("GET", lease_path(self.namespace, self.lease_name))
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.lease_name, "namespace": self.namespace},
                "spec": self._spec(_fmt(_now()), 0),
            }
            try:
                self._send("POST", lease_path(self.namespace), body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expired = self._expired(spec)
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else _fmt(_now())
        lease["spec"] = self._spec(acquire or _fmt(_now()), transitions)
        try:
            self._send("PUT", lease_path(self.namespace, self.lease_name), lease)
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone else wrote first
            raise
        return True

    def release(self) -> None:
        """Give the Lease up on shutdown so a standby takes over at once."""
        if self._resigned:
            if not self._release_on_stop:
                return  # writes may still be in flight: the Lease expires on its own
        elif not self.is_leader():
            return
        self._renewed_at = None
        try:
            lease = self._send("GET", lease_path(self.namespace, self.lease_name))
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = None
                self._send("PUT", lease_path(self.namespace, self.lease_name), lease)
        except Exception as exc:  # the Lease then expires on its own
            log.warning("could not release the lease", error=str(exc))
