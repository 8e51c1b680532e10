"""What a cluster moving from HAMi or NVIDIA's device plugin meets at the webhook, against the real API
server with the chart installed and its RBAC (the fixtures of test_webhook.py):

- a pod written for NVIDIA's device plugin (`nvidia.com/mig-2g.20gb: 1`, MIG mixed strategy) is admitted
  gated with a claim for exactly that profile, whose template the controller creates;
- a profile no allowed model offers is denied, naming the resource and the allowed profiles;
- a namespace's HAMi-style ResourceQuota (`limits.nvidia.com/gpu`, `limits.nvidia.com/gpumem`, as in
  HAMi's guide) still limits translated pods: the webhook denies the pod that would exceed it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.kube.rest import request as rest

from . import test_webhook as wh
from .k8sobjects import create_namespace, delete_namespace
from .test_webhook import DRIVER, Installed, api_message, create_pod, eventually, gpu_pod, template_of

# The chart installed with a local controller serving its webhook: test_webhook.py's module fixtures
# (installed here once more, for this module).
installed = wh.installed
ca_pem = wh.ca_pem
pods_ns = wh.pods_ns

pytestmark = pytest.mark.e2e


def test_device_plugin_profile_pod_gets_an_exact_profile_claim(installed: Installed, pods_ns: str) -> None:
    pod = create_pod(installed, pods_ns, gpu_pod("mixed", {"nvidia.com/mig-2g.20gb": "1", "cpu": "1"}))
    spec = pod["spec"]
    assert {"name": ALLOCATION_GATE} in spec["schedulingGates"]
    assert spec["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    (claim,) = spec["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == "flexmig-profile-1x-2g20gb"
    template = eventually(
        lambda: template_of(installed, pods_ns, "flexmig-profile-1x-2g20gb"), 30, "the profile template"
    )
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == f"mig.{DRIVER}"
    assert req["exactly"]["selectors"][0]["cel"]["expression"].endswith('.profile == "2g.20gb"')


def test_a_profile_no_allowed_model_offers_is_denied(installed: Installed, pods_ns: str) -> None:
    with pytest.raises(ApiException) as denied:
        create_pod(installed, pods_ns, gpu_pod("typo", {"nvidia.com/mig-2g.20gbx": "1"}))
    message = api_message(denied.value)
    assert denied.value.status == 400, message
    assert 'container "main": nvidia.com/mig-2g.20gbx asks for MIG profile' in message
    assert "2g.20gb (A100-80GB, H100-80GB, A800-80GB, H800-80GB)" in message


@pytest.fixture
def quota_ns(installed: Installed, ca_pem: bytes) -> Iterator[str]:
    namespace = f"wh-quota-{uuid.uuid4().hex[:6]}"
    create_namespace(installed.api, namespace)
    yield namespace
    delete_namespace(installed.api, namespace)


def test_hami_quota_still_limits_translated_pods(installed: Installed, quota_ns: str) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota"},
        "spec": {"hard": {"limits.nvidia.com/gpu": "2", "limits.nvidia.com/gpumem": "10000"}},
    }
    rest(installed.api, "POST", f"/api/v1/namespaces/{quota_ns}/resourcequotas", quota)
    first = create_pod(
        installed, quota_ns, gpu_pod("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"})
    )
    assert first["spec"]["schedulingGates"] == [{"name": ALLOCATION_GATE}]
    with pytest.raises(ApiException) as denied:
        create_pod(installed, quota_ns, gpu_pod("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}))
    message = api_message(denied.value)
    assert denied.value.status == 400, message
    assert (
        f"namespace '{quota_ns}': ResourceQuota 'gpu-quota' limits limits.nvidia.com/gpumem to 10000; "
        "8000 in use by the namespace's pods, this pod asks for 4000 (allowed: at most 2000 more)"
    ) in message
    # Within the limit: admitted. (The denial above needed the chart's RBAC to list quotas and pods: a
    # refused list fails the review with code 500 instead.)
    create_pod(installed, quota_ns, gpu_pod("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}))
