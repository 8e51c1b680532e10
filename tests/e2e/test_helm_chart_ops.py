"""The chart's operations features rendered by the real `helm` (no API server): ServiceMonitor,
Grafana dashboard, NetworkPolicies, image digest, ServiceAccounts and securityContext values, the
PodDisruptionBudget guard, the `helm test` pod and `helm show readme`. Their behaviour against the
API server is in test_helm_ops.py."""

from __future__ import annotations

import json
from pathlib import Path

from .chart_render import CHART, DRIVER, KUBE_VERSION, by_kind, one, render, run_helm
from .test_helm_chart import container

OPS_VALUES: tuple[str, ...] = (
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
    "--set",
    "metrics.grafanaDashboard.enabled=true",
    "--set",
    "metrics.grafanaDashboard.namespace=monitoring",
    "--set",
    "networkPolicy.enabled=true",
    "--set-json",
    'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]',
    "--set",
    "image.digest=sha256:" + "ab" * 32,
    "--set",
    "controller.replicas=3",
    "--set",
    "controller.podDisruptionBudget.minAvailable=2",
    "--set",
    "kubeletPlugin.serviceAccount.create=false",
    "--set",
    "kubeletPlugin.serviceAccount.name=gpu-agent",
    "--set",
    "controller.serviceAccount.annotations.team=gpu",
    "--set-json",
    'kubeletPlugin.securityContext={"seLinuxOptions":{"type":"spc_t"}}',
)


def test_lint_strict_with_every_operations_feature(helm_bin: Path, tmp_path: Path) -> None:
    proc = run_helm(
        helm_bin, tmp_path, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *OPS_VALUES
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "[WARNING]" not in out and "[ERROR]" not in out, out


def test_operations_values(helm_bin: Path, tmp_path: Path) -> None:
    docs = render(helm_bin, tmp_path, *OPS_VALUES)
    # ServiceMonitor: selects exactly the two metrics Services, by the label only they carry.
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    wanted = sm["spec"]["selector"]["matchLabels"]
    services = [d for d in by_kind(docs, "Service") if wanted.items() <= d["metadata"]["labels"].items()]
    assert sorted(d["metadata"]["name"] for d in services) == [
        "flexmig-controller-metrics",
        "flexmig-kubelet-plugin-metrics",
    ]
    assert all(any(p["name"] == "metrics" for p in d["spec"]["ports"]) for d in services)
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    # The dashboard: the chart file, as JSON, where the sidecar looks.
    dash = one(docs, "ConfigMap", "-dashboard")
    assert (
        dash["metadata"]["namespace"] == "monitoring"
        and dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    )
    assert json.loads(dash["data"]["flexmig.json"]) == json.loads(
        (CHART / "files/grafana-dashboard.json").read_text()
    )
    # NetworkPolicies: webhook open, metrics only from the monitoring namespace and the test pod.
    ctrl_np = one(docs, "NetworkPolicy", "-controller")
    ports = [[p["port"] for p in rule["ports"]] for rule in ctrl_np["spec"]["ingress"]]
    assert ports == [[9443], [31993]] and "from" not in ctrl_np["spec"]["ingress"][0]
    peers = ctrl_np["spec"]["ingress"][1]["from"]
    test_pod = next(d for d in docs if d["kind"] == "Pod")
    assert peers[1]["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    assert peers[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert one(docs, "NetworkPolicy", "-kubelet-plugin")["spec"]["ingress"][0]["ports"] == [
        {"port": 31992, "protocol": "TCP"}
    ]
    # Image by digest everywhere, the test pod included.
    image = "ghcr.io/flexmig/flexmig@sha256:" + "ab" * 32
    deploy, ds = one(docs, "Deployment"), one(docs, "DaemonSet")
    assert container(deploy, "controller")["image"] == image == container(ds, "plugin")["image"]
    assert test_pod["spec"]["containers"][0]["image"] == image
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    # An existing plugin ServiceAccount: not created, but bound and named by the node-scope policy.
    assert "gpu-agent" not in {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-agent"
    binding = one(docs, "ClusterRoleBinding", "-kubelet-plugin")
    assert binding["subjects"][0]["name"] == "gpu-agent"
    policy = one(docs, "ValidatingAdmissionPolicy", f"slices-node-scope.{DRIVER}")
    assert ":gpu-agent" in json.dumps(policy)
    ctrl_sa = one(docs, "ServiceAccount", "-controller")
    assert ctrl_sa["metadata"]["annotations"] == {"team": "gpu"}
    sc = container(ds, "plugin")["securityContext"]
    assert sc == {
        "runAsUser": 0,
        "privileged": True,
        "readOnlyRootFilesystem": True,
        "seLinuxOptions": {"type": "spc_t"},
    }


def test_helm_test_pod_runs_the_chart_script_against_the_releases_objects(
    helm_bin: Path, tmp_path: Path
) -> None:
    docs = render(helm_bin, tmp_path)
    pod = next(d for d in docs if d["kind"] == "Pod")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == "flexmig-test"
    ctr = spec["containers"][0]
    assert ctr["command"] == ["python3", "/etc/flexmig/test/check_serving.py"]
    env = {e["name"]: e["value"] for e in ctr["env"]}
    names = {d["metadata"]["name"] for d in docs}
    assert env["FLEXMIG_CONTROLLER"] in names and env["FLEXMIG_PLUGIN"] in names
    assert env["FLEXMIG_WEBHOOK_CONFIG"] == one(docs, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert (env["FLEXMIG_CONTROLLER_PORT"], env["FLEXMIG_PLUGIN_PORT"]) == ("31993", "31992")
    script = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "flexmig-test")
    assert (
        script["data"]["check_serving.py"].strip() == (CHART / "files/check_serving.py").read_text().strip()
    )
    # Its Role can read just the two workloads (by name) and list pods; nothing else.
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "flexmig-test")
    assert role["rules"][0]["resourceNames"] == [env["FLEXMIG_CONTROLLER"], env["FLEXMIG_PLUGIN"]]
    assert [r["verbs"] for r in role["rules"]] == [["get"], ["list"]]
    # Scheduler mode: no controller or webhook to check.
    sched = render(helm_bin, tmp_path, "--set", "allocationMode=scheduler")
    env = {
        e["name"]: e["value"]
        for e in next(d for d in sched if d["kind"] == "Pod")["spec"]["containers"][0]["env"]
    }
    assert env["FLEXMIG_CONTROLLER"] == "" and env["FLEXMIG_WEBHOOK_CONFIG"] == ""
    assert not [d for d in render(helm_bin, tmp_path, "--set", "tests.enabled=false") if d["kind"] == "Pod"]


def test_pdb_that_would_block_every_drain_is_refused(helm_bin: Path, tmp_path: Path) -> None:
    proc = run_helm(
        helm_bin,
        tmp_path,
        "template",
        "x",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "controller.replicas=2",
        "--set",
        "controller.podDisruptionBudget.minAvailable=2",
    )
    assert proc.returncode != 0
    assert (
        "controller.podDisruptionBudget.minAvailable (2) must be below controller.replicas (2)" in proc.stderr
    )


def test_helm_show_readme_is_the_charts(helm_bin: Path, tmp_path: Path) -> None:
    proc = run_helm(helm_bin, tmp_path, "show", "readme", str(CHART))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (CHART / "README.md").read_text().strip()
    for section in (
        "## Install",
        "## `helm test`",
        "## Monitoring",
        "## Uninstall",
        "preflight.allowCoexistence",
    ):
        assert section in proc.stdout
