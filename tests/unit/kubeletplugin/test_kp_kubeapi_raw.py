"""kubeletplugin/kube/kubeapi.py on raw JSON: the claim's device status is written on the version the
claim was read at (no second read), and a conflict reads it again once, keeping other drivers' entries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from kubeletplugin.kube.kubeapi import ClaimNotFound, KubeClaimApi

CLAIM = {
    "metadata": {"namespace": "ns", "name": "c", "uid": "u1", "resourceVersion": "7"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "r",
                        "driver": "gpu.flexmig.dev",
                        "pool": "n1",
                        "device": "gpu-0-mig-1g10gb-0-0",
                    }
                ]
            }
        },
        "devices": [{"driver": "other.example.com", "pool": "p", "device": "d"}],
    },
}


class _Resp:
    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()


class FakeResource:
    def __init__(self, stored: dict[str, Any], conflicts: int = 0) -> None:
        self.stored = stored
        self.conflicts = conflicts
        self.calls: list[str] = []
        self.patches: list[dict[str, Any]] = []

    def read_namespaced_resource_claim(self, **kw: Any) -> _Resp:
        self.calls.append("get")
        assert kw["_preload_content"] is False
        return _Resp(self.stored)

    def read_namespaced_resource_claim_status(self, **kw: Any) -> _Resp:
        self.calls.append("get-status")
        return _Resp(self.stored)

    def patch_namespaced_resource_claim_status(self, **kw: Any) -> _Resp:
        self.calls.append("patch")
        self.patches.append(kw["body"])
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        return _Resp(self.stored)


def _api(resource: FakeResource) -> KubeClaimApi:
    api = KubeClaimApi.__new__(KubeClaimApi)
    api._resource = resource  # type: ignore[assignment]
    api._driver = "gpu.flexmig.dev"
    return api


MINE = [{"driver": "gpu.flexmig.dev", "pool": "n1", "device": "gpu-0-mig-1g10gb-0-0"}]


def test_the_status_is_written_on_the_version_read_without_reading_again() -> None:
    res = FakeResource(CLAIM)
    api = _api(res)
    view = api.get_claim("ns", "c")
    assert view.resource_version == "7" and len(view.devices) == 1
    api.set_device_status(view, MINE)
    assert res.calls == ["get", "patch"]
    assert res.patches[0]["metadata"]["resourceVersion"] == "7"
    assert [d["driver"] for d in res.patches[0]["status"]["devices"]] == [
        "other.example.com",
        "gpu.flexmig.dev",
    ]


def test_a_conflict_reads_the_claim_again_and_keeps_the_new_entries_of_other_drivers() -> None:
    res = FakeResource(CLAIM, conflicts=1)
    api = _api(res)
    view = api.get_claim("ns", "c")
    newer = json.loads(json.dumps(CLAIM))
    newer["metadata"]["resourceVersion"] = "9"
    newer["status"]["devices"].append({"driver": "third.example.com", "pool": "q", "device": "e"})
    res.stored = newer
    api.set_device_status(view, MINE)
    assert res.calls == ["get", "patch", "get-status", "patch"]
    last = res.patches[-1]
    assert last["metadata"]["resourceVersion"] == "9"
    assert [d["driver"] for d in last["status"]["devices"]] == [
        "other.example.com",
        "third.example.com",
        "gpu.flexmig.dev",
    ]


def test_a_replaced_claim_is_not_written() -> None:
    res = FakeResource(CLAIM, conflicts=1)
    api = _api(res)
    view = api.get_claim("ns", "c")
    replaced = json.loads(json.dumps(CLAIM))
    replaced["metadata"].update(uid="u2", resourceVersion="12")
    res.stored = replaced
    with pytest.raises(ClaimNotFound):
        api.set_device_status(view, MINE)
    assert res.calls == ["get", "patch", "get-status"]
