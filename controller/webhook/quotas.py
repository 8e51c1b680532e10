"""The webhook's side of HAMi-style namespace quotas (controller/shim/quota.py decides): it fetches the
namespace's ResourceQuotas and, only when one limits the GPU count or memory, the namespace's pods.

A namespace without such a quota costs one list per translated pod; the pods are listed only where a
limit applies. A failed lookup fails the review (the webhook fails closed), so a quota is never
skipped because the API server was slow to answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.kube.names import namespaced_path
from controller.kube.rest import request
from controller.shim import AdmissionDenied, ShimDefaults
from controller.shim.quota import gpu_quota_limits, quota_problems
from controller.shim.templates import AnyShape

API_TIMEOUT_S = 4.0
# Finished pods hold nothing; the server leaves them out of the answer.
_LIVE = "status.phase!=Succeeded,status.phase!=Failed"


class NamespaceQuotas:
    def __init__(self, api: Any, defaults: ShimDefaults) -> None:
        self.api = api
        self.defaults = defaults

    def check(self, namespace: str, asked: Sequence[AnyShape]) -> None:
        """Raise AdmissionDenied when admitting a pod asking for `asked` breaks a limit."""
        if not asked:
            return
        quotas = request(
            self.api, "GET", namespaced_path("/api/v1", namespace, "resourcequotas"), timeout_s=API_TIMEOUT_S
        )
        limits = gpu_quota_limits(quotas.get("items") or [], self.defaults.names)
        if not limits:
            return
        pods = request(
            self.api,
            "GET",
            namespaced_path("/api/v1", namespace, "pods"),
            query=[("fieldSelector", _LIVE)],
            timeout_s=API_TIMEOUT_S,
        )
        problems = quota_problems(
            namespace,
            limits,
            pods.get("items") or [],
            asked,
            self.defaults.names,
            self.defaults.memory_factor,
        )
        if problems:
            raise AdmissionDenied("; ".join(problems))
