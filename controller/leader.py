"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never allocate at once.

The holder renews `renewTime` every `retry_s`; a candidate takes the Lease over only once the holder has
not renewed for `lease_s`. Every write carries the Lease's resourceVersion, so of two candidates racing
for an expired Lease exactly one wins (the other gets 409). A leader that fails to renew within
`renew_deadline_s` stops acting as leader *before* its Lease can expire, so there is never a moment
where two replicas both believe they lead.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.rest import lease_path, request

log = structlog.get_logger(__name__)

LEASE_NAME = "flexmig-controller"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _fmt(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


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
        self._last_renew = 0.0  # monotonic time of our last successful renewal

    def is_leader(self) -> bool:
        return self._last_renew > 0 and time.monotonic() - self._last_renew < self.renew_deadline_s

    def run(self) -> None:
        while not self.stop_event.is_set():
            was = self.is_leader()
            try:
                if self._try_acquire_or_renew():
                    self._last_renew = time.monotonic()
            except Exception as exc:
                log.warning("leader election round failed", error=str(exc))
            now = self.is_leader()
            if now != was:
                log.info("leadership changed", leader=now, identity=self.identity)
            self.stop_event.wait(self.retry_s)
        self.release()

    def _spec(self, acquire_time: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_s),
            "acquireTime": acquire_time,
            "renewTime": _fmt(_now()),
            "leaseTransitions": transitions,
        }

    def _try_acquire_or_renew(self) -> bool:
        try:
            lease = request(self.api, "GET", lease_path(self.namespace, self.lease_name))
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
                request(self.api, "POST", lease_path(self.namespace), body)
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        expired = renewed is None or (_now() - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.identity else _fmt(_now())
        lease["spec"] = self._spec(acquire or _fmt(_now()), transitions)
        try:
            request(self.api, "PUT", lease_path(self.namespace, self.lease_name), lease)
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone else wrote first
            raise
        return True

    def release(self) -> None:
        """Give the Lease up on shutdown so a standby takes over at once."""
        if not self.is_leader():
            return
        self._last_renew = 0.0
        try:
            lease = request(self.api, "GET", lease_path(self.namespace, self.lease_name))
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = None
                request(self.api, "PUT", lease_path(self.namespace, self.lease_name), lease)
        except ApiException as exc:
            log.warning("could not release the lease", error=str(exc))
