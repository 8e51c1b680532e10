"""The node agent under faults, on the real control plane (issue #10 defects 3 and 5).

- The kube-apiserver is stopped for 22 s and started again. During the outage kubelet re-registers the
  plugin (so the publisher must call the API server and gets urllib3's errors), and the node's slices
  are deleted behind the API server's back (in etcd), so that only a publisher that survived the
  outage can bring them back. They must come back within a bounded time after the API server is
  ready, claims prepared before the outage stay prepared, and /healthz tells the truth throughout.
- Periodic reconcile: a claim deleted from the API server is unprepared without kubelet asking; an
  instance created out of band is left alone while the devices it overlaps leave the ResourceSlices,
  and they come back when it is destroyed.

Settings the old plugin did not know are passed by environment (FLEXMIG_RECONCILE_INTERVAL), so the
same test runs against it and fails on the behaviour, not on a flag.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from driver.nvml.sim import SimGpuSpec, open_sim
from kubeletplugin.publish.slices import slice_name_prefix

from .cluster import ControlPlane, wait_until
from .k8sobjects import create_namespace, create_ready_node
from .plugin_harness import (
    ClaimFactory,
    Kubelet,
    NodeDir,
    PluginProcess,
    ensure_device_class,
    heartbeats,
    instances,
    wait_slices,
)

NS = "plugin-faults"
DOWN_S = 22.0
# After the API server is ready again: the publisher's backoff (at most 8 s, +50 % jitter) plus one sync.
REPUBLISH_BOUND_S = 20.0
# A periodic pass runs every second in the reconcile test (a few ms of work each, then a republish);
# the bound is for a loaded 2-CPU machine, not for the plugin: it only has to finish at all.
RECONCILE_BOUND_S = 30.0

_nodes: list[str] = []


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane) -> Iterator[Any]:
    client = control_plane.api_client()
    create_namespace(client, NS)
    ensure_device_class(client)
    with heartbeats(client, lambda: list(_nodes)):
        yield client


def _node(cp: ControlPlane, api: Any, name: str) -> NodeDir:
    create_ready_node(api, name)
    _nodes.append(name)
    return NodeDir.create(name, cp.kubeconfig, [SimGpuSpec("A100-40GB")])


def _healthz(plugin: PluginProcess) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{plugin.metrics_port}/healthz", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _ready(cp: ControlPlane) -> bool:
    try:
        return cp.get("/readyz", timeout_s=1)[0] == 200
    except OSError:  # connection refused: it is down
        return False


def _device_names(slices: list[dict[str, Any]]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices") or []}


def _checkpoint_claims(nd: NodeDir) -> set[str]:
    """UIDs in the node's checkpoint file (written atomically: never read half-written)."""
    return set(json.loads(nd.checkpoint.read_text())["claims"])


def _etcd_delete_prefix(cp: ControlPlane, prefix: str) -> int:
    """Delete every etcd key under `prefix` (the API server is down: nothing else can); the count."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = {
        "key": base64.b64encode(prefix.encode()).decode(),
        "range_end": base64.b64encode(end.encode()).decode(),
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{cp.etcd_port}/v3/kv/deleterange", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.loads(resp.read()).get("deleted", 0))


def test_apiserver_restart_node_republishes_and_health_stays_truthful(
    control_plane: ControlPlane, api: Any
) -> None:
    cp = control_plane
    nd = _node(cp, api, "fault-apiserver")
    plugin = PluginProcess(nd).wait_ready()
    kubelet = Kubelet(nd)
    claims = ClaimFactory(api, NS)
    try:
        kubelet.register()
        before = wait_slices(api, nd.node, lambda s: bool(_device_names(s)))
        claim = claims.create("kept", nd.node, ["gpu-0-mig-1g5gb-19-0"])
        assert kubelet.prepare([claim])[claim["uid"]].error == ""
        assert instances(nd) == [(0, 19, 0, 1, (0,))]

        outage_over = threading.Event()
        during: dict[str, Any] = {}

        def while_down() -> None:
            """What happens on the node during the outage (the main thread restarts the API server:
            the new process must not die with a helper thread)."""
            try:
                wait_until(lambda: not _ready(cp), 30, "kube-apiserver to stop")
                kubelet.register()  # kubelet re-registers: the publisher now has to reach the API server
                prefix = f"/registry/resourceslices/{slice_name_prefix(nd.node)}"
                during["deleted"] = _etcd_delete_prefix(cp, prefix)
                codes = []
                while not outage_over.wait(1):
                    codes.append(_healthz(plugin)[0])  # alive loops: retrying is no reason to restart
                during["codes"] = codes
            except BaseException as exc:  # reported by the assertions below, not lost in the thread
                during["error"] = exc

        helper = threading.Thread(target=while_down, daemon=True)
        helper.start()
        try:
            cp.restart_apiserver(DOWN_S)
        finally:
            outage_over.set()
            helper.join(30)
        assert "error" not in during, during
        assert during["deleted"] == len(before), f"deleted {during['deleted']} etcd keys, had {len(before)}"
        assert len(during["codes"]) >= DOWN_S / 2 and set(during["codes"]) == {200}, during["codes"]
        ready_at = time.monotonic()
        after = wait_slices(api, nd.node, lambda s: bool(_device_names(s)), timeout_s=REPUBLISH_BOUND_S)
        # New objects: the old ones are gone from etcd, only the plugin could have written these.
        assert not {s["metadata"]["uid"] for s in after} & {s["metadata"]["uid"] for s in before}
        took = time.monotonic() - ready_at
        print(f"[e2e] slices republished {took:.1f}s after the kube-apiserver was ready again")
        assert _device_names(after) == _device_names(before)
        assert instances(nd) == [(0, 19, 0, 1, (0,))]  # never destroyed on uncertainty
        assert plugin.proc.poll() is None

        code, text = _healthz(plugin)
        assert code == 200, text
        for loop in ("slice-publisher", "health-events", "periodic-reconcile", "metrics-http"):
            assert f"loop {loop} ok" in text or f"loop {loop} retrying" in text, text
        errors = [
            e for e in plugin.events() if e.get("event") == "loop iteration failed; retrying with backoff"
        ]
        assert any(e.get("loop") == "slice-publisher" for e in errors)  # it did meet the outage
        assert kubelet.unprepare([claim]) == {claim["uid"]: ""}
    finally:
        kubelet.close()
        assert plugin.stop() == 0
        claims.delete("kept")
        nd.cleanup()


def test_periodic_reconcile_unprepares_gone_claims_and_withdraws_foreign_instances(
    control_plane: ControlPlane, api: Any
) -> None:
    nd = _node(control_plane, api, "fault-reconcile")
    plugin = PluginProcess(nd, env={"FLEXMIG_RECONCILE_INTERVAL": "1"}).wait_ready()
    kubelet = Kubelet(nd)
    claims = ClaimFactory(api, NS)
    try:
        kubelet.register()
        full = _device_names(wait_slices(api, nd.node, lambda s: bool(_device_names(s))))
        kept = claims.create("rc-kept", nd.node, ["gpu-0-mig-1g5gb-19-0"])
        gone = claims.create("rc-gone", nd.node, ["gpu-0-mig-1g5gb-19-1"])
        for c in (kept, gone):
            assert kubelet.prepare([c])[c["uid"]].error == ""
        assert len(instances(nd)) == 2

        # kubelet never unprepares "rc-gone" (e.g. it was down when the pod went): the plugin must.
        claims.delete("rc-gone")
        # The plugin destroys the instance first and drops the checkpoint entry after it (crash-safe
        # order: kubeletplugin/prepare/realiser.py), so the instance can be gone while the entry is
        # still there: wait for both, not for the first.
        wait_until(
            lambda: len(instances(nd)) == 1 and _checkpoint_claims(nd) == {kept["uid"]},
            RECONCILE_BOUND_S,
            "the deleted claim's instance and checkpoint entry to be removed",
        )
        assert instances(nd) == [(0, 19, 0, 1, (0,))]
        assert _checkpoint_claims(nd) == {kept["uid"]}
        assert kubelet.unprepare([gone]) == {gone["uid"]: ""}  # kubelet's late call still succeeds

        # An administrator creates a 3g.20gb instance by hand at placement 4.
        admin_nvml = open_sim(nd.sim_state)
        admin_nvml.init()
        foreign = admin_nvml.create_gpu_instance(0, 9, 4)
        overlapped = {"gpu-0-mig-1g5gb-19-4", "gpu-0-mig-3g20gb-9-4", "gpu-0-mig-7g40gb-0-0"}
        assert overlapped <= full
        withdrawn = wait_slices(
            api, nd.node, lambda s: not (_device_names(s) & overlapped), timeout_s=RECONCILE_BOUND_S
        )
        names = _device_names(withdrawn)
        assert "gpu-0-mig-1g5gb-19-1" in names  # placements beside it stay published
        assert (0, 9, 4, 4, ()) in instances(nd)  # untouched
        metrics = plugin.metrics()
        assert "flexmig_node_foreign_instances 1.0" in metrics
        assert 'flexmig_node_orphan_instances_total{action="withdrawn"} 1.0' in metrics
        # A claim allocated there anyway is refused, naming the instance, and nothing is created.
        late = claims.create("rc-late", nd.node, ["gpu-0-mig-1g5gb-19-5"])
        assert "flexmig did not create" in kubelet.prepare([late])[late["uid"]].error

        admin_nvml.destroy_gpu_instance(0, foreign.gi_id)
        wait_slices(api, nd.node, lambda s: _device_names(s) == full, timeout_s=RECONCILE_BOUND_S)
        assert kubelet.unprepare([kept]) == {kept["uid"]: ""}
        assert instances(nd) == []
    finally:
        kubelet.close()
        assert plugin.stop() == 0
        for name in ("rc-kept", "rc-gone", "rc-late"):
            claims.delete(name)
        nd.cleanup()
