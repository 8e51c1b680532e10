"""The Helm chart `deployments/helm/flexmig`, checked with the real `helm` and no API server.

- `helm lint --strict` is clean, with the defaults and with overrides;
- `helm template` renders, and what it renders says what the components need: the plugin's and the
  controller's arguments are parsed by the real `flexmig` argument parser (so a flag the chart passes
  but the command does not know fails here, not in a crash-looping pod), the device ConfigMap holds
  the driver's default allowlist, the node ConfigMap loads with the plugin's own parser;
- the values schema rejects bad values with a message naming the field.

The tests against the API server are in `test_helm_chart_dryrun.py` and `test_helm_chart_install.py`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.catalog.allowlist import default_allowlist_data, parse_allowlist
from driver.hamiconfig import unused_keys
from flexmig.cli import build_parser
from kubeletplugin.settings.nodeconfig import OperatingMode, node_config_for

from .chart_render import (
    CHART,
    DRIVER,
    KUBE_VERSION,
    OVERRIDES,
    by_kind,
    one,
    render,
    run_helm,
)


def is_hook(doc: Mapping[str, Any]) -> bool:
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


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
    all_docs = render(helm_bin, tmp_path)
    docs = [d for d in all_docs if not is_hook(d)]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount"] * 2
        + ["ClusterRole", "ClusterRoleBinding"] * 2
        + ["Role", "RoleBinding"] * 2  # the controller's; the plugin's Node events (namespace default)
        + ["Deployment", "DaemonSet", "MutatingWebhookConfiguration"]
        + ["ConfigMap"] * 2
        + ["Service"] * 3
        + ["DeviceClass"] * 3
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 3  # slices, pods, claims
        + ["Secret"]  # the webhook certificate's, owned by Helm so that uninstall deletes it
    )
    # `helm test` only: its pod, ServiceAccount, RBAC and script.
    hooks = [d for d in all_docs if is_hook(d)]
    assert sorted(d["kind"] for d in hooks) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Pod"]
    )
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in hooks} == {"test"}

    # DeviceClasses select on the attribute the plugin publishes (kubeletplugin/publish/gpudevices.py: type). The
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
        "/",  # the driver root, read-only: libnvidia-ml.so.1 and the files CDI specs mount
        "/usr/bin",  # nvidia-cdi-hook's directory, read-only: the plugin checks the hook is there
        "/usr/local/vgpu",  # HAMi-core's library; CDI specs of shared GPUs mount it from the host
    }
    assert (args.hami_core_dir, args.hami_core_library) == ("/usr/local/vgpu", "/usr/local/vgpu/libvgpu.so")
    assert args.device_split_count is None  # from the device config's deviceSplitCount (below)
    # Defaults that deliver dynamic MIG: unlisted nodes decide per GPU; no unenforced shares.
    assert (args.operating_mode, args.unenforced_shares) == ("auto", "refuse")
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    for name in ("plugins-registry", "plugin-data", "cdi", "hami-core"):  # same path inside as on the host
        assert mounts[name]["mountPath"] == volumes[name]["hostPath"]["path"]
    assert mounts["driver-root"]["readOnly"] is True
    # CDI specs name host paths; the plugin looks the files up where its container sees them.
    assert (args.driver_root, args.container_driver_root) == ("/", "/driver-root")
    assert mounts["driver-root"]["mountPath"] == "/driver-root"
    assert (args.nvidia_cdi_hook_path, args.container_nvidia_cdi_hook_path) == (
        "/usr/bin/nvidia-cdi-hook",
        "/cdi-hook/nvidia-cdi-hook",
    )
    assert args.dev_root is None and args.proc_root is None  # the node's /dev and the kernel's /proc
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
    assert (doc["nvidia"]["deviceSplitCount"], doc["nvidia"]["memoryFactor"]) == (10, 1)
    # A generated config holds only keys flexmig uses: no start-up warning about unused keys.
    assert unused_keys(doc) == []
    parse_allowlist(doc["nvidia"]["migProfileAllowlist"])
    node_cm = one(docs, "ConfigMap", "-node-config")
    assert json.loads(node_cm["data"]["config.json"]) == {"nodeconfig": []}

    # Metrics Services in-cluster: no fixed NodePort to collide with HAMi's monitors or a second
    # release (test_helm_chart_values.py has the NodePort variants).
    for suffix, port in (("-controller-metrics", 31993), ("-kubelet-plugin-metrics", 31992)):
        svc = one(docs, "Service", suffix)
        assert svc["spec"]["type"] == "ClusterIP" and "externalTrafficPolicy" not in svc["spec"]
        assert svc["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]

    # The webhook: fails closed, never for the release namespace or kube-system.
    hook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    # None: a review writes nothing (the controller creates shim templates for pods that exist).
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == (
        "Fail",
        "None",
        ["v1"],
    )
    # Opting out is per namespace only: a pod's own labels cannot exempt it.
    assert "objectSelector" not in hook
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
    node_svc = one(docs, "Service", "-kubelet-plugin-metrics")
    assert node_svc["spec"]["ports"][0]["nodePort"] == 30992
    assert node_svc["spec"]["externalTrafficPolicy"] == "Local"  # a node's port answers for that node

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
    role = one(docs, "Role", "-controller")
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
    # ... and the webhook knows the name, so the shim and the mapping never both act on one pod.
    deploy_args = parse_cli(container(one(docs, "Deployment"), "controller")["args"], {})
    assert deploy_args.mapped_resources == "gpu.flexmig.dev/mig"

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
