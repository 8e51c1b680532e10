"""The CA bundle reaches every webhook of the configuration, once, guarded by resourceVersion."""

from __future__ import annotations

import base64

import pytest
from wh_fakeapi import FakeApi

from controller.webhook.cabundle import (
    CaBundleError,
    bundle_patch,
    ensure_ca_bundle,
    webhook_configuration_path,
)

NAME = "flexmig.gpu.flexmig.dev"
COLLECTION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def config() -> dict[str, object]:
    return {
        "metadata": {"name": NAME},
        "webhooks": [
            {"name": "pods.gpu.flexmig.dev", "clientConfig": {"url": "https://127.0.0.1:9443/mutate-pods"}},
            {"name": "b.gpu.flexmig.dev", "clientConfig": {"caBundle": base64.b64encode(b"old").decode()}},
        ],
    }


def test_patch_sets_every_webhook_and_is_idempotent(fake_api: FakeApi) -> None:
    fake_api.put(COLLECTION, config())
    assert ensure_ca_bundle(None, NAME, b"PEM")
    stored = fake_api.get(webhook_configuration_path(NAME))
    assert stored is not None
    assert [w["clientConfig"]["caBundle"] for w in stored["webhooks"]] == [
        base64.b64encode(b"PEM").decode()
    ] * 2
    assert stored["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate-pods"
    writes = len(fake_api.writes())
    assert not ensure_ca_bundle(None, NAME, b"PEM")
    assert len(fake_api.writes()) == writes


def test_patch_is_guarded_by_the_resource_version_it_read() -> None:
    cfg = config()
    cfg["metadata"] = {"name": NAME, "resourceVersion": "7"}
    ops = bundle_patch(cfg, b"PEM")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert [op["path"] for op in ops[1:]] == [
        "/webhooks/0/clientConfig/caBundle",
        "/webhooks/1/clientConfig/caBundle",
    ]


def test_missing_or_refused_configuration_is_reported(fake_api: FakeApi) -> None:
    with pytest.raises(CaBundleError, match="does not exist"):
        ensure_ca_bundle(None, NAME, b"PEM")
    fake_api.put(COLLECTION, config())
    fake_api.fail[("PATCH", webhook_configuration_path(NAME))] = 403
    with pytest.raises(CaBundleError, match="refused \\(403"):
        ensure_ca_bundle(None, NAME, b"PEM")
