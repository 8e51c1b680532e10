"""Legacy (HAMi-style) pods with bad values, through the webhook's AdmissionReview handler with the real
rewrite: a denial names the container, the resource, its value and the allowed values, and creates no
ResourceClaimTemplate; what the webhook must admit (it cannot know the cluster's GPUs) is refused by the
controller with a pod condition naming what the cluster offers, and nothing is allocated.
Rows L1-L13 of docs/reliability.md."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rel_cluster import Cluster

from api.constants import ALLOCATION_GATE, ANNOTATION_VGPU_MODE
from controller.shim import MutationResult, ShimDefaults, TemplateSpec, mutate_pod
from controller.webhook.review import AdmissionHandler, ReviewMetrics


class Templates:
    """The webhook's template creator, recording what it was asked to create."""

    def __init__(self) -> None:
        self.created: list[TemplateSpec] = []

    def __call__(self, specs: Sequence[TemplateSpec]) -> None:
        self.created += specs


def legacy_pod(
    limits: Mapping[str, Any] | None = None,
    requests: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lp", "annotations": dict(annotations or {})},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": resources}]},
    }


def review(pod: Mapping[str, Any]) -> tuple[dict[str, Any], Templates, AdmissionHandler]:
    templates = Templates()

    def mutate(p: Mapping[str, Any], ns: str) -> MutationResult:
        return mutate_pod(p, ns, ShimDefaults(), lambda _entry: False)

    handler = AdmissionHandler(mutate, templates, ReviewMetrics())
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns",
            "operation": "CREATE",
            "object": pod,
        },
    }
    status, raw = handler(json.dumps(body).encode())
    assert status == 200
    return json.loads(raw)["response"], templates, handler


def denied(pod: Mapping[str, Any], *fragments: str) -> str:
    """The pod is denied (400, every fragment in the message), no template is created, the
    `flexmig_webhook_admissions_total{result="denied"}` counter counts it."""
    response, templates, handler = review(pod)
    assert response["allowed"] is False, response
    status = response["status"]
    assert (status["code"], status["reason"]) == (400, "BadRequest")
    for fragment in fragments:
        assert fragment in status["message"], (fragment, status["message"])
    assert templates.created == []
    assert handler.metrics.admissions.labels("denied")._value.get() == 1
    assert "patch" not in response
    return str(status["message"])


def admitted(pod: Mapping[str, Any]) -> tuple[list[dict[str, Any]], Templates]:
    response, templates, _ = review(pod)
    assert response["allowed"] is True, response
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return patch, templates


WHO = 'container "main"'


def test_l1_gpumem_larger_than_any_mig_profile_is_refused_by_the_controller_naming_the_largest() -> None:
    pod = legacy_pod(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100k"}, annotations={ANNOTATION_VGPU_MODE: "mig"}
    )
    # The webhook cannot know the cluster's GPUs: it admits and gates the pod.
    patch, templates = admitted(pod)
    assert [t.name for t in templates.created] == ["flexmig-mig-1x100000mi-c0"]
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ALLOCATION_GATE}]} in patch
    c = Cluster(mig={"n1": ("A100-40GB", 1)})
    c.submit_legacy(pod)
    c.assert_refused(
        "lp",
        "NoMatchingDevice",
        "claim ns/lp-main-gpu request gpus",
        "the largest MIG device published holds 40192 MiB (7g.40gb)",
    )


def test_l2_gpumem_larger_than_any_gpu_either_kind_lists_both_refusals() -> None:
    c = Cluster(mig={"n1": ("A100-40GB", 1)}, hami={"h1": [40960]})
    c.submit_legacy(legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100k"}))
    c.assert_refused(
        "lp",
        "NoMatchingDevice",
        "request gpus/mig",
        "40192 MiB (7g.40gb)",
        "requests[gpus/hami-core].capacity.requests.memory: 100000Mi exceeds the 40960Mi of gpu-0-shared",
    )


def test_l3_gpumem_above_the_shims_limit_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(2**30 + 1)}),
        WHO,
        f"nvidia.com/gpumem='{2**30 + 1}'",
        "out of range",
        "0..1073741824",
    )


def test_l4_gpumem_0_means_not_given_and_asks_for_the_whole_gpu_memory() -> None:
    pod = legacy_pod(
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}, annotations={ANNOTATION_VGPU_MODE: "mig"}
    )
    _, templates = admitted(pod)
    assert [t.name for t in templates.created] == ["flexmig-mig-1x100pct-c0"]  # HAMi: 0 = not given
    c = Cluster(mig={"n1": ("A100-40GB", 1)})
    c.submit_legacy(pod)
    allocated = c.controller.cache["resourceclaims"]["ns/lp-main-gpu"]["status"]["allocation"]
    assert [r["device"] for r in allocated["devices"]["results"]] == ["gpu-0-mig-7g40gb-0-0"]


def test_l5_gpumem_negative_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-8000"}),
        WHO,
        "nvidia.com/gpumem='-8000'",
        "out of range",
        "a whole number of MiB per GPU",
    )


def test_l6_gpumem_not_a_number_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"}),
        WHO,
        "nvidia.com/gpumem='lots'",
        "not a whole number",
        "0..1073741824",
    )


def test_l7_gpumem_with_a_binary_suffix_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8Gi"}),
        WHO,
        "nvidia.com/gpumem='8Gi'",
        "binary suffixes are not accepted",
        "MiB",
    )


def test_l8_gpu_0_alone_leaves_the_pod_untouched_and_ungated() -> None:
    patch, templates = admitted(legacy_pod({"nvidia.com/gpu": "0"}))
    assert patch == [] and templates.created == []


def test_l9_gpu_0_with_gpumem_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "8k"}),
        WHO,
        "nvidia.com/gpu is 0 but nvidia.com/gpumem is given",
        "nvidia.com/gpu: 1..32",
    )


def test_l10_gpu_100_is_denied() -> None:
    denied(legacy_pod({"nvidia.com/gpu": "100"}), WHO, "nvidia.com/gpu='100'", "out of range", "0..32")


def test_l11_gpumem_percentage_150_is_denied() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}),
        WHO,
        "nvidia.com/gpumem-percentage='150'",
        "out of range",
        "1..100",
    )


def test_l12_an_unknown_vgpu_mode_is_denied_with_the_allowed_modes() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1"}, annotations={ANNOTATION_VGPU_MODE: "MIG"}),
        f"annotation {ANNOTATION_VGPU_MODE}='MIG' is not supported",
        "'mig'",
        "'hami-core'",
        "no annotation",
    )


def test_l13_resources_only_in_requests_are_rewritten_like_limits() -> None:
    # The API server requires limits for extended resources, but it validates the pod after the
    # mutating webhook, which removes nvidia.com/* from both: the pod is admitted as if given in limits.
    from_requests, t1 = admitted(
        legacy_pod(requests={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k", "cpu": "1"})
    )
    from_limits, t2 = admitted(
        legacy_pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"}, requests={"cpu": "1"})
    )
    assert [t.name for t in t1.created] == [t.name for t in t2.created] == ["flexmig-any-1x8000mi-c0"]
    resources = {op["path"]: op["value"] for op in from_requests}["/spec/containers/0/resources"]
    assert resources == {"requests": {"cpu": "1"}, "claims": [{"name": "main-gpu"}]}
    assert {op["path"] for op in from_requests} == {op["path"] for op in from_limits}


def test_l14_limits_and_requests_that_differ_are_denied() -> None:
    denied(
        legacy_pod(limits={"nvidia.com/gpu": "1"}, requests={"nvidia.com/gpu": "2"}),
        WHO,
        "nvidia.com/gpu differs between limits ('1') and requests ('2')",
        "give it in limits only, or the same value in both",
    )


def test_l15_an_unknown_nvidia_resource_is_denied_with_the_accepted_ones() -> None:
    denied(
        legacy_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumemory": "8k"}),
        WHO,
        "nvidia.com/gpumemory cannot be combined with nvidia.com/gpu",
        "nvidia.com/gpu, nvidia.com/gpumem, nvidia.com/gpumem-percentage, nvidia.com/gpucores, nvidia.com/priority",
    )
