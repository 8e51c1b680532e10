"""End-to-end: `helm test` of a live release passes, fails when a node plugin is down, and passes again
once it is back; then the release uninstalls without a trace (issue 13's "done when").

Real: helm itself (the built binary, `helm test <release> -n <ns>`), its hook ordering by weight, its
delete policies (before-hook-creation, hook-succeeded: a passing run leaves no hook object, a failing
one keeps its pod) and its watch of the pod's phase; the chart's hook objects as rendered, created in
the real API server; the hook ServiceAccount's RBAC (the script's token is a TokenRequest token of that
ServiceAccount bound to the pod); the script (deployments/helm/flexmig/files/check_serving.py, read
from the hook's ConfigMap); the probes, over real sockets to the controller's /metrics, the webhook's
/healthz over HTTPS verified with the configuration's caBundle, and each plugin's /healthz; the
controller, webhook and plugins themselves (local processes with the chart's arguments, scenario.py).

Stood in (no kubelet and no container runtime in this suite): the pods' network (each workload pod
gets a loopback pod IP its process listens on), the hook container (run as a local process, its exit
code written into the pod's status) and the kubelet's log endpoint behind `pods/log`, all in
hook_pods.py; the in-cluster API server address is the API server's own.

`--logs`: helm reads the test pod's log after its delete policies ran, so with this chart's
hook-succeeded policy `helm test --logs` of a passing release always ends in "unable to get pod logs
... not found", with a real kubelet too (helm/helm#9098). The passing runs therefore go without
`--logs`; the failing run uses it, and helm prints the script's findings from the kept pod.
"""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from controller.kube.rest import pod_path, request

from .chart_render import Raw
from .cluster import ControlPlane, free_port, wait_until
from .hook_pods import ContainerLogServer, HookPodRunner, give_pod_ips, restart_plugin
from .scenario import NodeSpec, Scenario, ScenarioOptions
from .test_helm_ops import _release_objects

pytestmark = pytest.mark.e2e
TIMEOUT_S = 15  # tests.timeoutSeconds: how long the failing run's script retries before it fails


def _helm_test(sc: Scenario, runner: HookPodRunner, *extra: str) -> tuple[int, str]:
    out = sc.cp.helm("test", sc.release, "-n", sc.namespace, "--timeout", "3m", *extra, check=False)
    return (
        out.returncode,
        f"helm test: exit {out.returncode}\n{out.stdout}\n{out.stderr}\n{runner.describe()}",
    )


def _gone(sc: Scenario, name: str) -> bool:
    try:
        request(sc.api, "GET", pod_path(sc.namespace, name))
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def test_helm_test_passes_on_a_serving_release_and_names_a_dead_plugin(control_plane: ControlPlane) -> None:
    controller_port, plugin_port = free_port(), free_port()
    values = (
        "--set", f"controller.metrics.port={controller_port}",
        "--set", f"kubeletPlugin.metrics.port={plugin_port}",
        "--set", f"tests.timeoutSeconds={TIMEOUT_S}",
    )  # fmt: skip
    options = ScenarioOptions(
        webhook=True, extra_values=values, controller_args=(f"--metrics-port={controller_port}",)
    )
    nodes = [NodeSpec("ht-a", ("A100-40GB",)), NodeSpec("ht-b", ("A100-40GB",))]
    logs = ContainerLogServer()
    with Scenario(control_plane, nodes, options) as sc:
        try:
            sc.wait_webhook()
            ips = give_pod_ips(sc, plugin_port)
            for node in sc.nodes.values():
                logs.advertise(node.standin.api_client, node.name)
            hook = f"{sc.release}-test"
            plugin_ds, controller = f"{sc.release}-kubelet-plugin", f"{sc.release}-controller"
            with HookPodRunner(sc, hook, logs) as runner:
                # 1. Everything serves: helm test passes, and the script probed every pod at its own IP.
                code, why = _helm_test(sc, runner)
                assert code == 0, why
                assert "Phase:          Succeeded" in why, why
                [run] = runner.runs
                assert run.exit_code == 0, why
                for pod, ip in ips.items():
                    kind = (
                        f"Deployment {controller}" if pod.startswith(controller) else f"DaemonSet {plugin_ds}"
                    )
                    port = controller_port if pod.startswith(controller) else plugin_port
                    assert f"ok: {kind}: pod {pod}: http://{ip}:{port}/" in run.output, why
                webhook = f"https://127.0.0.1:{sc.webhook_port}/healthz"
                assert f"ok: webhook {sc.release}.gpu.flexmig.dev: {webhook}" in run.output, why
                wait_until(lambda: _gone(sc, hook), 30, "hook-succeeded to delete the passing pod")

                # 2. One plugin down: helm test fails, its logs name that pod, the pod is kept.
                victim = sorted(sc.nodes)[1]
                dead = sc.plugin_pod(victim)["metadata"]["name"]
                plugin = sc.nodes[victim].plugin
                assert plugin is not None and plugin.stop() == 0
                code, why = _helm_test(sc, runner, "--logs")
                assert code != 0, why
                assert len(runner.runs) == 2 and runner.runs[1].exit_code == 1, why
                named = f"FAILED: DaemonSet {plugin_ds}: pod {dead}: GET http://{ips[dead]}:{plugin_port}/healthz failed"
                failed = [line for line in runner.runs[1].output.splitlines() if line.startswith("FAILED")]
                assert len(failed) == 1 and failed[0].startswith(named), why  # that pod, nothing else
                helm_output = why.split("\nhook runs:")[0]  # helm's own stdout and stderr
                assert f"POD LOGS: {hook}" in helm_output and named in helm_output, why
                kept = request(sc.api, "GET", pod_path(sc.namespace, hook))
                assert kept["status"]["phase"] == "Failed", kept["status"]

                # 3. The plugin back at its pod IP: helm test replaces the failed pod and passes again.
                restart_plugin(sc, sc.nodes[victim], ips[dead], plugin_port)
                code, why = _helm_test(sc, runner)
                assert code == 0, why
                assert len(runner.runs) == 3 and runner.runs[2].exit_code == 0, why
            assert not runner.errors, runner.describe()

            # Uninstall while the stand-ins still finish pods: nothing of the release is left, hook
            # objects included (a passing run deleted them).
            sc.cp.helm("uninstall", sc.release, "-n", sc.namespace, "--wait", "--timeout", "2m")
            sc.installed = False
            wait_until(lambda: not sc.pods(sc.namespace), 60, "the chart's pods to go")
            assert _release_objects(Raw(sc.api), sc.release, sc.namespace) == []
        finally:
            logs.close()
