"""The webhook's quota lookups: one list of the namespace's quotas per rewritten pod, the pods listed only
where a GPU limit applies, and a denial carrying the shim's message."""

from __future__ import annotations

import pytest
from wh_fakeapi import FakeApi

from controller.shim import AdmissionDenied, Mode, Shape, ShimDefaults
from controller.shim.templates import template_name
from controller.webhook.quotas import NamespaceQuotas

ASK = Shape(count=1, memory_mib=6000, memory_percent=None, cores=0, mode=Mode.MIG)


def _quota(hard: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "gpu-quota", "namespace": "team"}, "spec": {"hard": hard}}


def test_namespace_without_gpu_quota_lists_no_pods(fake_api: FakeApi) -> None:
    fake_api.put("/api/v1/namespaces/team/resourcequotas", _quota({"cpu": "8"}))
    fake_api.calls.clear()
    NamespaceQuotas(None, ShimDefaults()).check("team", [ASK])
    assert fake_api.calls == [("GET", "/api/v1/namespaces/team/resourcequotas")]


def test_pod_over_the_limit_is_denied_and_nothing_is_written(fake_api: FakeApi) -> None:
    fake_api.put("/api/v1/namespaces/team/resourcequotas", _quota({"limits.nvidia.com/gpumem": "10000"}))
    held = {
        "metadata": {"name": "a", "namespace": "team"},
        "spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": template_name(ASK)}]},
        "status": {"phase": "Running"},
    }
    fake_api.put("/api/v1/namespaces/team/pods", held)
    fake_api.calls.clear()
    quotas = NamespaceQuotas(None, ShimDefaults())
    with pytest.raises(AdmissionDenied, match="6000 in use by the namespace's pods, this pod asks for 6000"):
        quotas.check("team", [ASK])
    assert fake_api.writes() == []
    quotas.check("team", [])  # a pod the shim did not rewrite is not looked at
    quotas.check("other", [ASK])  # another namespace: its own quotas (none)
