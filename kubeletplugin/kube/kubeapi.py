"""The plugin's only door to the Kubernetes API: read claims, write their device status, mirror the
realised identity onto the pod, and publish ResourceSlices.

Objects are handled as camelCase dicts (what the API server speaks), so the rest of the plugin does not
depend on the generated client's model classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = structlog.get_logger(__name__)

JsonDict = dict[str, Any]

# (connect, read) seconds for every request: without it the client waits forever on an API server
# that accepts the connection but never answers, and the loop doing the call looks stuck.
REQUEST_TIMEOUT = (5.0, 30.0)


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    # Set for devices that allow multiple allocations (HAMi-core shares, contract C2 in docs/architecture.md).
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    # adminAccess: watch the device without holding it (never create or destroy anything for it).
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ClaimView:
    namespace: str
    name: str
    uid: str
    devices: tuple[AllocatedDevice, ...]
    reserved_for: tuple[PodRef, ...]
    # status.allocation.devices.config: the configs the allocator copied from class and claim.
    config: tuple[Mapping[str, Any], ...] = ()


class ClaimNotFound(LookupError):
    pass


class ClaimApi(Protocol):
    """What prepare/unprepare needs from the API server."""

    def get_claim(self, namespace: str, name: str) -> ClaimView: ...

    def set_device_status(self, claim: ClaimView, devices: list[JsonDict]) -> None: ...

    def get_pod(self, namespace: str, name: str) -> JsonDict | None: ...

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None: ...


def claim_view_from_dict(obj: JsonDict) -> ClaimView:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    devices = tuple(
        AllocatedDevice(
            request=str(r.get("request", "")),
            driver=str(r.get("driver", "")),
            pool=str(r.get("pool", "")),
            device=str(r.get("device", "")),
            share_id=str(r["shareID"]) if r.get("shareID") else None,
            consumed_capacity={str(k): str(v) for k, v in (r.get("consumedCapacity") or {}).items()},
            admin_access=r.get("adminAccess") is True,
        )
        for r in results
    )
    reserved = tuple(
        PodRef(
            namespace=str(meta.get("namespace", "")), name=str(c.get("name", "")), uid=str(c.get("uid", ""))
        )
        for c in status.get("reservedFor") or []
        if c.get("resource") == "pods"
    )
    return ClaimView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        devices=devices,
        reserved_for=reserved,
        config=tuple(
            c
            for c in ((status.get("allocation") or {}).get("devices") or {}).get("config") or ()
            if isinstance(c, Mapping)
        ),
    )


class KubeClaimApi:
    """`ClaimApi` on the real API server."""

    def __init__(self, api_client: k8s.ApiClient, driver_name: str) -> None:
        self._api_client = api_client
        self._resource = k8s.ResourceV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._driver = driver_name

    def _to_dict(self, obj: object) -> JsonDict:
        data = self._api_client.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        if not isinstance(data, dict):
            raise TypeError(f"expected an object from the API server, got {type(data).__name__}")
        return data

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        try:
            obj = self._resource.read_namespaced_resource_claim(
                name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from exc
            raise
        return claim_view_from_dict(self._to_dict(obj))

    def set_device_status(self, claim: ClaimView, devices: list[JsonDict]) -> None:
        """Replace this driver's entries in status.devices, keeping other drivers' entries."""
        current = self._to_dict(
            self._resource.read_namespaced_resource_claim_status(
                name=claim.name, namespace=claim.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        )
        meta = current.get("metadata") or {}
        if meta.get("uid") != claim.uid:
            raise ClaimNotFound(f"ResourceClaim {claim.namespace}/{claim.name} was replaced (uid changed)")
        others = [
            d for d in (current.get("status") or {}).get("devices") or [] if d.get("driver") != self._driver
        ]
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"devices": others + devices},
        }
        self._resource.patch_namespaced_resource_claim_status(
            name=claim.name,
            namespace=claim.namespace,
            body=body,
            _content_type="application/merge-patch+json",
            _request_timeout=REQUEST_TIMEOUT,
        )

    def get_pod(self, namespace: str, name: str) -> JsonDict | None:
        try:
            return self._to_dict(
                self._core.read_namespaced_pod(
                    name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {key: value}}}
        try:
            self._core.patch_namespaced_pod(
                name=name,
                namespace=namespace,
                body=body,
                _content_type="application/merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                log.info("pod gone before its annotation could be written", namespace=namespace, pod=name)
                return
            raise


def api_error_text(exc: ApiException) -> str:
    """The API server's own message, which names the invalid field, instead of the whole HTTP dump."""
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
