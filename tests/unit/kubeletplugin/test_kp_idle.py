"""Idle MIG instances (--idle-grace-period, kubeletplugin/prepare/idle.py) on the NVML simulator:
kept at unprepare, reused by a claim of the same shape, displaced by another layout, expired, never
kept while a process uses them, and kept within the namespace unless the administrator opts in."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from sim_node import FakeApi, SimNode, make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.settings.config import ConfigError, add_flags, load_config
from kubeletplugin.settings.idlepolicy import IdlePolicy

NODE = "n1"
ONE_G_AT_3 = "gpu-0-mig-1g5gb-19-3"  # A100-40GB: placement 3, one slice
TWO_G_AT_2 = "gpu-0-mig-2g10gb-14-2"  # placement 2..3: overlaps 1g at 3
GI_CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"
GI_DESTROY = "nvmlGpuInstanceDestroy"


KEEP_30S = IdlePolicy(30.0)


def _node(tmp_path: Path, api: FakeApi, policy: IdlePolicy | None = KEEP_30S) -> SimNode:
    node = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], api=api, idle=policy)
    node.preparer.idle.clock = lambda: 1000.0
    return node


def _claim(api: FakeApi, n: int, device: str, namespace: str = "ns") -> ClaimRef:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    result = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
    api.claims[(namespace, f"c{n}")] = ClaimView(
        namespace, f"c{n}", uid, (result,), (PodRef(namespace, f"p{n}", f"pod-{n}"),)
    )
    return ClaimRef(namespace=namespace, uid=uid, name=f"c{n}")


def _gis(node: SimNode) -> list[tuple[int, int, int]]:
    """(GI id, placement start, number of CIs) of every GI on GPU 0."""
    gpu = node.admin.snapshot().gpus[0]
    return [(gi.gi_id, gi.start, len(gi.compute_instances)) for gi in gpu.gpu_instances]


def _event(node: SimNode, event: str) -> float:
    value = node.metrics.registry.get_sample_value(
        "flexmig_node_idle_instance_events_total", {"event": event}
    )
    return value or 0.0


def _prepare(node: SimNode, ref: ClaimRef) -> None:
    assert node.preparer.prepare([ref])[ref.uid].error == ""


def _unprepare(node: SimNode, ref: ClaimRef) -> None:
    assert node.preparer.unprepare([ref])[ref.uid] is None


def test_same_shape_reuses_the_gpu_instance_with_a_fresh_compute_instance(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    try:
        first = _claim(api, 1, ONE_G_AT_3)
        _prepare(node, first)
        [(gi_id, _, _)] = _gis(node)
        _unprepare(node, first)
        # The GI stays, without a CI; the claim's spec and entry are gone, the idle record is there.
        assert _gis(node) == [(gi_id, 3, 0)]
        assert not (tmp_path / "cdi" / f"{DRIVER_NAME}-{first.uid}.json").exists()
        cp = node.store.load()
        assert cp.claims == {} and [i.gi_id for i in cp.idle.values()] == [gi_id]
        assert _event(node, "kept") == 1
        assert node.metrics.registry.get_sample_value("flexmig_node_idle_instances") == 1

        second = _claim(api, 2, ONE_G_AT_3)
        _prepare(node, second)
        assert _gis(node) == [(gi_id, 3, 1)]  # same GI, one new CI
        assert node.mig_calls()[GI_CREATE] == 1 and node.mig_calls()[GI_DESTROY] == 0
        [dev] = node.store.get_claim(second.uid).devices  # type: ignore[union-attr]
        assert dev.gi_id == gi_id and dev.created_gi and dev.ci_id is not None
        assert node.spec(second.uid)["devices"]
        assert node.store.load().idle == {} and _event(node, "reused") == 1
        assert node.metrics.registry.get_sample_value("flexmig_node_idle_instances") == 0
        # The adopted GI is the claim's now: a plain unprepare with the feature off destroys it.
        node.preparer.idle.policy = IdlePolicy()
        _unprepare(node, second)
        assert _gis(node) == []
    finally:
        node.preparer.close()


def test_a_different_layout_destroys_the_idle_instance_first(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    try:
        first = _claim(api, 1, ONE_G_AT_3)
        _prepare(node, first)
        _unprepare(node, first)
        second = _claim(api, 2, TWO_G_AT_2)
        _prepare(node, second)
        assert [(start, cis) for _, start, cis in _gis(node)] == [(2, 1)]
        assert node.mig_calls()[GI_DESTROY] == 1 and node.mig_calls()[GI_CREATE] == 2
        assert node.store.load().idle == {} and _event(node, "displaced") == 1
        # An idle instance elsewhere on the GPU is left alone.
        third = _claim(api, 3, "gpu-0-mig-1g5gb-19-6")
        _prepare(node, third)
        _unprepare(node, third)
        fourth = _claim(api, 4, "gpu-0-mig-1g5gb-19-0")
        _prepare(node, fourth)
        assert sorted(start for _, start, _ in _gis(node)) == [0, 2, 6]
        assert len(node.store.load().idle) == 1
    finally:
        node.preparer.close()


def test_a_whole_gpu_claim_displaces_every_idle_instance(tmp_path: Path) -> None:
    api = FakeApi()
    node = make_node(
        tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=False)], api=api, idle=IdlePolicy(30)
    )
    try:
        first = _claim(api, 1, "gpu-0-mig-1g10gb-19-3")
        _prepare(node, first)
        _unprepare(node, first)
        assert len(node.store.load().idle) == 1
        whole = _claim(api, 2, "gpu-0")
        _prepare(node, whole)
        assert _gis(node) == [] and node.store.load().idle == {}
        assert not node.nvml.mig_mode(0).current  # Hopper: MIG switched off for the whole GPU
    finally:
        node.preparer.close()


def test_expired_idle_instances_are_destroyed_by_the_sweep(tmp_path: Path) -> None:
    api = FakeApi()
    node = make_node(
        tmp_path, NODE, [SimGpuSpec("H100-80GB", mig_enabled=False)], api=api, idle=IdlePolicy(30)
    )
    now = [1000.0]
    node.preparer.idle.clock = lambda: now[0]
    try:
        first = _claim(api, 1, "gpu-0-mig-1g10gb-19-3")
        _prepare(node, first)
        _unprepare(node, first)
        now[0] += 29
        assert node.preparer.idle.sweep() == 0 and len(_gis(node)) == 1
        now[0] += 1
        assert node.preparer.idle.sweep() == 1
        assert _gis(node) == [] and node.store.load().idle == {} and _event(node, "expired") == 1
        assert not node.nvml.mig_mode(0).current  # the last GI went: MIG off again on Hopper
        # An expired one is not reused either (it goes at the next pass, or is displaced).
        second = _claim(api, 2, "gpu-0-mig-1g10gb-19-3")
        _prepare(node, second)
        _unprepare(node, second)
        now[0] += 31
        third = _claim(api, 3, "gpu-0-mig-1g10gb-19-3")
        _prepare(node, third)
        assert _event(node, "reused") == 0 and _event(node, "displaced") == 1
    finally:
        node.preparer.close()


def test_a_running_process_means_no_keep(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api)
    try:
        ref = _claim(api, 1, ONE_G_AT_3)
        _prepare(node, ref)
        [dev] = node.store.get_claim(ref.uid).devices  # type: ignore[union-attr]
        assert dev.gi_id is not None and dev.ci_id is not None
        node.admin.add_process(0, dev.gi_id, dev.ci_id, pid=4242)
        # Destroyed as without the feature: the process keeps it IN_USE, kubelet retries.
        error = node.preparer.unprepare([ref])[ref.uid]
        assert error is not None and "IN_USE" in error
        assert node.store.load().idle == {} and _event(node, "not_kept") == 1
        assert node.store.get_claim(ref.uid) is not None
    finally:
        node.preparer.close()


@pytest.mark.parametrize("across", [False, True])
def test_reuse_across_namespaces_only_when_opted_in(tmp_path: Path, across: bool) -> None:
    api = FakeApi()
    node = _node(tmp_path, api, IdlePolicy(30.0, across_namespaces=across))
    try:
        first = _claim(api, 1, ONE_G_AT_3, namespace="team-a")
        _prepare(node, first)
        _unprepare(node, first)
        other = _claim(api, 2, ONE_G_AT_3, namespace="team-b")
        _prepare(node, other)
        assert node.mig_calls()[GI_CREATE] == (1 if across else 2)
        assert _event(node, "reused") == (1 if across else 0)
        assert _event(node, "displaced") == (0 if across else 1)
    finally:
        node.preparer.close()


def test_off_by_default_destroys_at_unprepare(tmp_path: Path) -> None:
    api = FakeApi()
    node = _node(tmp_path, api, None)
    try:
        ref = _claim(api, 1, ONE_G_AT_3)
        _prepare(node, ref)
        _unprepare(node, ref)
        assert _gis(node) == [] and node.store.load().idle == {}
    finally:
        node.preparer.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, IdlePolicy()),
        ({"FLEXMIG_IDLE_GRACE_PERIOD": "45"}, IdlePolicy(45.0)),
        (
            {"FLEXMIG_IDLE_GRACE_PERIOD": "5", "FLEXMIG_IDLE_REUSE_ACROSS_NAMESPACES": "True"},
            IdlePolicy(5.0, across_namespaces=True),
        ),
        ({"FLEXMIG_IDLE_GRACE_PERIOD": "-1"}, "--idle-grace-period"),
        ({"FLEXMIG_IDLE_GRACE_PERIOD": "3601"}, "--idle-grace-period"),
        ({"FLEXMIG_IDLE_GRACE_PERIOD": "nan"}, "--idle-grace-period"),
        ({"FLEXMIG_IDLE_REUSE_ACROSS_NAMESPACES": "yes"}, "--idle-reuse-across-namespaces"),
    ],
)
def test_idle_flags(tmp_path: Path, env: dict[str, str], expected: IdlePolicy | str) -> None:
    boot = tmp_path / "boot"
    boot.write_text("b\n")
    sim = tmp_path / "sim.json"
    sim.write_text("{}")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--node-name", "n", "--boot-id-path", str(boot), "--nvml", f"sim:{sim}"])
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            load_config(args, env=env)
    else:
        assert load_config(args, env=env).idle == expected
