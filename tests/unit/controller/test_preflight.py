"""controller/kube/preflight.py: the start-up checks judge /version, discovery and slices correctly."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from api.constants import DRIVER_NAME
from controller.kube import preflight
from controller.kube.preflight import (
    NEEDED_RESOURCES,
    Preflight,
    check_partitionable,
    check_resource_api,
    check_version,
    parse_version,
)


def test_versions() -> None:
    assert parse_version({"major": "1", "minor": "34+", "gitVersion": "v1.34.2-eks"}) == (1, 34)
    assert parse_version({"major": "", "minor": "", "gitVersion": "v1.36.0"}) == (1, 36)
    assert parse_version({}) is None
    assert check_version({"major": "1", "minor": "37"}).problem is None
    old = check_version({"major": "1", "minor": "33"}).problem
    assert old is not None and "1.33 is too old" in old and ">= 1.34" in old
    assert "cannot read" in (check_version({"gitVersion": "x"}).problem or "")


def test_resource_api() -> None:
    assert "does not serve resource.k8s.io/v1" in (check_resource_api(None).problem or "")
    served = {"resources": [{"name": n} for n in ("deviceclasses", "resourceclaims", "resourceslices")]}
    assert check_resource_api(served).problem == "resource.k8s.io/v1 lacks resourceclaimtemplates"
    served["resources"].append({"name": "resourceclaimtemplates"})
    assert check_resource_api(served).problem is None


def _slice(devices: list[dict[str, Any]], driver: str = DRIVER_NAME) -> dict[str, Any]:
    return {"metadata": {"name": "n1-gpu"}, "spec": {"driver": driver, "devices": devices}}


def test_partitionable_devices() -> None:
    mig = {"name": "gpu-0-mig-1g5gb-7-0", "attributes": {"type": {"string": "mig"}}}
    whole = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    assert check_partitionable([]).problem is None
    assert check_partitionable([_slice([whole])]).problem is None
    assert check_partitionable([_slice([mig], driver="other.example.com")]).problem is None
    problem = check_partitionable([_slice([whole, mig])]).problem or ""
    assert "gpu-0-mig-1g5gb-7-0 has no consumesCounters" in problem and "DRAPartitionableDevices" in problem
    counted = {**mig, "consumesCounters": [{"counterSet": "gpu-0", "counters": {}}]}
    assert check_partitionable([_slice([counted])]).problem is None


class _Scripted(Preflight):
    """Preflight whose rounds return scripted problems (the API side is covered above)."""

    def __init__(self, rounds: list[list[str]]) -> None:
        super().__init__(api=None, registry=CollectorRegistry())
        self.rounds = rounds

    def once(self) -> list[str]:
        return self.rounds.pop(0)


def test_wait_rechecks_until_it_passes_or_stops() -> None:
    slept: list[float] = []
    p = _Scripted([["resource-api: x"], ["resource-api: x"], []])

    def sleep(s: float) -> bool:
        slept.append(s)
        return False

    assert p.wait(lambda: False, sleep, recheck_s=7) is True
    assert slept == [7, 7]
    stopped = _Scripted([["kubernetes-version: old"]] * 3)
    calls = iter([False, True])
    assert stopped.wait(lambda: next(calls), lambda s: False) is False


def test_once_publishes_the_gauge_and_one_event_per_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    served: dict[str, Any] = {
        "/version": {"major": "1", "minor": "33"},
        "/apis/resource.k8s.io/v1": {"resources": [{"name": n} for n in NEEDED_RESOURCES]},
        "/apis/resource.k8s.io/v1/resourceslices": {"items": []},
    }
    posted: list[dict[str, Any]] = []

    def fake_request(_api: Any, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "POST":
            posted.append(body)
            return body  # type: ignore[no-any-return]
        if path not in served:
            raise ApiException(status=404)
        return served[path]  # type: ignore[no-any-return]

    monkeypatch.setattr(preflight, "request", fake_request)
    registry = CollectorRegistry()
    p = Preflight(api=None, registry=registry, namespace="flexmig-system", pod="ctl-0")
    assert p.once() == [
        "kubernetes-version: Kubernetes 1.33 is too old: flexmig needs >= 1.34 (resource.k8s.io/v1, DRA partitionable devices)"
    ]
    assert p.once()  # still failing: no second event
    value = registry.get_sample_value
    assert value("flexmig_preflight_ok", {"check": "kubernetes-version"}) == 0
    assert value("flexmig_preflight_ok", {"check": "resource-api"}) == 1
    assert len(posted) == 1
    event = posted[0]
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == (
        "PreflightFailed",
        "Warning",
        "ctl-0",
    )
    del served["/apis/resource.k8s.io/v1"]
    served["/version"] = {"major": "1", "minor": "34"}
    assert p.once() == [f"resource-api: {check_resource_api(None).problem}"]
    assert value("flexmig_preflight_ok", {"check": "kubernetes-version"}) == 1
    assert value("flexmig_preflight_ok", {"check": "resource-api"}) == 0


def test_unreachable_api_server_is_retried_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*_: Any, **__: Any) -> dict[str, Any]:
        raise ConnectionRefusedError("connection refused")

    monkeypatch.setattr(preflight, "request", down)
    p = Preflight(api=None, registry=CollectorRegistry())
    slept: list[float] = []
    stops = iter([False, True])

    def sleep(s: float) -> bool:
        slept.append(s)
        return False

    assert p.wait(lambda: next(stops), sleep) is False
    assert p.unreachable and slept == [preflight.UNREACHABLE_RETRY_S]
