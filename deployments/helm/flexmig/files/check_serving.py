"""`helm test` for the flexmig chart: are the controller, its webhook and the node plugins serving?

Runs in the chart's test pod (templates/tests/test-serving.yaml) with the standard library only, so it
works with any Python 3.11 image. Settings come from the environment (the pod spec sets them):

  FLEXMIG_NAMESPACE        the release namespace
  FLEXMIG_CONTROLLER       Deployment name of the controller ("" when the chart installs none)
  FLEXMIG_CONTROLLER_PORT  the controller's metrics port
  FLEXMIG_WEBHOOK_CONFIG   MutatingWebhookConfiguration name ("" when the webhook is off)
  FLEXMIG_PLUGIN           DaemonSet name of the node plugin ("" when off)
  FLEXMIG_PLUGIN_PORT      the plugin's metrics/healthz port
  FLEXMIG_TIMEOUT_S        how long to wait for everything to be ready and answer

What "serving" means here, per component:
- controller: every pod of the Deployment is Ready and answers GET /metrics on its pod IP with
  flexmig_build_info (the controller's own metric, so not some other server on that port);
- webhook: GET /healthz over HTTPS at the address the API server calls (the configuration's service
  or url), with the certificate verified against the configuration's caBundle and host name, as the
  API server does;
- node plugins: the DaemonSet runs on at least one node, every pod is Ready and answers GET /healthz
  with 200 on its pod IP (the plugin answers 503 while a loop of it is dead or stuck).
Every problem is printed; the exit status is 1 if there is any.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Probe:
    """One HTTP(S) GET that must answer 200 (and contain `expect` in its body when given)."""

    what: str
    url: str
    expect: str = ""
    ca_pem: bytes = b""  # HTTPS: verify against this CA (and the URL's host name)


@dataclass
class Plan:
    probes: list[Probe] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # found before probing (not ready, ...)


class Api:
    """GETs against the API server with the pod's ServiceAccount token."""

    def __init__(self, base: str, token: str, ca_file: str) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file)

    @classmethod
    def in_cluster(cls) -> Api:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        host = f"[{host}]" if ":" in host else host
        with open(f"{SA_DIR}/token", encoding="utf-8") as f:
            token = f.read().strip()
        return cls(f"https://{host}:{port}", token, f"{SA_DIR}/ca.crt")

    def get(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=self.context) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data


def _selector(match_labels: Mapping[str, str]) -> str:
    return urllib.parse.quote(",".join(f"{k}={v}" for k, v in sorted(match_labels.items())))


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def pod_probes(
    kind: str, workload: Mapping[str, Any], pods: list[Mapping[str, Any]], port: int, path: str, expect: str
) -> Plan:
    """Probes of every pod of a Deployment or DaemonSet; problems for pods that are not Ready."""
    plan = Plan()
    name = workload["metadata"]["name"]
    status = workload.get("status") or {}
    wanted = (
        status.get("desiredNumberScheduled")
        if kind == "DaemonSet"
        else (workload.get("spec") or {}).get("replicas", 1)
    )
    if not wanted:
        why = " (no node matches the plugin's node affinity or nodeSelector)" if kind == "DaemonSet" else ""
        plan.problems.append(f"{kind} {name}: runs no pod{why}")
        return plan
    if len(pods) < wanted:
        plan.problems.append(f"{kind} {name}: {len(pods)} of {wanted} pods exist")
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        ip = (pod.get("status") or {}).get("podIP")
        if not _ready(pod) or not ip:
            node = (pod.get("spec") or {}).get("nodeName") or "no node"
            plan.problems.append(f"{kind} {name}: pod {pod_name} ({node}) is not Ready")
            continue
        plan.probes.append(
            Probe(f"{kind} {name}: pod {pod_name}", f"http://{_host(ip)}:{port}{path}", expect)
        )
    return plan


def webhook_probe(config: Mapping[str, Any]) -> Probe | str:
    """The webhook's /healthz at the address the API server calls, or a problem."""
    name = config["metadata"]["name"]
    hooks = config.get("webhooks") or []
    if not hooks:
        return f"MutatingWebhookConfiguration {name}: has no webhooks"
    client = hooks[0].get("clientConfig") or {}
    bundle = client.get("caBundle") or ""
    if not bundle:
        return f"MutatingWebhookConfiguration {name}: caBundle is empty (the controller has not patched it in yet)"
    if "service" in client:
        svc = client["service"]
        base = f"https://{svc['name']}.{svc['namespace']}.svc:{svc.get('port', 443)}"
    else:
        url = urllib.parse.urlsplit(client.get("url") or "")
        base = f"{url.scheme}://{url.netloc}"
    return Probe(f"webhook {name}", f"{base}/healthz", "ok", base64.b64decode(bundle))


def fetch(probe: Probe) -> str | None:
    """GET the probe's URL: None when it answered as expected, else what went wrong."""
    context = None
    if probe.ca_pem:
        context = ssl.create_default_context(cadata=probe.ca_pem.decode())
    try:
        with urllib.request.urlopen(probe.url, timeout=REQUEST_TIMEOUT_S, context=context) as resp:
            body = resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"{probe.what}: GET {probe.url} answered {exc.code}: {exc.read()[:200]!r}"
    except (OSError, ssl.SSLError) as exc:  # URLError, refused, TLS verification, timeout
        return f"{probe.what}: GET {probe.url} failed: {exc}"
    if probe.expect and probe.expect not in body:
        return f"{probe.what}: GET {probe.url} answered 200 without {probe.expect!r}"
    return None


def plan(api: Api, env: Mapping[str, str]) -> Plan:
    ns = env["FLEXMIG_NAMESPACE"]
    out = Plan()
    for kind, name, port, path, expect in (
        (
            "Deployment",
            env.get("FLEXMIG_CONTROLLER", ""),
            env.get("FLEXMIG_CONTROLLER_PORT", ""),
            "/metrics",
            "flexmig_build_info",
        ),
        ("DaemonSet", env.get("FLEXMIG_PLUGIN", ""), env.get("FLEXMIG_PLUGIN_PORT", ""), "/healthz", ""),
    ):
        if not name:
            continue
        plural = "deployments" if kind == "Deployment" else "daemonsets"
        workload = api.get(f"/apis/apps/v1/namespaces/{ns}/{plural}/{name}")
        selector = _selector(workload["spec"]["selector"]["matchLabels"])
        pods = api.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"]
        part = pod_probes(kind, workload, pods, int(port), path, expect)
        out.probes += part.probes
        out.problems += part.problems
    if config_name := env.get("FLEXMIG_WEBHOOK_CONFIG", ""):
        config = api.get(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config_name}")
        found = webhook_probe(config)
        if isinstance(found, Probe):
            out.probes.append(found)
        else:
            out.problems.append(found)
    return out


def check(
    make_plan: Callable[[], Plan], timeout_s: float, sleep: Callable[[float], None] = time.sleep
) -> list[str]:
    """Plan and probe until everything answers or `timeout_s` passes; the last round's problems."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            current = make_plan()
            problems = current.problems + [p for p in map(fetch, current.probes) if p]
            if not problems:
                for probe in current.probes:
                    print(f"ok: {probe.what}: {probe.url}")
                return []
        except (OSError, KeyError, ValueError) as exc:  # the API server itself, or an odd object
            problems = [f"reading the release's objects from the API server failed: {exc!r}"]
        if time.monotonic() >= deadline:
            return problems
        sleep(2.0)


def main() -> int:
    env = os.environ
    api = Api.in_cluster()
    problems = check(lambda: plan(api, env), float(env.get("FLEXMIG_TIMEOUT_S", "120")))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
