"""Start-up check that the plugin's identity may do what publishing and prepare need.

Run with the node's own credentials (`system:node:<name>`), the plugin used to start, publish, create
the GPU instance of the first claim and only then fail at the claim status write ("cannot get resource
resourceclaims/status"). The Node authorizer does not allow a node to write claim status; the chart's
ServiceAccount (deployments/helm/flexmig/templates/rbac-kubeletplugin.yaml) does. So before touching
NVML the plugin asks the API server, with one SelfSubjectAccessReview per permission, whether it holds
each of the permissions below (exactly the calls kubeletplugin/kube/kubeapi.py and kubeletplugin/publish/publisher.py make), and
exits naming every missing one.

Reviews are cluster-wide (no namespace, no name): the chart grants them through a ClusterRole, and a
claim may live in any namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from kubernetes import client as k8s

from driver.backoff import Backoff
from kubeletplugin.kube.kubeapi import REQUEST_TIMEOUT

log = structlog.get_logger(__name__)

# The API server may still be starting when the node agent does: keep asking for this long.
DEFAULT_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Permission:
    verb: str
    group: str
    resource: str
    subresource: str
    why: str

    def __str__(self) -> str:
        group = f"{self.group}/" if self.group else ""
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {group}{self.resource}{sub}"


RESOURCE = "resource.k8s.io"
REQUIRED: tuple[Permission, ...] = (
    Permission("get", RESOURCE, "resourceclaims", "", "prepare reads the claim's allocation"),
    Permission("get", RESOURCE, "resourceclaims", "status", "prepare reads the claim's device status"),
    Permission("patch", RESOURCE, "resourceclaims", "status", "prepare records the realised devices"),
    Permission("list", RESOURCE, "resourceslices", "", "the publisher lists this node's slices"),
    Permission("create", RESOURCE, "resourceslices", "", "the publisher creates this node's slices"),
    Permission("update", RESOURCE, "resourceslices", "", "the publisher updates this node's slices"),
    Permission("delete", RESOURCE, "resourceslices", "", "the publisher deletes extra slices"),
    Permission("get", "", "pods", "", "prepare reads the pods that reserve a claim"),
    Permission("patch", "", "pods", "", "prepare writes the HAMi mirror annotation on those pods"),
)


class AccessDenied(Exception):
    """The identity lacks permissions; the message names each one and what needs it."""


class AccessUnknown(Exception):
    """The API server did not answer the reviews in time."""


Review = Callable[[Permission], bool]


def api_review(api_client: k8s.ApiClient) -> Review:
    """A SelfSubjectAccessReview per permission on the real API server."""
    authz = k8s.AuthorizationV1Api(api_client)

    def review(p: Permission) -> bool:
        body = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    verb=p.verb, group=p.group, resource=p.resource, subresource=p.subresource
                )
            )
        )
        result = authz.create_self_subject_access_review(body, _request_timeout=REQUEST_TIMEOUT)
        return bool(result.status is not None and result.status.allowed)

    return review


def whoami(api_client: k8s.ApiClient) -> str:
    """The user name the API server sees (for the message); "" when it cannot say."""
    try:
        review = k8s.AuthenticationV1Api(api_client).create_self_subject_review(
            k8s.V1SelfSubjectReview(),
            _request_timeout=REQUEST_TIMEOUT,
        )
        info = review.status.user_info if review.status is not None else None
        return str(info.username or "") if info is not None else ""
    except Exception:  # the name only decorates the message
        return ""


def check_access(
    review: Review,
    *,
    who: str = "",
    required: Sequence[Permission] = REQUIRED,
    wait_s: float = DEFAULT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Raise AccessDenied naming every missing permission, AccessUnknown when the API server does not
    answer within `wait_s` (any error is retried with backoff until then)."""
    deadline = clock() + wait_s
    # 0.5 s doubling to 8 s, no jitter: one process asking its own API server, nothing to de-synchronise.
    backoff = Backoff(0.5, 8.0, jitter=0.0)
    while True:
        try:
            missing = [p for p in required if not review(p)]
            break
        except Exception as exc:
            delay = backoff.next_delay()
            if clock() + delay > deadline:
                raise AccessUnknown(
                    f"cannot check the plugin's permissions: the API server did not answer for {wait_s:.0f} s"
                    f" ({type(exc).__name__}: {exc})"
                ) from exc
            log.warning("cannot check permissions yet; retrying", error=str(exc), retry_in_s=delay)
            sleep(delay)
    if missing:
        identity = f"identity {who!r}" if who else "the plugin's identity"
        lines = "; ".join(f"{p} ({p.why})" for p in missing)
        raise AccessDenied(
            f"{identity} lacks permissions the kubelet plugin needs: {lines}. Run the plugin with the"
            " chart's ServiceAccount (its ClusterRole grants exactly these), not with the node's"
            " credentials: see docs/kubelet-plugin.md"
        )
