"""Put the self-generated CA bundle into the MutatingWebhookConfiguration's webhooks.

A JSON patch with a `test` of the resourceVersion first: if Helm (an upgrade) or anyone else changed
the configuration since it was read, the patch fails instead of writing a caBundle at an index that
now means another webhook; the next round reads again. Only webhooks whose caBundle differs are
touched, so a steady state costs one GET per round.
"""

from __future__ import annotations

import base64
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException

from controller.kube.rest import request

log = structlog.get_logger(__name__)

JSON_PATCH = "application/json-patch+json"


def webhook_configuration_path(name: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"


def bundle_patch(config: dict[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """The JSON patch making every webhook of `config` trust `ca_pem` ([] if all already do)."""
    wanted = base64.b64encode(ca_pem).decode()
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") != wanted:
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted})
    if ops:
        rv = config["metadata"]["resourceVersion"]
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    return ops


class CaBundleError(RuntimeError):
    """The configuration could not be patched this round (the message says why)."""


def ensure_ca_bundle(api: Any, name: str, ca_pem: bytes) -> bool:
    """Patch the configuration's caBundle if needed; True if it was changed."""
    path = webhook_configuration_path(name)
    try:
        config = request(api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            raise CaBundleError(f"MutatingWebhookConfiguration {name} does not exist (yet)") from exc
        raise
    ops = bundle_patch(config, ca_pem)
    if not ops:
        return False
    try:
        request(api, "PATCH", path, ops, content_type=JSON_PATCH)
    except ApiException as exc:
        raise CaBundleError(
            f"MutatingWebhookConfiguration {name}: caBundle patch refused ({exc.status} {exc.reason}); "
            "retried next round"
        ) from exc
    log.info("webhook CA bundle patched", configuration=name, webhooks=len(ops) - 1)
    return True
