"""AdmissionReview in, AdmissionReview out: patch, denial, malformed input, internal errors, dry runs."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from api.constants import ALLOCATION_GATE
from controller.shim import MutationResult, ShimDefaults, TemplateSpec, mutate_pod
from controller.webhook.review import AdmissionHandler, ReviewMetrics


def pod(limits: Mapping[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "x"}
    if limits is not None:
        container["resources"] = {"limits": dict(limits)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", **meta},
        "spec": {"containers": [container]},
    }


def review(obj: Any, *, uid: str = "u-1", dry_run: bool = False, operation: str = "CREATE") -> bytes:
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": operation,
        "object": obj,
        "dryRun": dry_run,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.ensured: list[TemplateSpec] = []
        self.fail = fail

    def __call__(self, specs: Sequence[TemplateSpec]) -> None:
        if self.fail is not None:
            raise self.fail
        self.ensured += specs


def real_mutate(pod: Mapping[str, Any], namespace: str) -> MutationResult:
    return mutate_pod(pod, namespace, ShimDefaults(), lambda _entry: None)


def handler(ensure: Recorder | None = None, mutate: Any = real_mutate) -> AdmissionHandler:
    return AdmissionHandler(mutate, ensure or Recorder(), ReviewMetrics())


def answer(h: AdmissionHandler, body: bytes) -> dict[str, Any]:
    status, raw = h(body)
    assert status == 200, raw
    out = json.loads(raw)
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: dict[str, Any] = out["response"]
    return response


def test_a_legacy_gpu_pod_is_patched_and_the_templates_it_names_observed() -> None:
    ensure = Recorder()
    h = handler(ensure)
    resp = answer(h, review(pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8k", "cpu": "1"})))
    assert resp["uid"] == "u-1" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    by_path = {op["path"]: op for op in ops}
    resources = by_path["/spec/containers/0/resources"]["value"]
    assert resources["limits"] == {"cpu": "1"} and resources["claims"] == [{"name": "main-gpu"}]
    claims = by_path["/spec/resourceClaims"]["value"]
    assert [t.name for t in ensure.ensured] == [claims[0]["resourceClaimTemplateName"]]
    assert ensure.ensured[0].namespace == "team-a"
    assert by_path["/spec/schedulingGates"]["value"] == [{"name": ALLOCATION_GATE}]
    assert h.metrics.admissions.labels("mutated")._value.get() == 1


def test_a_bad_value_is_denied_with_code_400_naming_container_and_resource() -> None:
    ensure = Recorder()
    resp = answer(
        handler(ensure), review(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}))
    )
    assert resp["allowed"] is False and resp["uid"] == "u-1"
    status = resp["status"]
    assert status["code"] == 400 and status["reason"] == "BadRequest"
    assert 'container "main"' in status["message"] and "nvidia.com/gpumem-percentage" in status["message"]
    assert "1..100" in status["message"]
    assert not ensure.ensured


def test_a_pod_without_gpus_is_allowed_without_a_patch() -> None:
    resp = answer(handler(), review(pod({"cpu": "1"})))
    assert resp == {"uid": "u-1", "allowed": True}


def test_dry_run_creates_no_templates_but_still_patches() -> None:
    ensure = Recorder()
    resp = answer(handler(ensure), review(pod({"nvidia.com/gpu": "1"}), dry_run=True))
    assert resp["allowed"] is True and "patch" in resp
    assert ensure.ensured == []


def test_without_a_template_hook_the_pod_is_patched_all_the_same() -> None:
    """The service sets no hook: a review writes nothing (templates come from the template sync)."""
    h = AdmissionHandler(real_mutate, None, ReviewMetrics())
    resp = answer(h, review(pod({"nvidia.com/gpu": "1"})))
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"


@pytest.mark.parametrize("namespace", ["../kube-system", "Team-A", "a/b", "x?watch=true", "n" * 64, ""])
def test_a_review_naming_an_invalid_namespace_is_denied_naming_the_field(namespace: str) -> None:
    ensure = Recorder()
    calls: list[str] = []

    def mutate(p: Mapping[str, Any], ns: str) -> MutationResult:
        calls.append(ns)
        return real_mutate(p, ns)

    body = json.loads(review(pod({"nvidia.com/gpu": "1"})))
    body["request"]["namespace"] = namespace
    resp = answer(handler(ensure, mutate), json.dumps(body).encode())
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    message = resp["status"]["message"]
    if namespace:
        assert message.startswith(f"request.namespace: {json.dumps(namespace)}"), message
        assert "DNS-1123 label" in message
    else:
        assert "request.namespace" in message
    assert calls == [] and ensure.ensured == []  # never reached the rewrite or anything behind it


def test_an_unexpected_error_fails_closed_and_the_handler_survives() -> None:
    calls: list[str] = []

    def broken_once(p: Mapping[str, Any], ns: str) -> MutationResult:
        calls.append(ns)
        if len(calls) == 1:
            raise KeyError("spec")
        return real_mutate(p, ns)

    h = handler(mutate=broken_once)
    resp = answer(h, review(pod({"nvidia.com/gpu": "1"})))
    assert resp["allowed"] is False and resp["status"]["code"] == 500
    assert "internal error" in resp["status"]["message"]
    # and it answers the next review normally
    assert answer(h, review(pod(), uid="u-2")) == {"uid": "u-2", "allowed": True}


def test_operations_other_than_pod_create_pass_untouched() -> None:
    resp = answer(handler(), review(pod({"nvidia.com/gpu": "1"}), operation="UPDATE"))
    assert resp == {"uid": "u-1", "allowed": True}


def test_a_review_without_object_is_denied_not_crashed() -> None:
    body = json.loads(review(None))
    body["request"].pop("object")
    resp = answer(handler(), json.dumps(body).encode())
    assert resp["allowed"] is False and "request.object" in resp["status"]["message"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
            "admission.k8s.io/v1beta1",
        ),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request: missing"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}', "request.uid"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_reviews_get_400_with_the_reason(body: bytes, problem: str) -> None:
    h = handler()
    status, raw = h(body)
    assert status == 400
    assert problem in json.loads(raw)["error"]
    assert h.metrics.admissions.labels("malformed")._value.get() == 1


def test_a_review_of_an_unexpected_shape_is_answered_500() -> None:
    body = json.loads(review(pod()))
    body["request"]["kind"] = "Pod"  # a string where an object belongs
    resp = answer(handler(), json.dumps(body).encode())
    assert resp["uid"] == "u-1" and resp["allowed"] is False and resp["status"]["code"] == 500
