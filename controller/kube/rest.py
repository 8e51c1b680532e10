"""Raw JSON requests through the `kubernetes` client's transport (auth, TLS), retries only where safe.

The generated typed methods validate a dict body into a pydantic model first, which loses camelCase
fields it does not map (a claim's `spec` came out `null`), so every write goes through here with the
JSON exactly as built. Bodies are sent compact (no spaces): kube-apiserver keeps opaque `parameters`
(a RawExtension) byte for byte, and kube-scheduler's later update of a claim whose allocation config
was written with `", "` separators fails its "allocation cannot be modified" check (the client's own
`json.dumps(body)` adds those spaces).

Retries: urllib3's default policy re-sends a PUT or DELETE whose response was lost (it counts them as
idempotent). For a write with a resourceVersion that is never harmless: the first copy landed, the
second gets 409, and the caller would take a write that succeeded for one that failed. So only reads
(GET) are retried by the transport; a write is retried only when the connection could not even be
opened (nothing was sent). Every other transport error of a write surfaces, and the caller treats its
outcome as unknown (controller/kube/outcome.py).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse
from urllib3.util.retry import Retry

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"

READ_RETRIES = Retry(total=3, redirect=0)
WRITE_RETRIES = Retry(total=1, connect=1, read=False, other=0, status=0, redirect=0)
"""A write is re-sent only after a failed connect: once a byte may have reached the server, never."""


def request(
    api_client: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = JSON,
    query: list[tuple[str, str]] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """One request; the decoded response body, or ApiException (status 409, 404, ...)."""
    headers = {"Accept": JSON, "Content-Type": content_type}
    m, url, hdrs, payload, _ = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    encoded = None if payload is None else json.dumps(payload, separators=(",", ":")).encode()
    raw = api_client.rest_client.pool_manager.request(
        m,
        url,
        body=encoded,
        headers=hdrs,
        timeout=timeout_s,
        preload_content=False,
        retries=READ_RETRIES if m == "GET" else WRITE_RETRIES,
    )
    resp = RESTResponse(raw)
    resp.read()  # type: ignore[no-untyped-call]
    if not 200 <= resp.status <= 299:
        raise ApiException(http_resp=resp)
    data: dict[str, Any] = json.loads(resp.data) if resp.data else {}
    return data


def claim_path(namespace: str, name: str, sub: str = "") -> str:
    from urllib.parse import quote  # every segment escaped: names come from objects others wrote

    ns, n = quote(namespace, safe=""), quote(name, safe="")
    return f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{n}" + (f"/{sub}" if sub else "")


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    from urllib.parse import quote  # every segment escaped: names come from objects others wrote

    ns, n = quote(namespace, safe=""), quote(name, safe="")
    return f"/api/v1/namespaces/{ns}/pods/{n}" + (f"/{sub}" if sub else "")


def config_map_path(namespace: str, name: str = "") -> str:
    from urllib.parse import quote  # every segment escaped, like the other paths

    maps = f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps"
    return maps + (f"/{quote(name, safe='')}" if name else "")


def lease_path(namespace: str, name: str = "") -> str:
    from urllib.parse import quote  # every segment escaped, like the other paths

    leases = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace, safe='')}/leases"
    return leases + (f"/{quote(name, safe='')}" if name else "")
