"""The plugin's only door to the Kubernetes API: read claims, write their device status, mirror the
realised identity onto the pod, and publish ResourceSlices.

Objects are handled as camelCase dicts (what the API server speaks), so the rest of the plugin does not
depend on the generated client's model classes. They are also read and written as raw JSON
(`_preload_content=False`): decoding an answer into the client's models and back cost more CPU per
prepared claim than the rest of the plugin's Python (benchmarks/RESULTS.md, "End to end").
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
    # The version read, and status.devices as it was then: the first status write is made on these
    # (with the version as precondition) instead of reading the claim again.
    resource_version: str = ""
    status_devices: tuple[Mapping[str, Any], ...] = ()


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
        resource_version=str(meta.get("resourceVersion") or ""),
        status_devices=tuple(d for d in status.get("devices") or () if isinstance(d, Mapping)),
    )


class KubeClaimApi:
    """`ClaimApi` on the real API server."""

    def __init__(self, api_client: k8s.ApiClient, driver_name: str) -> None:
        self._api_client = api_client
        self._resource = k8s.ResourceV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._driver = driver_name

    @staticmethod
    def _to_dict(resp: Any) -> JsonDict:
        """The JSON body of a `_preload_content=False` answer."""
        data = json.loads(resp.data)
        if not isinstance(data, dict):
            raise TypeError(f"expected an object from the API server, got {type(data).__name__}")
        return data

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        try:
            resp = self._resource.read_namespaced_resource_claim(
                name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from exc
            raise
        return claim_view_from_dict(raw_json(resp))

    def set_device_status(self, claim: ClaimView, devices: list[JsonDict]) -> None:
        """Replace this driver's entries in status.devices, keeping other drivers' entries.

        First on the version `claim` was read at (no second read); if the claim changed since (409),
        once more on a fresh read; a conflict then is the caller's to retry."""
        if claim.resource_version:
            try:
                self._patch_device_status(claim, claim.resource_version, claim.status_devices, devices)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        current = raw_json(
            self._resource.read_namespaced_resource_claim_status(
                name=claim.name,
                namespace=claim.namespace,
                _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False,
            )
        )
        meta = current.get("metadata") or {}
        if meta.get("uid") != claim.uid:
            raise ClaimNotFound(f"ResourceClaim {claim.namespace}/{claim.name} was replaced (uid changed)")
        status_devices = (current.get("status") or {}).get("devices") or []
        self._patch_device_status(claim, str(meta.get("resourceVersion") or ""), status_devices, devices)

    def _patch_device_status(
        self, claim: ClaimView, version: str, current: Any, devices: list[JsonDict]
    ) -> None:
        others = [d for d in current if isinstance(d, Mapping) and d.get("driver") != self._driver]
        body = {"metadata": {"resourceVersion": version}, "status": {"devices": others + devices}}
        # The version precondition also proves the uid: a replaced claim has a newer version (409).
        _drain(
            self._resource.patch_namespaced_resource_claim_status(
                name=claim.name,
                namespace=claim.namespace,
                body=body,
                _content_type="application/merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False,
            )
        )

    def get_pod(self, namespace: str, name: str) -> JsonDict | None:
        try:
            return raw_json(
                self._core.read_namespaced_pod(
                    name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT, _preload_content=False
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {key: value}}}
        try:
            _drain(
                self._core.patch_namespaced_pod(
                    name=name,
                    namespace=namespace,
                    body=body,
                    _content_type="application/merge-patch+json",
                    _request_timeout=REQUEST_TIMEOUT,
                    _preload_content=False,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                log.info("pod gone before its annotation could be written", namespace=namespace, pod=name)
                return
            raise


def raw_json(resp: Any) -> JsonDict:
    """The JSON object of a `_preload_content=False` answer (the publisher's slices use it too)."""
    data = json.loads(resp.data)
    if not isinstance(data, dict):
        raise TypeError(f"expected an object from the API server, got {type(data).__name__}")
    return data


def _drain(resp: Any) -> None:
    """Read a `_preload_content=False` answer to its end, as the client itself does, so that its
    connection goes back to the pool."""
    _ = resp.data


def api_error_text(exc: ApiException) -> str:
    """The API server's own message, which names the invalid field, instead of the whole HTTP dump."""
    try:
        body = json.loads(exc.body or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
