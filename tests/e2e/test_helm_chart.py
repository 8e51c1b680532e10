"""The Helm chart `deployments/helm/flexmig`, checked with the real `helm` and the real API server.

- `helm lint --strict` is clean, with the defaults and with overrides;
- `helm template` renders, and what it renders says what the components need: the plugin's and the
  controller's arguments are parsed by the real `flexmig` argument parser (so a flag the chart passes
  but the command does not know fails here, not in a crash-looping pod), the device ConfigMap holds
  the driver's default allowlist, the node ConfigMap loads with the plugin's own parser;
- the values schema rejects bad values with a message naming the field;
- every rendered object passes the API server's validation (server-side apply, dryRun=All): CEL in
  DeviceClasses, webhook matchConditions and ValidatingAdmissionPolicies is compiled there;
- one real `helm install`: the objects exist, the policies type-check, RBAC grants what the
  components need and no more (SubjectAccessReviews), the node-scope policy lets a plugin token
  write only its own node's ResourceSlices and pods, the webhook fails closed for GPU pods only;
  then `helm uninstall` removes the cluster-scoped objects. Workloads never run (no kubelet).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from driver.catalog.allowlist import default_allowlist_data, parse_allowlist
from flexmig.cli import build_parser
from kubeletplugin.nodeconfig import OperatingMode, node_config_for

from .cluster import ControlPlane, create_namespace, model

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "helm" / "flexmig"
KUBE_VERSION = "1.37.2"  # the version tests/e2e/k8sbuild builds; the chart requires >= 1.34
DRIVER = "gpu.flexmig.dev"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

# A couple of overrides an operator would plausibly use together.
OVERRIDES: tuple[str, ...] = (
    "--set",
    "controller.replicas=2",
    "--set",
    "controller.leaderElection=false",  # must be forced back on by replicas > 1
    "--set",
    "controller.metrics.service.nodePort=30993",
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


# --------------------------------------------------------------------------------------------------
# helm without a cluster


@pytest.fixture(scope="module")
def helm_bin(k8s_bin_dir: Path) -> Path:
    return k8s_bin_dir / "helm"


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


def container(workload: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    spec = workload["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def parse_cli(args: Sequence[str], env: Mapping[str, str]) -> Any:
    """Parse a container's args with the real `flexmig` parser, $(VAR) expanded like kubelet does."""
    expanded = [a.replace("$(NODE_NAME)", env.get("NODE_NAME", "")).replace("$(POD_NAME)", "p") for a in args]
    try:
        return build_parser().parse_args(expanded)
    except SystemExit as exc:  # argparse exits on an unknown flag or a bad value
        raise AssertionError(f"`flexmig {shlex.join(expanded)}` is rejected by the CLI parser") from exc


def test_lint_strict(helm_bin: Path, tmp_path: Path) -> None:
    for extra in ((), OVERRIDES, ("--set", "allocationMode=scheduler")):
        proc = run_helm(
            helm_bin, tmp_path, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *extra
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "0 chart(s) failed" in out, out
        assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_webhook_is_on_by_default_and_can_be_turned_off(helm_bin: Path, tmp_path: Path) -> None:
    proc = run_helm(helm_bin, tmp_path, "template", "flexmig", str(CHART), "--kube-version", KUBE_VERSION)
    assert proc.returncode == 0, proc.stderr
    assert "kind: MutatingWebhookConfiguration" in proc.stdout
    docs = render(helm_bin, tmp_path, webhook=False)
    assert not by_kind(docs, "MutatingWebhookConfiguration")
    deploy = one(docs, "Deployment")  # the controller still runs and allocates gated pods
    assert parse_cli(container(deploy, "controller")["args"], {}).webhook_port == 0


def test_template_defaults(helm_bin: Path, tmp_path: Path) -> None:
    docs = render(helm_bin, tmp_path)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount"] * 2
        + ["ClusterRole", "ClusterRoleBinding"] * 2
        + ["Role", "RoleBinding", "Deployment", "DaemonSet", "MutatingWebhookConfiguration"]
        + ["ConfigMap"] * 2
        + ["Service"] * 3
        + ["DeviceClass"] * 3
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
    )

    # DeviceClasses select on the attribute the plugin publishes (kubeletplugin/slices.py: type). The
    # hami-core class is on by default: the shim's templates for pods without vgpu-mode reference it.
    classes = {d["metadata"]["name"]: d for d in by_kind(docs, "DeviceClass")}
    assert set(classes) == {f"mig.{DRIVER}", DRIVER, f"hami-core.{DRIVER}"}
    for name, wanted in ((f"mig.{DRIVER}", "mig"), (DRIVER, "gpu"), (f"hami-core.{DRIVER}", "hami-core")):
        expr = " ".join(classes[name]["spec"]["selectors"][0]["cel"]["expression"].split())
        assert expr == f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{wanted}"'

    # The plugin: every argument is one `flexmig kubeletplugin` knows; host paths as kubelet expects.
    ds = one(docs, "DaemonSet")
    plugin = container(ds, "plugin")
    args = parse_cli(plugin["args"], {"NODE_NAME": "gpu-node-a"})
    assert args.command == "kubeletplugin"
    assert args.node_name == "gpu-node-a"
    assert args.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert args.plugins_dir == "/var/lib/kubelet/plugins"
    assert args.cdi_dir == "/var/run/cdi"
    assert args.checkpoint_path == f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"
    assert args.metrics_port == "31992"
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["securityContext"]["privileged"] is True
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {"name": "metrics", "containerPort": 31992, "protocol": "TCP"} in plugin["ports"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/plugins_registry",
        f"/var/lib/kubelet/plugins/{DRIVER}",
        "/var/run/cdi",
        "/dev",
        "/",  # the driver root, read-only, only for locating libnvidia-ml.so.1
        "/usr/local/vgpu",  # HAMi-core's library; CDI specs of shared GPUs mount it from the host
    }
    assert (args.hami_core_dir, args.hami_core_library) == ("/usr/local/vgpu", "/usr/local/vgpu/libvgpu.so")
    assert args.device_split_count == "10"
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    for name in ("plugins-registry", "plugin-data", "cdi", "hami-core"):  # same path inside as on the host
        assert mounts[name]["mountPath"] == volumes[name]["hostPath"]["path"]
    assert mounts["driver-root"]["readOnly"] is True
    # Only the plugin is privileged; the controller runs as non-root with nothing extra.
    deploy = one(docs, "Deployment")
    ctrl = container(deploy, "controller")
    assert deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert ctrl["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in ctrl["securityContext"]
    cargs = parse_cli(ctrl["args"], {})
    assert (cargs.command, cargs.mode, cargs.metrics_port, cargs.leader_elect) == (
        "controller",
        "controller",
        31993,
        "true",
    )
    assert cargs.lease_namespace == "flexmig-system"

    # The device ConfigMap carries the driver's default allowlist (the user guide's, corrected).
    device_cm = one(docs, "ConfigMap", "-device-config")
    doc = yaml.safe_load(device_cm["data"]["device-config.yaml"])
    assert doc["nvidia"]["migProfileAllowlist"] == default_allowlist_data()
    parse_allowlist(doc["nvidia"]["migProfileAllowlist"])
    node_cm = one(docs, "ConfigMap", "-node-config")
    assert json.loads(node_cm["data"]["config.json"]) == {"nodeconfig": []}

    # Metrics Services on HAMi's NodePorts; the node one stays on the node it is called on.
    ctrl_svc = one(docs, "Service", "-controller-metrics")
    assert ctrl_svc["spec"]["ports"][0]["nodePort"] == 31993
    node_svc = one(docs, "Service", "-kubelet-plugin-metrics")
    assert node_svc["spec"]["ports"][0]["nodePort"] == 31992
    assert node_svc["spec"]["externalTrafficPolicy"] == "Local"

    # The webhook: fails closed, never for the release namespace or kube-system.
    hook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    # NoneOnDryRun: the webhook creates the shim's ResourceClaimTemplates, except in dry runs.
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == (
        "Fail",
        "NoneOnDryRun",
        ["v1"],
    )
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and {"flexmig-system", "kube-system"} <= set(excluded["values"])
    assert hook["clientConfig"]["service"]["path"] == "/mutate-pods"


def test_template_overrides(helm_bin: Path, tmp_path: Path) -> None:
    docs = render(helm_bin, tmp_path, *OVERRIDES)
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    ctrl_args = parse_cli(container(deploy, "controller")["args"], {})
    assert ctrl_args.leader_elect == "true"  # two replicas never run without leader election
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert one(docs, "Service", "-controller-metrics")["spec"]["ports"][0]["nodePort"] == 30993
    assert one(docs, "Service", "-kubelet-plugin-metrics")["spec"]["ports"][0]["nodePort"] == 30992

    # nodeconfig reaches the plugin in HAMi's JSON shape and loads with the plugin's own parser.
    raw = one(docs, "ConfigMap", "-node-config")["data"]["config.json"]
    node_a = node_config_for(json.loads(raw), "gpu-node-a")
    assert node_a.operating_mode is OperatingMode.MIG
    assert node_a.filter_indexes == frozenset({3})
    assert node_a.filter_uuids == frozenset({"GPU-00000000-0000-0000-0000-000000000001"})
    assert node_config_for(json.loads(raw), "gpu-node-b").operating_mode is OperatingMode.HAMI_CORE
    ds = one(docs, "DaemonSet")
    plugin = container(ds, "plugin")
    assert parse_cli(plugin["args"], {"NODE_NAME": "n"}).operating_mode == "mig"

    # The toolkit runtime instead of a driver-root mount.
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert "initContainers" not in pod
    assert "driver-root" not in {v["name"] for v in pod["volumes"]}
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    assert env["NVIDIA_MIG_CONFIG_DEVICES"] == "all" and "LD_LIBRARY_PATH" not in env

    # A provided certificate: mounted by the kubelet, so the controller may read no Secret and
    # patch no webhook configuration.
    role = one(docs, "Role")
    assert not [r for r in role["rules"] if "secrets" in r["resources"]]
    cluster_role = one(docs, "ClusterRole", "-controller")
    assert not [r for r in cluster_role["rules"] if "mutatingwebhookconfigurations" in r["resources"]]
    assert {d["metadata"]["name"] for d in by_kind(docs, "DeviceClass")} == {
        f"mig.{DRIVER}",
        DRIVER,
        f"hami-core.{DRIVER}",
    }

    # A KEP-5004 name on a class: set on the class, and such pods are sent to the webhook.
    mig_class = next(d for d in by_kind(docs, "DeviceClass") if d["metadata"]["name"] == f"mig.{DRIVER}")
    assert mig_class["spec"]["extendedResourceName"] == "gpu.flexmig.dev/mig"
    condition = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"][0]
    assert '["nvidia.com/","gpu.flexmig.dev/mig"]' in condition["expression"]

    # Scheduler mode: kube-scheduler allocates, so no controller and no webhook are installed.
    sched = render(helm_bin, tmp_path, "--set", "allocationMode=scheduler")
    kinds = {d["kind"] for d in sched}
    assert "Deployment" not in kinds and "MutatingWebhookConfiguration" not in kinds
    assert "DaemonSet" in kinds and "DeviceClass" in kinds


@pytest.mark.parametrize(
    ("override", "field", "why"),
    [
        (
            ("--set", "controller.metrics.service.nodePort=abc"),
            "/controller/metrics/service/nodePort",
            "integer",
        ),
        (
            ("--set", "kubeletPlugin.metrics.service.nodePort=70000"),
            "/kubeletPlugin/metrics/service/nodePort",
            "",
        ),
        (
            ("--set-json", 'nodeConfig.nodeconfig=[{"name":"n1","operatingmode":"gpu"}]'),
            "/nodeConfig/nodeconfig/0/operatingmode",
            "mig",
        ),
        (
            ("--set-json", 'nodeConfig.nodeconfig=[{"name":"n1","filterdevices":{"index":["x"]}}]'),
            "/nodeConfig/nodeconfig/0/filterdevices/index/0",
            "integer",
        ),
        (("--set", "nodeConfig.defaultOperatingMode=exclusive"), "/nodeConfig/defaultOperatingMode", "mig"),
        (("--set", "controller.replica=2"), "replica", "additional"),
        (("--set", "allocationMode=kube"), "/allocationMode", "controller"),
        (("--set", "kubeletPlugin.nvmlBackend=fake"), "/kubeletPlugin/nvmlBackend", "pattern"),
        (
            (
                "--set",
                "deviceConfig.migProfileAllowlist[0].models[0]=A30",
                "--set",
                "deviceConfig.migProfileAllowlist[0].profiles[0]=1g.6GB",
            ),
            "/deviceConfig/migProfileAllowlist/0/profiles/0",
            "pattern",
        ),
    ],
)
def test_schema_rejects_bad_values(
    helm_bin: Path, tmp_path: Path, override: tuple[str, ...], field: str, why: str
) -> None:
    proc = run_helm(
        helm_bin, tmp_path, "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *override
    )
    assert proc.returncode != 0, f"{override} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert field in proc.stderr and why in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------------
# the API server


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


def _api_error(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


@pytest.mark.parametrize("variant", ["defaults", "overrides"])
def test_rendered_objects_pass_server_side_validation(
    control_plane: ControlPlane, helm_bin: Path, tmp_path: Path, variant: str
) -> None:
    namespace = f"flexmig-dryrun-{variant}"
    extra = OVERRIDES if variant == "overrides" else ()
    docs = render(helm_bin, tmp_path, *extra, namespace=namespace, release=f"dry-{variant}")
    with control_plane.api_client() as api:
        with contextlib.suppress(ApiException):  # a rerun in the same session finds it
            create_namespace(api, namespace)
        raw = Raw(api)
        failures = []
        for obj in docs:
            try:
                raw.apply(obj, dry_run=True)
            except ApiException as exc:
                failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.status} {_api_error(exc)}")
        assert not failures, "the API server rejected rendered objects:\n" + "\n".join(failures)


# --------------------------------------------------------------------------------------------------
# a real install


RELEASE = "flexmig"
NAMESPACE = "flexmig-helm-e2e"
PLUGIN_SA = f"{RELEASE}-kubelet-plugin"
CONTROLLER_SA = f"{RELEASE}-controller"
CHART_DEVICE_CLASSES = (f"mig.{DRIVER}", DRIVER)


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


def slice_body(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def pod_body(name: str, node: str | None = None, gpu: bool = False, sa: str | None = None) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": "c", "image": "registry.invalid/none:1"}
    if gpu:
        ctr["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}}
    spec: dict[str, Any] = {"containers": [ctr]}
    if node:
        spec["nodeName"] = node
    if sa:
        spec["serviceAccountName"] = sa
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def can(
    api: Any, user: str, *, verb: str, resource: str, group: str = "", name: str = "", ns: str = ""
) -> bool:
    sub, _, subresource = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": group,
                "resource": sub,
                "subresource": subresource,
                "verb": verb,
                "name": name,
                "namespace": ns,
            },
        },
    }
    out = Raw(api).request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(out["status"].get("allowed"))


@contextlib.contextmanager
def device_classes_restored(raw: Raw) -> Iterator[None]:
    """Other e2e modules create `mig.gpu.flexmig.dev` for their own use; put back what was there."""
    before: dict[str, dict[str, Any]] = {}
    for name in CHART_DEVICE_CLASSES:
        with contextlib.suppress(ApiException):
            before[name] = raw.request("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
    try:
        yield
    finally:
        for name, obj in before.items():
            body = {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {"name": name},
                "spec": obj["spec"],
            }
            with contextlib.suppress(ApiException):
                raw.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body)


def test_install_and_uninstall(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"helm-e2e-a-{suffix}", f"helm-e2e-b-{suffix}"
    gpu_ns = f"helm-e2e-gpu-{suffix}"
    with control_plane.api_client() as api, device_classes_restored(Raw(api)):
        raw = Raw(api)
        core = k8s.CoreV1Api(api)
        installed = False
        try:
            control_plane.helm(
                "install",
                RELEASE,
                str(CHART),
                "-n",
                NAMESPACE,
                "--create-namespace",
                "--take-ownership",
                "--timeout",
                "2m",
                *WEBHOOK_ON,
            )
            installed = True
            _check_objects(raw, core)
            _check_rbac(api)
            for node in (node_a, node_b):
                core.create_node(
                    model(k8s.V1Node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
                )
            _check_node_scope_policy(control_plane, api, raw, core, node_a, node_b)
            _check_webhook_scope(api, raw, core, gpu_ns)
        finally:
            if installed:
                control_plane.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "2m")
            for node in (node_a, node_b):
                with contextlib.suppress(ApiException):
                    core.delete_node(node)
            for ns in (gpu_ns, NAMESPACE):
                with contextlib.suppress(ApiException):
                    core.delete_namespace(ns)
            for name in (f"{node_a}-own", f"{node_b}-foreign"):
                with contextlib.suppress(ApiException):
                    raw.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{name}")
        # Cluster-scoped objects go with the release.
        for path in (
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}.{DRIVER}",
            f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{RELEASE}-slices-node-scope.{DRIVER}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{PLUGIN_SA}",
            f"/apis/resource.k8s.io/v1/deviceclasses/{DRIVER}",
        ):
            with pytest.raises(ApiException) as gone:
                raw.request("GET", path)
            assert gone.value.status == 404, path


def _check_objects(raw: Raw, core: Any) -> None:
    for name in CHART_DEVICE_CLASSES:
        dc = raw.request("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        assert dc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for cm in ("device-config", "node-config"):
        core.read_namespaced_config_map(f"{RELEASE}-{cm}", NAMESPACE)
    for sa in (PLUGIN_SA, CONTROLLER_SA):
        core.read_namespaced_service_account(sa, NAMESPACE)
        raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{sa}")
        raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{sa}")
    raw.request("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/roles/{CONTROLLER_SA}")
    raw.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER_SA}")
    raw.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{PLUGIN_SA}")
    ports = {
        svc: core.read_namespaced_service(svc, NAMESPACE).spec.ports[0].node_port
        for svc in (f"{CONTROLLER_SA}-metrics", f"{PLUGIN_SA}-metrics")
    }
    assert ports == {f"{CONTROLLER_SA}-metrics": 31993, f"{PLUGIN_SA}-metrics": 31992}
    hook = raw.request(
        "GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}.{DRIVER}"
    )
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == f"{RELEASE}-webhook"
    for kind in ("slices", "pods"):
        name = f"{RELEASE}-{kind}-node-scope.{DRIVER}"
        base = "/apis/admissionregistration.k8s.io/v1"
        raw.request("GET", f"{base}/validatingadmissionpolicybindings/{name}")

        def type_checked(name: str = name, base: str = base) -> dict[str, Any] | None:
            policy = raw.request("GET", f"{base}/validatingadmissionpolicies/{name}")
            status: dict[str, Any] = policy.get("status") or {}
            done = status.get("observedGeneration") == policy["metadata"]["generation"]
            return status if done else None

        # kube-controller-manager type-checks every expression against the matched types' schemas
        # and records the result (observedGeneration, typeChecking.expressionWarnings).
        status = wait_for(type_checked, 60, f"type checking of {name}")
        assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


def _check_rbac(api: Any) -> None:
    ctrl = f"system:serviceaccount:{NAMESPACE}:{CONTROLLER_SA}"
    plugin = f"system:serviceaccount:{NAMESPACE}:{PLUGIN_SA}"
    res = "resource.k8s.io"
    # What the controller needs, including the 1.36+ synthetic subresources ...
    assert can(api, ctrl, verb="update", resource="resourceclaims/binding", group=res)
    assert can(api, ctrl, verb="update", resource="resourceclaims/status", group=res, ns="ns1", name="c")
    assert can(
        api,
        ctrl,
        verb="arbitrary-node:update",
        resource="resourceclaims/driver",
        group=res,
        ns="ns1",
        name=DRIVER,
    )
    assert can(api, ctrl, verb="create", resource="resourceclaimtemplates", group=res, ns="ns1")
    # The webhook stamps a template's last use; the leader deletes unused ones.
    for verb in ("patch", "delete"):
        assert can(api, ctrl, verb=verb, resource="resourceclaimtemplates", group=res, ns="ns1", name="t")
    assert can(api, ctrl, verb="patch", resource="pods", ns="ns1", name="p")
    assert can(
        api,
        ctrl,
        verb="update",
        resource="leases",
        group="coordination.k8s.io",
        ns=NAMESPACE,
        name="flexmig-controller",
    )
    hooks = "admissionregistration.k8s.io"
    assert can(
        api,
        ctrl,
        verb="patch",
        resource="mutatingwebhookconfigurations",
        group=hooks,
        name=f"{RELEASE}.{DRIVER}",
    )
    # The self-generated webhook certificate: its own Secret only.
    cert = f"{RELEASE}-webhook-cert"
    for verb in ("get", "update"):
        assert can(api, ctrl, verb=verb, resource="secrets", ns=NAMESPACE, name=cert)
    assert can(api, ctrl, verb="create", resource="secrets", ns=NAMESPACE)
    assert not can(api, ctrl, verb="get", resource="secrets", ns=NAMESPACE, name="other")
    assert not can(api, ctrl, verb="create", resource="secrets", ns="ns1")
    # ... and not more.
    assert not can(
        api, ctrl, verb="patch", resource="mutatingwebhookconfigurations", group=hooks, name="other"
    )
    assert not can(api, ctrl, verb="create", resource="pods", ns="ns1")
    assert not can(api, ctrl, verb="list", resource="secrets", ns=NAMESPACE)
    assert not can(api, ctrl, verb="create", resource="resourceslices", group=res)
    assert not can(
        api, ctrl, verb="update", resource="leases", group="coordination.k8s.io", ns=NAMESPACE, name="other"
    )
    assert not can(
        api,
        ctrl,
        verb="arbitrary-node:update",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name="x.io",
    )
    # The plugin: its node's slices and claims' device status, never allocations or another driver.
    assert can(api, plugin, verb="create", resource="resourceslices", group=res)
    assert can(
        api,
        plugin,
        verb="associated-node:patch",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name=DRIVER,
    )
    assert not can(
        api,
        plugin,
        verb="arbitrary-node:patch",
        resource="resourceclaims/driver",
        group=res,
        ns="n",
        name=DRIVER,
    )
    assert not can(api, plugin, verb="update", resource="resourceclaims/binding", group=res)
    assert not can(api, plugin, verb="delete", resource="pods", ns="ns1", name="p")
    assert not can(api, plugin, verb="get", resource="secrets", ns=NAMESPACE, name="x")
    assert not can(api, plugin, verb="create", resource="deviceclasses", group=res)


def _check_node_scope_policy(
    control_plane: ControlPlane, api: Any, raw: Raw, core: Any, node_a: str, node_b: str
) -> None:
    """A token bound to a plugin pod on node A: A's slices and pods yes, B's no."""
    plugin_pod = core.create_namespaced_pod(
        NAMESPACE, model(k8s.V1Pod, pod_body(f"plugin-{node_a}", node=node_a, sa=PLUGIN_SA))
    )
    core.create_namespaced_pod(
        NAMESPACE, model(k8s.V1Pod, pod_body(f"other-{node_b}", node=node_b, sa=PLUGIN_SA))
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": plugin_pod.metadata.name,
                "uid": plugin_pod.metadata.uid,
            },
        },
    }
    token = raw.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{PLUGIN_SA}/token", request)[
        "status"
    ]["token"]
    # The claim the policy relies on is really in the token (ServiceAccountTokenPodNodeInfo).
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["kubernetes.io"]["node"]["name"] == node_a

    with token_client(control_plane, token) as plugin_api:
        as_plugin = Raw(plugin_api)
        slices = "/apis/resource.k8s.io/v1/resourceslices"
        own = as_plugin.request("POST", slices, slice_body(f"{node_a}-own", node_a))
        own["spec"]["devices"][0]["attributes"]["type"] = {"string": "mig"}
        as_plugin.request("PUT", f"{slices}/{node_a}-own", own)

        dry = [("dryRun", "All")]

        def denied(method: str, path: str, body: Any, *, content_type: str = "application/json") -> str:
            exc = first_refusal(
                lambda: as_plugin.request(method, path, body, content_type=content_type, query=dry)
            )
            assert exc.status == 403, _api_error(exc)
            # The dry run was refused; the real request must be refused the same way.
            with pytest.raises(ApiException) as real:
                as_plugin.request(method, path, body, content_type=content_type)
            assert real.value.status == 403, _api_error(real.value)
            return _api_error(real.value)

        assert f"may only modify ResourceSlices of its own node, not those of node '{node_b}'" in denied(
            "POST", slices, slice_body(f"{node_b}-foreign", node_b)
        )
        assert "of driver gpu.flexmig.dev" in denied(
            "POST", slices, slice_body(f"{node_a}-x", node_a, "other.example.com")
        )
        # Another node's slice (here created by an admin) can be neither changed nor deleted.
        raw.request("POST", slices, slice_body(f"{node_b}-foreign", node_b))
        foreign = as_plugin.request("GET", f"{slices}/{node_b}-foreign")  # reading is not restricted
        foreign["spec"]["devices"] = []
        assert node_b in denied("PUT", f"{slices}/{node_b}-foreign", foreign)
        assert node_b in denied("DELETE", f"{slices}/{node_b}-foreign", None)
        as_plugin.request("DELETE", f"{slices}/{node_a}-own")

        # Pods: the mirror annotation on a pod of its own node, not on another node's pod.
        patch = {"metadata": {"annotations": {"hami.io/vgpu-mig-allocations": "x"}}}
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        as_plugin.request(
            "PATCH", f"{pods}/plugin-{node_a}", patch, content_type="application/merge-patch+json"
        )
        assert "may only modify pods bound to its own node" in denied(
            "PATCH", f"{pods}/other-{node_b}", patch, content_type="application/merge-patch+json"
        )


def _check_webhook_scope(api: Any, raw: Raw, core: Any, gpu_ns: str) -> None:
    """No controller runs, so the webhook has no backend: GPU pods fail closed, all others pass."""
    create_namespace(api, gpu_ns)
    pods = f"/api/v1/namespaces/{gpu_ns}/pods"
    dry = [("dryRun", "All")]  # sideEffects None: the webhook is consulted in dry runs too
    exc = first_refusal(lambda: raw.request("POST", pods, pod_body("gpu", gpu=True), query=dry))
    assert f'failed calling webhook "pods.{DRIVER}"' in _api_error(exc), _api_error(exc)
    raw.request("POST", pods, pod_body("plain"), query=dry)
    # The opt-out label on the pod, and the release namespace, bypass the webhook.
    opted_out = pod_body("gpu-opted-out", gpu=True)
    opted_out["metadata"]["labels"] = {"gpu.flexmig.dev/webhook": "disabled"}
    raw.request("POST", pods, opted_out, query=dry)
    raw.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body("gpu", gpu=True, sa=PLUGIN_SA), query=dry
    )
