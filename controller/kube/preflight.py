"""The controller's start-up checks of the cluster: is this a Kubernetes flexmig can work with?

flexmig needs Kubernetes >= 1.34 (resource.k8s.io/v1 is served from 1.34) and the partitionable-devices
feature (DRAPartitionableDevices: the counters MIG devices consume). Without them the controller would
fail in confusing ways (404s from the watch, or MIG devices that overlap because the API server
dropped their counters). So it checks first and, on a failure, says so three ways:
- a log line at error level naming the check and what to do;
- the gauge `flexmig_preflight_ok{check}` (1 passed, 0 failed), served on the metrics port;
- a Warning event `PreflightFailed` on the controller's own pod (when it knows it: POD_NAME).
It then waits and checks again (an API server upgrade or a feature gate switched on fixes it) instead
of running; nothing is allocated meanwhile.

The partitionable-devices check can only look at ResourceSlices that exist: a MIG device of ours
published without `consumesCounters` means the API server dropped the field (gate off). With no MIG
device published yet that check passes.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Gauge
from urllib3.exceptions import HTTPError as TransportError

from api.constants import DRIVER_NAME
from controller.kube.rest import request

log = structlog.get_logger(__name__)

MIN_VERSION = (1, 34)
RESOURCE_API = "/apis/resource.k8s.io/v1"
NEEDED_RESOURCES = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
CHECKS = ("kubernetes-version", "resource-api", "partitionable-devices")
RECHECK_S = 60.0
UNREACHABLE_RETRY_S = 5.0
"""An API server that does not answer is retried sooner: nothing was judged."""
EVENT_REASON = "PreflightFailed"


@dataclass(frozen=True)
class Finding:
    check: str
    problem: str | None  # None: passed


def parse_version(info: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from /version; minor may carry a suffix ("34+" on some distributions)."""
    try:
        major = int(str(info.get("major", "")))
        minor_m = re.match(r"\d+", str(info.get("minor", "")))
        if minor_m:
            return major, int(minor_m.group())
    except ValueError:
        pass
    m = re.match(r"v(\d+)\.(\d+)", str(info.get("gitVersion", "")))
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_version(info: Mapping[str, Any]) -> Finding:
    found = parse_version(info)
    if found is None:
        return Finding("kubernetes-version", f"cannot read the version from /version: {dict(info)}")
    if found < MIN_VERSION:
        return Finding(
            "kubernetes-version",
            f"Kubernetes {found[0]}.{found[1]} is too old: flexmig needs >= "
            f"{MIN_VERSION[0]}.{MIN_VERSION[1]} (resource.k8s.io/v1, DRA partitionable devices)",
        )
    return Finding("kubernetes-version", None)


def check_resource_api(resources: Mapping[str, Any] | None) -> Finding:
    """`resources` is the /apis/resource.k8s.io/v1 discovery document, or None when not served."""
    if resources is None:
        return Finding(
            "resource-api",
            "the API server does not serve resource.k8s.io/v1: enable it (--runtime-config; it is on "
            "by default from Kubernetes 1.34)",
        )
    served = {r.get("name") for r in resources.get("resources") or ()}
    missing = [r for r in NEEDED_RESOURCES if r not in served]
    if missing:
        return Finding("resource-api", f"resource.k8s.io/v1 lacks {', '.join(missing)}")
    return Finding("resource-api", None)


def check_partitionable(slices: list[Mapping[str, Any]]) -> Finding:
    """A MIG device of ours without `consumesCounters`: the API server dropped the field."""
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") != DRIVER_NAME:
            continue
        for device in spec.get("devices") or ():
            attrs = device.get("attributes") or {}
            kind = (attrs.get("type") or attrs.get(f"{DRIVER_NAME}/type") or {}).get("string")
            if kind == "mig" and not device.get("consumesCounters"):
                name = (obj.get("metadata") or {}).get("name")
                return Finding(
                    "partitionable-devices",
                    f"ResourceSlice {name}: MIG device {device.get('name')} has no consumesCounters, so "
                    "the API server dropped them: enable the DRAPartitionableDevices feature gate on "
                    "kube-apiserver, kube-scheduler and kube-controller-manager",
                )
    return Finding("partitionable-devices", None)


def run_checks(api: Any) -> list[Finding]:
    findings = [check_version(request(api, "GET", "/version"))]
    try:
        discovery: dict[str, Any] | None = request(api, "GET", RESOURCE_API)
    except ApiException as exc:
        if exc.status != 404:
            raise
        discovery = None
    findings.append(check_resource_api(discovery))
    if findings[-1].problem is None:
        slices = request(api, "GET", f"{RESOURCE_API}/resourceslices").get("items") or []
        findings.append(check_partitionable(slices))
    return findings


class Preflight:
    def __init__(
        self, api: Any, registry: CollectorRegistry, namespace: str | None = None, pod: str | None = None
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.pod = pod
        self.gauge = Gauge(
            "flexmig_preflight_ok",
            "1 when the start-up check passed, 0 when it failed (see the controller's log)",
            ["check"],
            registry=registry,
        )
        self._reported: set[str] = set()
        self.unreachable = False

    def once(self) -> list[str]:
        """Run the checks, publish them; the problems found ([] when all passed)."""
        try:
            findings = run_checks(self.api)
        except (ApiException, OSError, TransportError) as exc:  # nothing is judged yet
            self.unreachable = True
            log.warning("preflight could not reach the API server", error=str(exc))
            return [f"API server: {exc}"]
        self.unreachable = False
        problems = []
        for f in findings:
            self.gauge.labels(f.check).set(0 if f.problem else 1)
            if f.problem:
                problems.append(f"{f.check}: {f.problem}")
                log.error(
                    "preflight failed; not allocating until it passes", check=f.check, problem=f.problem
                )
                if f.check not in self._reported:
                    self._reported.add(f.check)
                    self._event(f"{f.check}: {f.problem}")
        return problems

    def wait(
        self, stopped: Callable[[], bool], sleep: Callable[[float], bool], recheck_s: float = RECHECK_S
    ) -> bool:
        """Check until everything passes (True) or `stopped()` (False); `sleep` returns early on stop."""
        while not stopped():
            if not self.once():
                log.info("preflight passed", checks=list(CHECKS))
                return True
            sleep(min(recheck_s, UNREACHABLE_RETRY_S) if self.unreachable else recheck_s)
        return False

    def _event(self, message: str) -> None:
        if not (self.namespace and self.pod):
            return
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.pod}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.pod,
                "namespace": self.namespace,
            },
            "reason": EVENT_REASON,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": "flexmig-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            request(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/events", body)
        except ApiException as exc:  # an event is best effort: the log and the metric still say it
            log.warning("preflight event not written", status=exc.status)
