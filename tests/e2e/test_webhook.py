"""The pod webhook against the real API server: the chart installed with `webhook.url` pointing at a
local `python -m flexmig controller` that runs with the Deployment's own arguments and a token of the
chart's controller ServiceAccount (so the chart's RBAC is what it gets), then:

- the controller creates its certificate Secret and patches the CA into the chart's
  MutatingWebhookConfiguration, and serves a certificate that CA verifies;
- a HAMi pod (`nvidia.com/gpu: 2`, `nvidia.com/gpumem: 8000`) is admitted gated, without its
  nvidia.com resources, its claim made from a shim ResourceClaimTemplate the controller creates once
  the pod exists;
- a dry run is translated the same way but creates no template (a review writes nothing);
- a bad pod (`gpumem-percentage: 150`) is denied with a message naming the container and resource;
- a pod without GPU resources, and one whose own claim uses another driver's class, are untouched;
  one whose own claim uses a flexmig class is gated.

No pod runs: there is no kubelet here (the scenario tests bring a stand-in).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.kube.rest import request as rest

from .chart_workloads import ControllerProcess, token_kubeconfig, workload
from .cluster import ControlPlane, free_port
from .k8sobjects import create_namespace, delete_namespace

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "helm" / "flexmig"
RELEASE = "flexmig-wh"  # contains the chart name, so object names are "flexmig-wh-..."
DRIVER = "gpu.flexmig.dev"
SHIM_LABEL = f"{DRIVER}/shim-template"
T = TypeVar("T")

pytestmark = pytest.mark.e2e


def eventually(fn: Callable[[], T | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except (ApiException, OSError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last})")


def api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


@dataclass
class Installed:
    cp: ControlPlane
    api: Any
    namespace: str
    port: int
    controller: ControllerProcess

    def log_text(self) -> str:
        return self.controller.log_text()

    def alive(self) -> None:
        proc = self.controller.proc
        if proc.poll() is not None:
            raise AssertionError(f"the controller exited ({proc.returncode}):\n{self.log_text()[-4000:]}")


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Installed]:
    failed_before = request.session.testsfailed
    suffix = uuid.uuid4().hex[:6]
    namespace = f"flexmig-wh-{suffix}"
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="flexmig-wh-"))
    with control_plane.api_client() as api:
        control_plane.helm(
            "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace", "--timeout", "2m",
            "--set", f"webhook.url=https://127.0.0.1:{port}/mutate-pods",
            "--set", "deviceConfig.defaultCores=10",
            # Only what this test needs, so that nothing cluster-wide collides with other modules.
            "--set", "kubeletPlugin.enabled=false",
            "--set", "nodeScopePolicy.enabled=false",
            "--set", "controller.metrics.service.enabled=false",
            "--set", "deviceClasses.mig.enabled=false",
            "--set", "deviceClasses.gpu.enabled=false",
        )  # fmt: skip
        controller: ControllerProcess | None = None
        try:
            ctr = workload(api, namespace, "deployments", f"{RELEASE}-controller", "controller")
            # The device-config ConfigMap copied under workdir, --device-config pointing at the copy.
            ctr = ctr.localize(api, namespace, workdir / "config")
            kubeconfig = token_kubeconfig(
                control_plane, api, namespace, f"{RELEASE}-controller", workdir / "kubeconfig"
            )
            # The Deployment's arguments; what only makes sense inside the pod is overridden after
            # them (argparse keeps the last value).
            argv = [
                sys.executable, "-m", "flexmig", *ctr.args,
                f"--kubeconfig={kubeconfig}",
                "--identity=e2e-webhook",
                "--metrics-port=0",
                "--webhook-address=127.0.0.1",
            ]  # fmt: skip
            assert f"--webhook-port={port}" not in argv and "--webhook-port=9443" in argv
            argv.append(f"--webhook-port={port}")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "FLEXMIG_"))}
            env["POD_NAMESPACE"] = namespace
            # Port 0: the metrics are not scraped here.
            controller = ControllerProcess(argv, env, workdir / "controller.log", metrics_port=0)
            yield Installed(control_plane, api, namespace, port, controller)
        finally:
            if controller is not None:
                controller.stop()
            control_plane.helm("uninstall", RELEASE, "-n", namespace, "--timeout", "2m", check=False)
            with contextlib.suppress(ApiException):
                rest(api, "DELETE", f"/api/v1/namespaces/{namespace}")
            if request.session.testsfailed == failed_before and not os.environ.get("FLEXMIG_E2E_KEEP"):
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                print(f"\n[e2e] webhook controller log kept in {workdir}")


@pytest.fixture(scope="module")
def ca_pem(installed: Installed) -> bytes:
    """The self-generated CA, once it is in the webhook configuration."""
    api, ns = installed.api, installed.namespace
    secret_path = f"/api/v1/namespaces/{ns}/secrets/{RELEASE}-webhook-cert"

    def ready() -> bytes | None:
        installed.alive()
        secret = rest(api, "GET", secret_path)
        config = rest(
            api,
            "GET",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}.{DRIVER}",
        )
        hook = config["webhooks"][0]["clientConfig"]
        # Helm creates the Secret empty; the controller fills it.
        ca = (secret.get("data") or {}).get("ca.crt")
        if not ca or hook.get("caBundle") != ca:
            return None
        assert hook["url"] == f"https://127.0.0.1:{installed.port}/mutate-pods"
        return base64.b64decode(secret["data"]["ca.crt"])

    return eventually(ready, 60, "the controller's CA in the webhook configuration")


@pytest.fixture(scope="module")
def pods_ns(installed: Installed, ca_pem: bytes) -> Iterator[str]:
    namespace = f"wh-pods-{uuid.uuid4().hex[:6]}"
    create_namespace(installed.api, namespace)
    yield namespace
    # Its pods stay gated (no node here ever places them). Left behind, the next controller that sees
    # free capacity (a later scenario's, on the same control plane) would place them on its own nodes,
    # and their GPU instances would appear in a test that never asked for them.
    delete_namespace(installed.api, namespace)


def gpu_pod(name: str, limits: dict[str, str], **extra_spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/none:1"}
    if limits:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "automountServiceAccountToken": False, **extra_spec},
    }


def create_pod(
    installed: Installed, namespace: str, body: dict[str, Any], *, dry_run: bool = False
) -> dict[str, Any]:
    """Create a pod; retried while the API server has not yet seen the patched caBundle."""
    query = [("dryRun", "All")] if dry_run else []
    deadline = time.monotonic() + 30
    while True:
        try:
            return rest(installed.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body, query=query)
        except ApiException as exc:
            if "failed calling webhook" not in api_message(exc) or time.monotonic() > deadline:
                raise
        installed.alive()
        time.sleep(0.3)


def test_the_served_certificate_is_verified_by_the_ca_in_the_configuration(
    installed: Installed, ca_pem: bytes
) -> None:
    with tempfile.NamedTemporaryFile(suffix=".crt") as f:
        f.write(ca_pem)
        f.flush()
        ctx = ssl.create_default_context(cafile=f.name)
    with (
        socket.create_connection(("127.0.0.1", installed.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_hami_pod_is_translated_gated_and_its_template_exists(installed: Installed, pods_ns: str) -> None:
    pod = create_pod(
        installed, pods_ns, gpu_pod("hami", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000", "cpu": "1"})
    )
    spec = pod["spec"]
    assert {"name": ALLOCATION_GATE} in spec["schedulingGates"]
    resources = spec["containers"][0]["resources"]
    assert not [
        k for part in ("limits", "requests") for k in resources.get(part, {}) if k.startswith("nvidia.com/")
    ]
    assert resources["limits"] == {"cpu": "1"}
    (claim,) = spec["resourceClaims"]
    assert resources["claims"] == [{"name": claim["name"]}]
    template = eventually(
        lambda: template_of(installed, pods_ns, claim["resourceClaimTemplateName"]),
        30,
        "the controller to create the shim template the stored pod names",
    )
    assert template["metadata"]["labels"][SHIM_LABEL] == "v1"
    assert f"{DRIVER}/last-used" in template["metadata"]["annotations"]  # what the collector reads
    (req,) = template["spec"]["spec"]["devices"]["requests"]
    mig = next(alt for alt in req["firstAvailable"] if alt["deviceClassName"] == f"mig.{DRIVER}")
    assert mig["count"] == 2 and 'quantity("8000Mi")' in mig["selectors"][0]["cel"]["expression"]
    # deviceConfig.defaultCores=10 from the chart's ConfigMap reached the shim.
    assert "computeSlices * 100 >= 10 *" in mig["selectors"][0]["cel"]["expression"]


def template_of(installed: Installed, namespace: str, name: str) -> dict[str, Any] | None:
    """The template, or None while it does not exist."""
    try:
        return rest(
            installed.api,
            "GET",
            f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{name}",
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_dry_run_is_translated_but_creates_no_template(installed: Installed, pods_ns: str) -> None:
    pod = create_pod(
        installed, pods_ns, gpu_pod("dry", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1234"}), dry_run=True
    )
    name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(ApiException) as missing:
        rest(
            installed.api,
            "GET",
            f"/apis/resource.k8s.io/v1/namespaces/{pods_ns}/resourceclaimtemplates/{name}",
        )
    assert missing.value.status == 404


def test_a_bad_pod_is_denied_naming_container_and_resource(installed: Installed, pods_ns: str) -> None:
    body = gpu_pod("bad", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})
    with pytest.raises(ApiException) as denied:
        create_pod(installed, pods_ns, body)
    message = api_message(denied.value)
    assert denied.value.status == 400, message
    assert f'admission webhook "pods.{DRIVER}" denied the request' in message
    assert 'container "main"' in message and "nvidia.com/gpumem-percentage" in message and "1..100" in message


def claim(name: str, device_class: str) -> dict[str, Any]:
    request_ = {"name": "r", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request_]}},
    }


def test_pods_without_gpu_resources_are_untouched_and_flexmig_claims_gated(
    installed: Installed, pods_ns: str
) -> None:
    plain = create_pod(installed, pods_ns, gpu_pod("plain", {"cpu": "1"}))
    assert "schedulingGates" not in plain["spec"] and "resourceClaims" not in plain["spec"]
    claims = f"/apis/resource.k8s.io/v1/namespaces/{pods_ns}/resourceclaims"
    rest(installed.api, "POST", claims, claim("other-driver", "gpu.example.com"))
    rest(installed.api, "POST", claims, claim("flexmig-class", f"e2e-{uuid.uuid4().hex[:4]}.{DRIVER}"))

    def with_claim(name: str, claim_name: str) -> dict[str, Any]:
        body = gpu_pod(name, {}, resourceClaims=[{"name": "dev", "resourceClaimName": claim_name}])
        body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
        return body

    other = create_pod(installed, pods_ns, with_claim("other", "other-driver"))
    assert "schedulingGates" not in other["spec"]  # sent to the webhook (it has a claim), left alone
    ours = create_pod(installed, pods_ns, with_claim("ours", "flexmig-class"))
    assert ours["spec"]["schedulingGates"] == [{"name": ALLOCATION_GATE}]
    assert ours["spec"]["containers"][0]["resources"] == {"claims": [{"name": "dev"}]}
    # A claim that does not exist yet: whose devices it asks for is unknown, so the pod is refused
    # (a controller creating it retries) rather than admitted ungated.
    with pytest.raises(ApiException) as denied:
        create_pod(installed, pods_ns, with_claim("early", "not-yet"))
    message = api_message(denied.value)
    assert denied.value.status == 400, message
    assert "spec.resourceClaims[0].resourceClaimName: ResourceClaim 'not-yet' does not exist" in message
    assert "create it before the pod" in message


def test_no_permission_error_in_what_the_tests_above_exercised(installed: Installed, pods_ns: str) -> None:
    """The Secret create, caBundle patch, template create (by the template sync, watching pods) and
    claim/class reads the tests above drove ran without a refusal. Template deletion and Secret renewal are not exercised here (the
    grace and the certificate lifetime are far longer than this module), so their RBAC is not shown."""
    installed.alive()
    log = installed.log_text()
    assert "webhook maintenance step failed" not in log, log[-4000:]
    assert "forbidden" not in log.lower(), log[-4000:]
