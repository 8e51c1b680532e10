"""Test objects the e2e tests create: one ResourceClaim shape and one Pod shape, with the variations
the tests need (selectors, count, opaque config; scheduling gates; a claim by name or template)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

UNPULLABLE_IMAGE = "registry.invalid/e2e:never-pulled"  # there is no kubelet: nothing is ever pulled


def claim_body(
    name: str,
    device_class: str,
    selectors: Sequence[str] = (),
    *,
    count: int | None = None,
    config: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim with one request named "gpu"."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config:
        devices["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def pod_body(name: str, claim: str | Mapping[str, str], *, gates: Sequence[str] = ()) -> dict[str, Any]:
    """A pod whose one container uses pod claim "gpu": a claim name, or a {"resourceClaimTemplateName": ...}."""
    source = {"resourceClaimName": claim} if isinstance(claim, str) else dict(claim)
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "containers": [
            {"name": "main", "image": UNPULLABLE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", **source}],
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
