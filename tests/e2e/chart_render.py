"""What the Helm chart e2e tests share: the chart, `helm` run without a cluster, the rendered
objects, `Raw` (which sends those objects, or any JSON request, to the API server through the
client's transport), and the waits and token clients the API server tests use. The tests are
`test_helm_chart.py` (no API server), `test_helm_chart_dryrun.py` and `test_helm_chart_install.py`
(the real API server).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .cluster import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "helm" / "flexmig"
KUBE_VERSION = "1.37.2"  # the version tests/e2e/k8sbuild builds; the chart requires >= 1.34
DRIVER = "gpu.flexmig.dev"

# A couple of overrides an operator would plausibly use together.
OVERRIDES: tuple[str, ...] = (
    "--set",
    "controller.replicas=2",
    "--set",
    "controller.leaderElection=false",  # must be forced back on by replicas > 1
    "--set",
    "controller.metrics.service.type=NodePort",
    "--set",
    "controller.metrics.service.nodePort=30993",
    "--set",
    "kubeletPlugin.metrics.service.type=NodePort",
    "--set",
    "kubeletPlugin.metrics.service.nodePort=30992",
    "--set",
    "nodeConfig.defaultOperatingMode=mig",
    "--set-json",
    'nodeConfig.nodeconfig=[{"name":"gpu-node-a","operatingmode":"mig",'
    '"filterdevices":{"uuid":["GPU-00000000-0000-0000-0000-000000000001"],"index":[3]}},'
    '{"name":"gpu-node-b","operatingmode":"hami-core"}]',
    "--set",
    "kubeletPlugin.nvml.runtimeClassName=nvidia",
    "--set",
    "kubeletPlugin.nvml.driverRoot=",
    "--set",
    "webhook.tls.secretName=flexmig-webhook-tls",
    "--set",
    "deviceClasses.hamiCore.enabled=true",
    "--set",
    "deviceClasses.mig.extendedResourceName=gpu.flexmig.dev/mig",
)


def run_helm(helm_bin: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-cluster.kubeconfig"),  # these commands must not need one
    }
    return subprocess.run(
        [str(helm_bin), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


# The webhook is on by default (the controller serves it); the tests say so explicitly, and
# `webhook=False` renders the chart with it turned off.
WEBHOOK_ON = ("--set", "webhook.enabled=true")
WEBHOOK_OFF = ("--set", "webhook.enabled=false")


def render(
    helm_bin: Path,
    home: Path,
    *extra: str,
    namespace: str = "flexmig-system",
    release: str = "flexmig",
    webhook: bool = True,
) -> list[dict[str, Any]]:
    proc = run_helm(
        helm_bin,
        home,
        "template",
        release,
        str(CHART),
        "-n",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *(WEBHOOK_ON if webhook else WEBHOOK_OFF),
        *extra,
    )
    assert proc.returncode == 0, f"helm template {shlex.join(extra)} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Sequence[Mapping[str, Any]], kind: str, name_suffix: str = "") -> Mapping[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {[d['metadata'] for d in found]}"
    return found[0]


class Raw:
    """JSON requests through the client's transport, with API discovery for kind -> resource."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        m, url, hdrs, payload, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=30)
        resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        data: dict[str, Any] = json.loads(resp.data) if resp.data else {}
        return data

    def collection(self, api_version: str, kind: str, namespace: str | None) -> str:
        key = (api_version, kind)
        if key not in self._resources:
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            for res in self.request("GET", base)["resources"]:
                if "/" not in res["name"]:
                    self._resources[(api_version, res["kind"])] = (res["name"], res["namespaced"])
        assert key in self._resources, f"the API server does not serve {kind} in {api_version}"
        resource, namespaced = self._resources[key]
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        if namespaced:
            assert namespace, f"{kind} is namespaced but the chart gave it no namespace"
            return f"{base}/namespaces/{namespace}/{resource}"
        return f"{base}/{resource}"

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool) -> dict[str, Any]:
        meta = obj["metadata"]
        path = f"{self.collection(obj['apiVersion'], obj['kind'], meta.get('namespace'))}/{meta['name']}"
        query = [("fieldManager", "flexmig-e2e"), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self.request("PATCH", path, obj, content_type="application/apply-patch+yaml", query=query)


def api_error(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)


def first_refusal(call: Any, timeout_s: float = 30.0) -> ApiException:
    """Retry `call` (a dry run) until the API server refuses it, and return that refusal.

    Admission policies and webhook configurations take effect a moment after they are created (the
    API server's admission plugins learn of them through informers), so a request made right after
    `helm install` may still pass. Dry runs leave nothing behind while waiting.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
        except ApiException as exc:
            return exc
        if time.monotonic() > deadline:
            raise AssertionError(f"still accepted after {timeout_s:.0f}s")
        time.sleep(0.5)


def token_client(control_plane: ControlPlane, token: str) -> Any:
    cfg = k8s.Configuration()
    cfg.host = control_plane.server
    cfg.ssl_ca_cert = str(control_plane.ca_file)
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return k8s.ApiClient(cfg)
