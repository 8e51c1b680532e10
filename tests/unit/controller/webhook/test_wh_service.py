"""The service as `flexmig controller` runs it: a follower waits for the leader's certificate and
writes nothing; the leader creates it, patches the configuration, and both serve real reviews, which
write nothing; the leader's template sync creates a template once a pod that names it exists."""

from __future__ import annotations

import base64
import http.client
import json
import math
import ssl
import tempfile
import time

from wh_fakeapi import FakeApi

from controller.shim import ShimDefaults
from controller.webhook import WebhookService, WebhookSettings
from controller.webhook.cabundle import webhook_configuration_path
from controller.webhook.certstore import secret_path

CONFIG = "flexmig.gpu.flexmig.dev"
SETTINGS = WebhookSettings(
    port=0,
    address="127.0.0.1",
    configuration=CONFIG,
    hosts=("127.0.0.1",),
    cert_namespace="flexmig-system",
    cert_secret="cert",
)


def review_pod(port: int, ca_pem: bytes) -> dict[str, object]:
    with tempfile.NamedTemporaryFile(suffix=".crt") as f:
        f.write(ca_pem)
        f.flush()
        ctx = ssl.create_default_context(cafile=f.name)
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "x",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "team-a",
            "operation": "CREATE",
            "object": pod,
        },
    }
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.request("POST", "/mutate-pods", json.dumps(body), {"Content-Type": "application/json"})
    out: dict[str, object] = json.loads(conn.getresponse().read())["response"]
    conn.close()
    return out


def test_follower_waits_leader_writes_both_serve(fake_api: FakeApi) -> None:
    fake_api.put(
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        {
            "metadata": {"name": CONFIG},
            "webhooks": [
                {"name": "pods.gpu.flexmig.dev", "clientConfig": {"url": "https://127.0.0.1/mutate-pods"}}
            ],
        },
    )
    fake_api.calls.clear()
    follower = WebhookService(None, SETTINGS, ShimDefaults(), is_leader=lambda: False)
    leader = WebhookService(None, SETTINGS, ShimDefaults(), is_leader=lambda: True)
    try:
        follower.tick()
        assert not follower.serving.is_set() and fake_api.writes() == []
        leader.tick()
        assert leader.serving.is_set()
        secret = fake_api.get(secret_path("flexmig-system", "cert"))
        assert secret is not None
        ca_pem = base64.b64decode(secret["data"]["ca.crt"])
        config = fake_api.get(webhook_configuration_path(CONFIG))
        assert config is not None
        assert base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]) == ca_pem
        follower.tick()
        assert follower.serving.is_set()
        writes_before = list(fake_api.writes())
        patches = []
        for service in (leader, follower):
            assert service.server is not None
            response = review_pod(service.server.port, ca_pem)
            assert response["allowed"] is True and response["patchType"] == "JSONPatch"
            patches.append(json.loads(base64.b64decode(str(response["patch"]))))
        # Reviews write nothing: the pod they describe may never exist.
        assert fake_api.writes() == writes_before
        assert not [p for p in fake_api.objects if "/resourceclaimtemplates/" in p]
        # Once the patched pod exists, the leader's template sync creates its template; a follower's
        # does nothing.
        stored = {
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {},
            "status": {"phase": "Pending"},
        }
        for op in patches[0]:
            if op["path"] == "/spec/resourceClaims":
                stored["spec"]["resourceClaims"] = op["value"]
        fake_api.put("/api/v1/namespaces/team-a/pods", stored)
        for service in (leader, follower):
            service.sync.watch_fn = lambda _rv: []
        follower.sync.once()
        assert not [p for p in fake_api.objects if "/resourceclaimtemplates/" in p]
        leader.sync.once()
        templates = [p for p in fake_api.objects if "/resourceclaimtemplates/" in p]
        assert len(templates) == 1 and templates[0].startswith("/apis/resource.k8s.io/v1/namespaces/team-a/")
        del fake_api.objects["/api/v1/namespaces/team-a/pods/p"]
        # Garbage collection is the leader's alone: with the template past its grace and no pod
        # using it, a follower's tick deletes nothing, and the leader's next collection does.
        later = time.time() + SETTINGS.template_grace_s + 60
        for service in (leader, follower):
            service.collector.clock = lambda: later
            service._last_gc = -math.inf
        follower.tick()
        assert ("DELETE", templates[0]) not in fake_api.writes()
        leader.tick()
        assert ("DELETE", templates[0]) in fake_api.writes()
        assert fake_api.get(templates[0]) is None
    finally:
        follower.stop()
        leader.stop()


def test_a_server_whose_accept_loop_died_is_started_again(fake_api: FakeApi) -> None:
    """serve_forever raising (not a stop) must not leave the webhook silent until the pod restarts."""
    leader = WebhookService(None, SETTINGS, ShimDefaults(), is_leader=lambda: True)
    try:
        leader.tick()
        first = leader.server
        assert first is not None and first.alive()
        secret = fake_api.get(secret_path("flexmig-system", "cert"))
        assert secret is not None
        ca_pem = base64.b64decode(secret["data"]["ca.crt"])

        first._server.shutdown()  # the accept loop ends the way an exception in it would: thread gone
        first._thread.join(timeout=5)
        assert not first.alive()

        leader.tick()
        second = leader.server
        assert second is not None and second is not first and second.alive()
        assert leader.serving.is_set()
        assert review_pod(second.port, ca_pem)["allowed"] is True
    finally:
        leader.stop()
