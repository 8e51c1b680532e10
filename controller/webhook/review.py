"""One AdmissionReview (admission.k8s.io/v1) in, one out: the shim's rewrite as a base64 JSONPatch,
or a denial naming what to fix.

- A review that is not one (not JSON, wrong apiVersion/kind, no request.uid) gets HTTP 400 with a
  message saying what is wrong: there is no uid to answer to.
- The shim's `AdmissionDenied` becomes `allowed: false` with status code 400 and its message.
- Anything unexpected (a bug, the API server unreachable while checking a claim) becomes
  `allowed: false` with code 500: the webhook fails closed like its failurePolicy, and the process
  keeps serving.
- A review writes nothing: whoever reaches the webhook port can send one, for any namespace and a pod
  that never comes to exist. The templates a patched pod names are created by the leader once the pod
  exists (controller/webhook/templatesync.py), so the webhook declares `sideEffects: None`.
- `request.namespace` must be a namespace name (a DNS-1123 label): it becomes part of request paths.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from controller.kube.names import label_problem
from controller.shim import AdmissionDenied, MutationResult, TemplateSpec

log = structlog.get_logger(__name__)

API_VERSION = "admission.k8s.io/v1"
Mutate = Callable[[Mapping[str, Any], str], MutationResult]
"""(pod, namespace) -> the rewrite; raises AdmissionDenied."""
ObserveTemplates = Callable[[Sequence[TemplateSpec]], None]
"""Told the templates an admitted pod (not a dry run) names; must not write (the caller of a review is
not authenticated). Tests record through it; the service sets none."""


class ReviewMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.admissions = Counter(
            "flexmig_webhook_admissions_total",
            "Pod admission reviews answered, by result: mutated, unchanged, denied, error, malformed.",
            ["result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "flexmig_webhook_admission_seconds",
            "Time to answer one admission review.",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )


class _Malformed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _parse(raw: bytes) -> Mapping[str, Any]:
    try:
        review = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Malformed(f"the body is not JSON ({exc})") from exc
    if not isinstance(review, Mapping):
        raise _Malformed("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise _Malformed(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got apiVersion "
            f"{review.get('apiVersion')!r} kind {review.get('kind')!r} (set admissionReviewVersions: [v1])"
        )
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise _Malformed("request: missing")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise _Malformed("request.uid: missing")
    return request


class AdmissionHandler:
    def __init__(
        self,
        mutate: Mutate,
        observe_templates: ObserveTemplates | None = None,
        metrics: ReviewMetrics | None = None,
    ) -> None:
        self.mutate = mutate
        self.observe_templates = observe_templates
        self.metrics = metrics or ReviewMetrics()

    def __call__(self, raw: bytes) -> tuple[int, bytes]:
        """(HTTP status, response body) for one request body. Never raises."""
        started = time.perf_counter()
        try:
            request = _parse(raw)
        except _Malformed as exc:
            self.metrics.admissions.labels("malformed").inc()
            log.warning("malformed admission review", problem=exc.message)
            return 400, _encode({"error": f"not an AdmissionReview: {exc.message}"})
        try:
            result, response = self._review(request)
        except Exception as exc:  # a review of an unexpected shape must not cost the connection
            log.exception("admission review failed", uid=request["uid"])
            result = "error"
            response = _denied(request["uid"], 500, f"flexmig webhook: cannot review this request: {exc!r}")
        self.metrics.admissions.labels(result).inc()
        self.metrics.latency.observe(time.perf_counter() - started)
        return 200, _encode({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})

    def _review(self, request: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        uid = request["uid"]
        kind = request.get("kind") or {}
        who = f"{request.get('namespace')}/{request.get('name') or _generate_name(request)}"
        if (kind.get("group"), kind.get("kind"), request.get("operation")) != ("", "Pod", "CREATE"):
            # Only pod CREATE is registered; anything else is let through untouched, never blocked.
            return "unchanged", {"uid": uid, "allowed": True}
        pod = request.get("object")
        namespace = request.get("namespace") or ((pod or {}).get("metadata") or {}).get("namespace")
        if not isinstance(pod, Mapping) or not isinstance(namespace, str) or not namespace:
            return "error", _denied(uid, 400, "request.object or request.namespace: missing from the review")
        if problem := label_problem("request.namespace", namespace):
            log.info("pod denied", pod=who, message=problem)
            return "denied", _denied(uid, 400, problem)
        try:
            result = self.mutate(pod, namespace)
        except AdmissionDenied as exc:
            log.info("pod denied", pod=who, message=exc.message)
            return "denied", _denied(uid, 400, exc.message)
        except Exception as exc:
            log.exception("pod rewrite failed", pod=who)
            return "error", _denied(
                uid, 500, f"flexmig webhook: internal error while reviewing the pod: {exc}"
            )
        if result.templates and not request.get("dryRun") and self.observe_templates is not None:
            self.observe_templates(result.templates)
        if not result.patch:
            log.debug("pod unchanged", pod=who, reason=result.reason)
            return "unchanged", {"uid": uid, "allowed": True}
        log.info("pod mutated", pod=who, gated=result.gated, reason=result.reason)
        return "mutated", {
            "uid": uid,
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(_encode(result.patch)).decode(),
        }


def _generate_name(request: Mapping[str, Any]) -> str:
    meta = (request.get("object") or {}).get("metadata") or {}
    return f"{meta.get('generateName') or ''}*" if meta.get("generateName") else "?"


def _denied(uid: str, code: int, message: str) -> dict[str, Any]:
    return {
        "uid": uid,
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": code,
            "reason": "BadRequest" if code == 400 else "InternalError",
            "message": message,
        },
    }
