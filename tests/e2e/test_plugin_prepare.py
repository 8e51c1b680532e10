"""The kubelet plugin as a separate process on the NVML simulator, driven over its unix sockets.

One plugin process (node `plugin-a`: A100-40GB with MIG on, H100-80GB, A30-24GB with MIG on) serves
every test in this module; claims come from the real API server, allocated by the test acting as the
allocator. Tests run in file order and each cleans up what it prepared.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.constants import ANNOTATION_MIG_ALLOCATIONS, DRIVER_NAME
from driver.migannotation import decode_mig_allocations
from driver.nvml.sim import SimGpuSpec
from driver.nvml.types import HealthEventKind

from .cluster import ControlPlane
from .k8sobjects import create_namespace, create_ready_node
from .plugin_harness import (
    ClaimFactory,
    Kubelet,
    NodeDir,
    PluginProcess,
    ensure_device_class,
    heartbeats,
    instances,
    node_slices,
    wait_slices,
)

NODE = "plugin-a"
NS = "plugin-prepare"
A100_1G = "gpu-0-mig-1g5gb-19-{}"
H100_1G = "gpu-1-mig-1g10gb-19-{}"
A30_1G = "gpu-2-mig-1g6gb-14-{}"


class Env:
    def __init__(self, cp: ControlPlane) -> None:
        self.api = cp.api_client()
        self.nd = NodeDir.create(
            NODE, cp.kubeconfig, [SimGpuSpec("A100-40GB"), SimGpuSpec("H100-80GB"), SimGpuSpec("A30-24GB")]
        )
        self.claims = ClaimFactory(self.api, NS)
        self.plugin: PluginProcess | None = None
        self.kubelet: Kubelet | None = None

    def start(self) -> None:
        self.plugin = PluginProcess(self.nd).wait_ready()
        self.kubelet = Kubelet(self.nd)

    @property
    def k(self) -> Kubelet:
        assert self.kubelet is not None
        return self.kubelet

    @property
    def p(self) -> PluginProcess:
        assert self.plugin is not None
        return self.plugin


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    e = Env(control_plane)
    create_ready_node(e.api, NODE)
    create_namespace(e.api, NS)
    ensure_device_class(e.api)
    e.start()
    with heartbeats(e.api, lambda: [NODE]):
        yield e
    if e.kubelet is not None:
        e.kubelet.close()
    assert e.p.stop() == 0, e.p.log_text()[-3000:]
    e.nd.cleanup()


def _ok(resp: Any) -> list[tuple[str, list[str]]]:
    assert resp.error == "", resp.error
    return [(d.device_name, list(d.cdi_device_ids)) for d in resp.devices]


def test_registration_and_slices(env: Env) -> None:
    info = env.k.register()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER_NAME
    assert info.endpoint == str(env.nd.dra_socket)
    assert next(iter(info.supported_versions)) == "v1.DRAPlugin"
    slices = wait_slices(env.api, NODE, lambda s: True)
    names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    assert A100_1G.format(3) in names and H100_1G.format(0) in names and A30_1G.format(1) in names
    assert "gpu-1" in names and "gpu-0" not in names  # A100 in MIG mode: MIG devices only
    first_gen = slices[0]["spec"]["pool"]["generation"]

    # kubelet wipes the node's slices when it restarts; the next registration republishes them.
    for s in slices:
        env.claims.resource.delete_resource_slice(s["metadata"]["name"])
    env.k.register()
    again = wait_slices(env.api, NODE, lambda s: len(s) == len(slices))
    assert {s["spec"]["pool"]["generation"] for s in again} == {first_gen + 1}


def test_prepare_one_claim_status_annotation_idempotent(env: Env) -> None:
    c = env.claims.create("one", NODE, [A100_1G.format(3)])
    resp = env.k.prepare([c])[c["uid"]]
    [(device, cdi_ids)] = _ok(resp)
    assert device == A100_1G.format(3)
    assert cdi_ids == [f"{DRIVER_NAME}/mig={c['uid']}-{device}"]
    spec = json.loads((env.nd.cdi_dir / f"{DRIVER_NAME}-{c['uid']}.json").read_text())
    assert spec["devices"][0]["name"] == f"{c['uid']}-{device}"
    assert instances(env.nd) == [(0, 19, 3, 1, (0,))]

    data = env.claims.claim("one")["status"]["devices"][0]
    assert data["driver"] == DRIVER_NAME and data["pool"] == NODE and data["device"] == device
    mig = env.nd.admin().snapshot().gpus[0].gpu_instances[0]
    assert data["data"]["migUUID"] == mig.compute_instances[0].mig_uuid
    assert data["data"]["gpuInstanceID"] == mig.gi_id
    assert data["data"]["placement"] == {"start": 3, "size": 1}
    assert data["data"]["profile"] == "1g.5gb"
    [rec] = decode_mig_allocations(
        env.claims.pod("one")["metadata"]["annotations"][ANNOTATION_MIG_ALLOCATIONS]
    )
    assert (rec.container_index, rec.device_index, rec.profile, rec.placement_start) == (0, 0, "1g.5gb", 3)
    assert rec.mig_uuid == data["data"]["migUUID"]

    creates = env.nd.admin().call_counts().get("nvmlDeviceCreateGpuInstanceWithPlacement", 0)
    again = env.k.prepare([c])[c["uid"]]
    assert _ok(again) == [(device, cdi_ids)]
    assert env.nd.admin().call_counts().get("nvmlDeviceCreateGpuInstanceWithPlacement", 0) == creates
    assert instances(env.nd) == [(0, 19, 3, 1, (0,))]

    assert env.k.unprepare([c]) == {c["uid"]: ""}
    assert instances(env.nd) == []
    assert not (env.nd.cdi_dir / f"{DRIVER_NAME}-{c['uid']}.json").exists()
    assert env.k.unprepare([c]) == {c["uid"]: ""}  # idempotent
    env.claims.delete("one")


def test_prepare_many_models_with_isolated_errors(env: Env) -> None:
    good = [
        env.claims.create("m-a100", NODE, [A100_1G.format(0), A100_1G.format(1)]),
        env.claims.create("m-h100", NODE, [H100_1G.format(6)]),
        env.claims.create("m-a30", NODE, [A30_1G.format(2)]),
        env.claims.create("m-mixed", NODE, [A100_1G.format(6), H100_1G.format(5)]),
    ]
    bad = env.claims.create("m-bad", NODE, ["gpu-0-mig-9g99gb-99-0"])
    wrong_uid = {**env.claims.create("m-uid", NODE, [A100_1G.format(4)]), "uid": "0000-not-the-uid"}
    assert env.nd.admin().snapshot().gpus[1].mig_current is False  # the idle H100 was switched off
    resp = env.k.prepare([*good, bad, wrong_uid])
    for c in good:
        _ok(resp[c["uid"]])
    assert "not published" in resp[bad["uid"]].error
    assert "has UID" in resp[wrong_uid["uid"]].error
    assert env.nd.admin().snapshot().gpus[1].mig_current is True  # switched on at the first MIG prepare
    assert instances(env.nd) == [
        (0, 19, 0, 1, (0,)),
        (0, 19, 1, 1, (0,)),
        (0, 19, 6, 1, (0,)),
        (1, 19, 5, 1, (0,)),
        (1, 19, 6, 1, (0,)),
        (2, 14, 2, 1, (0,)),
    ]
    devices = env.claims.claim("m-mixed")["status"]["devices"]
    assert [d["device"] for d in devices] == [A100_1G.format(6), H100_1G.format(5)]
    records = decode_mig_allocations(
        env.claims.pod("m-a100")["metadata"]["annotations"][ANNOTATION_MIG_ALLOCATIONS]
    )
    assert [(r.container_index, r.device_index, r.placement_start) for r in records] == [(0, 0, 0), (0, 1, 1)]

    errors = env.k.unprepare([*good, bad])
    assert set(errors.values()) == {""}
    assert instances(env.nd) == []
    assert env.nd.admin().snapshot().gpus[1].mig_current is False  # last H100 instance gone: MIG off
    for name in ("m-a100", "m-h100", "m-a30", "m-mixed", "m-bad", "m-uid"):
        env.claims.delete(name)


def test_unprepare_in_use_then_retry(env: Env) -> None:
    c = env.claims.create("busy", NODE, [H100_1G.format(2)])
    _ok(env.k.prepare([c])[c["uid"]])
    gi = env.nd.admin().snapshot().gpus[1].gpu_instances[0]
    env.nd.admin().add_process(1, gi.gi_id, gi.compute_instances[0].ci_id, pid=4242)
    error = env.k.unprepare([c])[c["uid"]]
    assert "IN_USE" in error
    assert len(instances(env.nd)) == 1
    env.nd.admin().remove_process(1, 4242)
    assert env.k.unprepare([c]) == {c["uid"]: ""}
    assert instances(env.nd) == []
    assert env.k.unprepare([{"namespace": NS, "name": "never", "uid": "never-seen"}]) == {"never-seen": ""}
    env.claims.delete("busy")


def test_health_stream_reports_xid(env: Env) -> None:
    c = env.claims.create("sick", NODE, [A100_1G.format(2)])
    _ok(env.k.prepare([c])[c["uid"]])
    stream = env.k.watch_health()
    first = next(stream)
    health = {d.device.device_name: d.health for d in first.devices}
    assert health[A100_1G.format(2)] == 1 and health["gpu-1"] == 1
    gi = env.nd.admin().snapshot().gpus[0].gpu_instances[0]
    env.nd.admin().inject_health_event(0, HealthEventKind.XID, xid=48, gi_id=gi.gi_id, ci_id=0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        msg = next(stream)
        health = {d.device.device_name: d.health for d in msg.devices}
        if health[A100_1G.format(2)] == 2:
            break
    assert health[A100_1G.format(2)] == 2  # UNHEALTHY
    assert health[A100_1G.format(3)] == 1 and health["gpu-1"] == 1
    stream.cancel()
    assert env.k.unprepare([c]) == {c["uid"]: ""}
    env.claims.delete("sick")


def test_metrics_endpoint(env: Env) -> None:
    c = env.claims.create("metered", NODE, [A30_1G.format(0)], containers=2)
    _ok(env.k.prepare([c])[c["uid"]])
    text = env.p.metrics()
    info = [line for line in text.splitlines() if line.startswith("hami_mig_device_info{")]
    assert len(info) == 2, text  # the claim is shared by both containers
    assert all(f'namespace="{NS}"' in line and 'pod="metered"' in line for line in info)
    assert {re.search(r'container="(\w+)"', line).group(1) for line in info} == {"c0", "c1"}  # type: ignore[union-attr]
    assert 'profile="1g.6gb"' in info[0] and 'vdevice_index="0"' in info[0]
    assert re.search(r'flexmig_node_prepare_duration_seconds_count\{result="ok"\} [1-9]', text)
    assert re.search(
        r'flexmig_node_nvml_errors_total\{call="nvmlComputeInstanceDestroy",code="IN_USE"\} 1', text
    )
    assert 'flexmig_node_checkpoint_claims{state="PrepareCompleted"} 1.0' in text
    assert "flexmig_node_published_devices" in text
    assert env.k.unprepare([c]) == {c["uid"]: ""}
    assert "hami_mig_device_info{" not in env.p.metrics()
    env.claims.delete("metered")


def test_claims_serialise_per_gpu_not_per_node(env: Env) -> None:
    # The simulator sleeps after the create is written and outside its lock, like a slow driver call.
    delay = 1.5
    same = [env.claims.create(f"s{i}", NODE, [A100_1G.format(i)]) for i in range(2)]
    other = [
        env.claims.create("o0", NODE, [A100_1G.format(4)]),
        env.claims.create("o1", NODE, [A30_1G.format(3)]),
    ]
    env.nd.admin().set_latency(nvmlDeviceCreateGpuInstanceWithPlacement=delay)
    try:
        t0 = time.monotonic()
        assert all(r.error == "" for r in env.k.prepare(other).values())
        parallel = time.monotonic() - t0
        t0 = time.monotonic()
        assert all(r.error == "" for r in env.k.prepare(same).values())
        serial = time.monotonic() - t0
    finally:
        env.nd.admin().clear_latency()
    assert serial >= 2 * delay  # one GPU: one create after the other
    assert parallel < serial - delay / 2  # two GPUs: the creates overlap
    assert set(env.k.unprepare(same + other).values()) == {""}
    for name in ("s0", "s1", "o0", "o1"):
        env.claims.delete(name)


def test_reallocated_claim_replaces_its_old_instance(env: Env) -> None:
    # An unprepare that never reached us, then a new allocation of the same claim: a prepare must not
    # answer with the old device.
    c = env.claims.create("realloc", NODE, [A100_1G.format(5)])
    _ok(env.k.prepare([c])[c["uid"]])
    pod_uid = env.claims.claim("realloc")["status"]["reservedFor"][0]["uid"]
    env.claims.resource.patch_namespaced_resource_claim_status(
        "realloc", NS, {"status": {"reservedFor": None, "allocation": None, "devices": None}}
    )
    env.claims.resource.patch_namespaced_resource_claim_status(
        "realloc",
        NS,
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER_NAME,
                                "pool": NODE,
                                "device": A30_1G.format(1),
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "realloc", "uid": pod_uid}],
            }
        },
    )
    [(device, _)] = _ok(env.k.prepare([c])[c["uid"]])
    assert device == A30_1G.format(1)
    assert instances(env.nd) == [(2, 14, 1, 1, (0,))]
    assert env.k.unprepare([c]) == {c["uid"]: ""}
    env.claims.delete("realloc")


def test_no_slices_left_behind_for_other_nodes(env: Env) -> None:
    # The plugin only ever lists/writes its own node's slices.
    assert node_slices(env.api, "some-other-node") == []
    assert Path(env.nd.checkpoint).exists()
