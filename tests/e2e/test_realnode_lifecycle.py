"""The chart's lifecycle on a REAL node (issue 22, Build 3): `helm upgrade` to a new image while a GPU
pod runs, `helm test`, and a `helm uninstall` that leaves nothing that blocks or leaks.

One install (realnode/chart.py `ChartNodeScenario`: the chart's controller and plugin as containers of
flexmig's image on a real kubelet + containerd + runc node, host network, values only) serves the
module's tests, in order:

1. upgrade: the image is tagged a second time in the node's containerd (`ctr images tag`, no
   registry) and `helm upgrade --set image.tag=<new>` rolls the controller (maxSurge 0: its host
   ports allow one pod per node) and the plugin DaemonSet. Meanwhile a prober dry-runs a GPU pod and a
   plain pod every ~0.3 s and audits every claim's allocation on the API server
   (`controller/state/audit.py`); the running MIG pod keeps its container and its GPU instance, new
   GPU pods are allocated, the webhook answers again with the certificate of the same Secret.
2. rotation: the Secret's serving certificate is replaced by one two thirds through its life; the new
   controller renews it from the same CA, so the configuration's caBundle verifies what is served.
3. `helm test`: the chart's test pod, from the same image, on the node (`tests.*` values).
4. uninstall with a GPU pod still running: see the test's docstring and deployments/README.md.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE, DRIVER_NAME
from controller.kube.rest import pod_path, request
from controller.kube.writer import FINALIZER
from controller.state.audit import audit_allocations
from controller.webhook.certs import issue_serving, rotation_reason

from .cluster import ControlPlane, wait_until
from .realnode.chart import ChartNodeScenario, new_gpus
from .realnode.images import product_image
from .realnode.node import NodeBinaries
from .test_realnode_chart import guide_pod, user_pod

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
RESOURCE = "/apis/resource.k8s.io/v1"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
NEW_TAG = "0.1.0-lifecycle"
DRY_RUN = [("dryRun", "All")]


@pytest.fixture(scope="module")
def sc(
    control_plane: ControlPlane, node_bin_dir: Path, request: pytest.FixtureRequest
) -> Iterator[ChartNodeScenario]:
    if os.geteuid() != 0:
        raise AssertionError("the real-node tests need root (containerd, runc, kubelet): run pytest as root")
    s = ChartNodeScenario(
        control_plane, NodeBinaries(node_bin_dir), product_image(), new_gpus([("A100-40GB", True)]), "mig"
    )
    try:
        s.start()
    except BaseException as exc:
        exc.add_note(f"chart pods: {s.explain()}\n{s.logs_of('kubelet-plugin')}\n{s.logs_of('controller')}")
        s.stop(failed=True)
        raise
    failed_before = request.session.testsfailed
    yield s
    s.stop(failed=request.session.testsfailed > failed_before)


@dataclass
class Prober:
    """Dry-runs a GPU pod and a plain pod and audits all allocations, every ~0.3 s, in a thread."""

    sc: ChartNodeScenario
    ns: str
    gpu: list[tuple[float, str]] = field(default_factory=list)  # (time, "mutated" or the refusal)
    plain_refused: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    empty_ca_bundle: int = 0
    audits: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with self.sc.cp.api_client() as api:
            gpu_pod, plain = guide_pod(self.sc, "probe-gpu", "mig"), user_pod(self.sc, "probe-plain")
            path, dry = f"/api/v1/namespaces/{self.ns}/pods", [("dryRun", "All")]
            while not self._stop.wait(0.3):
                try:
                    made = request(api, "POST", path, gpu_pod, query=dry)
                    gated = {"name": ALLOCATION_GATE} in made["spec"].get("schedulingGates", [])
                    self.gpu.append((time.monotonic(), "mutated" if gated else "NOT MUTATED"))
                except ApiException as exc:
                    self.gpu.append((time.monotonic(), f"{exc.status}: {exc.body}"))
                try:
                    request(api, "POST", path, plain, query=dry)
                except ApiException as exc:
                    self.plain_refused.append(f"{exc.status}: {exc.body}")
                hooks = request(api, "GET", f"{MWC}/{self.sc.release}.{DRIVER_NAME}")["webhooks"]
                self.empty_ca_bundle += not all(h["clientConfig"].get("caBundle") for h in hooks)
                claims = request(api, "GET", f"{RESOURCE}/resourceclaims")["items"]
                slices = request(api, "GET", f"{RESOURCE}/resourceslices")["items"]
                self.violations += [str(v) for v in audit_allocations(claims, slices)]
                self.audits += 1


def create_retrying(sc: ChartNodeScenario, ns: str, body: dict[str, Any], timeout_s: float = 60) -> None:
    """Create a pod, retrying while the webhook is unreachable (as a ReplicaSet or Job would)."""
    errors: list[str] = []

    def created() -> bool:
        try:
            sc.create(ns, "pods", body)
        except ApiException as exc:
            assert "failed calling webhook" in str(exc.body), exc.body
            errors.append(str(exc.body))
            return False
        return True

    wait_until(created, timeout_s, f"the webhook to admit {body['metadata']['name']} ({errors[-1:]})")


def cert_secret(sc: ChartNodeScenario) -> dict[str, bytes]:
    secret = request(sc.api, "GET", f"/api/v1/namespaces/{sc.namespace}/secrets/{sc.release}-webhook-cert")
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def served_certificate(sc: ChartNodeScenario) -> bytes:
    """The webhook's certificate (DER), verified against the configuration's caBundle as the API
    server does (host name 127.0.0.1 included)."""
    [hook] = request(sc.api, "GET", f"{MWC}/{sc.release}.{DRIVER_NAME}")["webhooks"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode())
    with (
        socket.create_connection(("127.0.0.1", sc.ports["webhook"]), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def pem_to_der(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def container_of(sc: ChartNodeScenario, ns: str, name: str) -> tuple[str, str, int]:
    pod = request(sc.api, "GET", pod_path(ns, name))
    [status] = pod["status"]["containerStatuses"]
    return pod["metadata"]["uid"], status["containerID"], status["restartCount"]


def chart_image(sc: ChartNodeScenario, component: str) -> str:
    image: str = sc.pod_now(component)["spec"]["containers"][0]["image"]
    return image


# --------------------------------------------------------------------------------------------------


def test_helm_upgrade_to_a_new_image_while_a_gpu_pod_runs(sc: ChartNodeScenario) -> None:
    ns = sc.test_namespace("lc-up")
    sc.create(ns, "pods", guide_pod(sc, "before", "mig"))
    sc.wait_running(ns, "before", timeout_s=150)
    instances, container = sc.instances(), container_of(sc, ns, "before")
    assert len(instances) == 1, instances
    tls_before = cert_secret(sc)
    assert pem_to_der(tls_before["tls.crt"]) == served_certificate(sc)

    repository, _ = sc.image.name.rsplit(":", 1)
    new_image = f"{repository}:{NEW_TAG}"
    sc.real.ctr("images", "tag", "--force", sc.image.name, new_image)
    old_pods = {c: sc.pod_now(c)["metadata"]["uid"] for c in ("controller", "kubelet-plugin")}
    started = time.monotonic()
    with Prober(sc, ns) as probe:
        sc.image_tag = NEW_TAG
        sc.helm_upgrade()
        create_retrying(sc, ns, guide_pod(sc, "after-1", "mig"))  # right after `helm upgrade` returns
        for component in ("controller", "kubelet-plugin"):
            wait_until(
                lambda c=component: (
                    sc.pod_now(c)["metadata"]["uid"] not in ("", old_pods[c])  # type: ignore[misc]
                    and chart_image(sc, c) == new_image
                ),
                120,
                f"the {component} pod of the new image",
            )
        sc.wait_ready("controller")
        sc.wait_plugin()
        rolled = time.monotonic() - started
        create_retrying(sc, ns, guide_pod(sc, "after-2", "mig"))
        for name in ("after-1", "after-2"):
            sc.wait_running(ns, name, timeout_s=120)
        time.sleep(1)  # one more audit round with all three allocated
    assert probe.audits > 10 and probe.violations == [], probe.violations
    assert probe.plain_refused == [], probe.plain_refused  # matchConditions: never sent to the webhook
    # The webhook answered, or failed closed the documented way while no controller listened
    # (maxSurge 0 with host ports: deployments/README.md, "Upgrades").
    refused = [(t, r) for t, r in probe.gpu if r != "mutated"]
    unexpected = [r for _, r in refused if "failed calling webhook" not in r]
    assert not unexpected, unexpected
    kinds = sorted({r.rsplit(": ", 1)[-1][:60] for _, r in refused})
    assert probe.gpu[-1][1] == "mutated", probe.gpu[-3:]
    gap = (refused[-1][0] - refused[0][0]) if refused else 0.0
    print(
        f"\n[lifecycle] rollout {rolled:.1f}s; webhook refused {len(refused)} of {len(probe.gpu)} dry runs "
        f"over {gap:.1f}s ({kinds}); caBundle empty in {probe.empty_ca_bundle} rounds; {probe.audits} audits"
    )
    assert probe.empty_ca_bundle == 0  # helm's three-way merge leaves the patched caBundle alone

    # The running pod: same container, never restarted, same GPU and compute instance.
    assert container_of(sc, ns, "before") == container
    now = sc.instances()
    assert set(instances) <= set(now) and len(now) == 3, (instances, now)
    # Certificate: the new controller serves the one in the Secret, which the caBundle verifies.
    tls_after = cert_secret(sc)
    assert tls_after == tls_before
    assert pem_to_der(tls_after["tls.crt"]) == served_certificate(sc)


def test_webhook_certificate_rotates_after_the_upgrade(sc: ChartNodeScenario) -> None:
    """A serving certificate due for renewal (two thirds of its life gone) in the Secret: the upgraded
    controller's leader renews it from the same CA, and what it serves verifies with the caBundle."""
    assert chart_image(sc, "controller").endswith(f":{NEW_TAG}")
    path = f"/api/v1/namespaces/{sc.namespace}/secrets/{sc.release}-webhook-cert"
    secret = request(sc.api, "GET", path)
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    import datetime as dt

    issued = dt.datetime.now(dt.UTC) - dt.timedelta(days=70)
    cert, key = issue_serving(data["ca.crt"], data["ca.key"], ["127.0.0.1"], issued, dt.timedelta(days=90))
    secret["data"] = {
        **secret["data"],
        "tls.crt": base64.b64encode(cert).decode(),
        "tls.key": base64.b64encode(key).decode(),
    }
    request(sc.api, "PUT", path, secret)

    def renewed() -> bool:
        return cert_secret(sc)["tls.crt"] not in (cert, data["tls.crt"])

    wait_until(renewed, 40, "the controller to renew the webhook certificate")
    after = cert_secret(sc)
    assert after["ca.crt"] == data["ca.crt"] and after["ca.key"] == data["ca.key"]
    from controller.webhook.certs import CertBundle

    bundle = CertBundle(after["ca.crt"], after["ca.key"], after["tls.crt"], after["tls.key"])
    assert rotation_reason(bundle, ["127.0.0.1"], dt.datetime.now(dt.UTC)) is None
    wait_until(
        lambda: served_certificate(sc) == pem_to_der(after["tls.crt"]), 30, "the renewed certificate served"
    )


def test_helm_test_passes(sc: ChartNodeScenario) -> None:
    out = sc.cp.helm("test", sc.release, "-n", sc.namespace, "--timeout", "3m", check=False)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{sc.explain()}"
    assert "Phase:          Succeeded" in out.stdout, out.stdout


def driver_objects(sc: ChartNodeScenario) -> dict[str, list[str]]:
    """What of the driver is left on the API server, the node and the simulated GPUs."""
    slices = request(sc.api, "GET", f"{RESOURCE}/resourceslices")["items"]
    classes = request(sc.api, "GET", f"{RESOURCE}/deviceclasses")["items"]
    hooks = [
        h["metadata"]["name"]
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for h in request(sc.api, "GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")["items"]
        if DRIVER_NAME in h["metadata"]["name"]
    ]
    return {
        # This node's only: other tests' nodes on the same control plane keep theirs.
        "slices": [
            s["metadata"]["name"]
            for s in slices
            if s["spec"]["driver"] == DRIVER_NAME
            and sc.node_name in (s["spec"].get("nodeName"), (s["spec"].get("pool") or {}).get("name"))
        ],
        "classes": [c["metadata"]["name"] for c in classes if c["metadata"]["name"].endswith(DRIVER_NAME)],
        "webhooks": hooks,
        "chart pods": [p["metadata"]["name"] for p in sc.pods(sc.namespace)],
        "instances": [str(i) for i in sc.instances()],
        "cdi specs": [p.name for p in sc.cdi_dir.glob(f"{DRIVER_NAME}*.json")],
    }


def test_helm_uninstall_leaves_nothing_that_blocks_or_leaks(sc: ChartNodeScenario) -> None:
    """Uninstall with one GPU pod still running (deployments/README.md, "Uninstall", says what a user
    gets): the release's objects, slices, classes, webhook and the shim's template go at once and pods
    are admitted again; the running pod keeps its container, GPU instance and CDI spec. Deleted, it
    stays Terminating (no plugin to unprepare it, its claim keeps the controller's finalizer) until the
    chart is installed again, which finishes both; a second uninstall then leaves nothing at all."""
    ns = f"lc-up-{sc.suffix}"
    for name in ("after-1", "after-2"):
        sc.delete_pod(ns, name, wait_s=90)
    templates = f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates"
    claims = f"{RESOURCE}/namespaces/{ns}/resourceclaims"
    assert request(sc.api, "GET", templates)["items"], "the shim made the guide pods' template"
    [kept] = sc.instances()
    sc.cp.helm("uninstall", sc.release, "-n", sc.namespace, "--wait", "--timeout", "2m")
    sc.installed = False
    wait_until(lambda: not sc.pods(sc.namespace), 60, "the chart's pods to go")
    gone: dict[str, list[str]] = {"slices": [], "classes": [], "webhooks": [], "chart pods": []}

    def released() -> bool:
        left = driver_objects(sc)
        # The instance and CDI spec the running pod uses stay.
        assert left.pop("instances") == [str(kept)] and len(left.pop("cdi specs")) == 1, left
        return left == gone

    # The kubelet deletes the slices of a driver that unregistered, after a grace period.
    wait_until(released, 90, f"the release's objects to go ({driver_objects(sc)})")
    wait_until(lambda: not request(sc.api, "GET", templates)["items"], 60, "the GC to delete the template")
    assert container_of(sc, ns, "before")[2] == 0
    # No webhook configuration fails pods closed: a plain pod runs, a GPU pod is admitted untouched.
    plain_ns = sc.test_namespace("lc-plain")
    sc.create(plain_ns, "pods", user_pod(sc, "plain"))
    sc.wait_running(plain_ns, "plain", timeout_s=60)
    gpu = request(
        sc.api, "POST", f"/api/v1/namespaces/{plain_ns}/pods", guide_pod(sc, "gpu", "mig"), query=DRY_RUN
    )
    assert "schedulingGates" not in gpu["spec"], gpu["spec"]

    # The pod that ran through the uninstall, deleted: nothing on the node can unprepare its claim.
    request(sc.api, "DELETE", pod_path(ns, "before"))
    time.sleep(10)
    assert request(sc.api, "GET", pod_path(ns, "before"))["metadata"]["deletionTimestamp"]
    [claim] = request(sc.api, "GET", claims)["items"]
    assert claim["metadata"]["finalizers"] == [FINALIZER], claim["metadata"]
    # Installing again finishes it: the plugin unprepares, the controller deallocates.
    sc.install()
    sc.wait_plugin()
    sc.wait_webhook(timeout_s=120)
    wait_until(lambda: not sc.pods(ns), 120, "the deleted GPU pod to go")
    wait_until(lambda: not request(sc.api, "GET", claims)["items"], 60, "its claim to go")
    assert sc.instances() == [] and not list(sc.cdi_dir.glob(f"{DRIVER_NAME}*.json"))

    sc.cp.helm("uninstall", sc.release, "-n", sc.namespace, "--wait", "--timeout", "2m")
    sc.installed = False
    wait_until(lambda: not sc.pods(sc.namespace), 60, "the chart's pods to go")
    empty: dict[str, list[str]] = {k: [] for k in driver_objects(sc)}
    wait_until(lambda: driver_objects(sc) == empty, 30, f"nothing of the driver left ({driver_objects(sc)})")
