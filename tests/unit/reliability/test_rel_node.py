"""Bad input on the node: allocations the plugin cannot prepare as written, instances it did not create,
a tampered HAMi mirror annotation, and a checkpoint it cannot trust. Each prepare refusal is the claim's
error (what kubelet puts in the pod's events), a `prepare failed` log line and a
`flexmig_node_prepare_duration_seconds{result="error"}` sample, and leaves nothing behind: no GPU
instance, no checkpoint entry, no CDI spec, no status written. Rows K1-K12 of docs/reliability.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from sim_node import FakeApi, SimNode, make_node

from api.constants import ANNOTATION_MIG_ALLOCATIONS, DRIVER_NAME
from driver.migannotation import decode_mig_allocations
from driver.nvml.sim import SimGpuSpec
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef

NODE = "n1"
UID = "7d0c5a1e-0000-4c9e-8a59-00000000000a"
OTHER_UID = "7d0c5a1e-0000-4c9e-8a59-00000000000b"


class PodApi(FakeApi):
    """FakeApi whose pods are real objects: annotation writes land on them and are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.annotation_writes: list[tuple[str, str | None]] = []

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        self.annotation_writes.append((key, value))
        annotations = self.pods[(namespace, name)]["metadata"].setdefault("annotations", {})
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB")], api=PodApi())
    yield n
    n.preparer.close()


def allocate(n: SimNode, uid: str, name: str, *devices: str | tuple[str, str], pool: str = NODE) -> ClaimRef:
    """A claim whose status.allocation names `devices` ((request, device) or device for request r<i>)."""
    pairs = [d if isinstance(d, tuple) else (f"r{i}", d) for i, d in enumerate(devices)]
    results = tuple(AllocatedDevice(request, DRIVER_NAME, pool, device) for request, device in pairs)
    n.api.claims[("ns", name)] = ClaimView(
        "ns", name, uid, results, (PodRef("ns", f"pod-{name}", f"pod-{uid}"),)
    )
    return ClaimRef(namespace="ns", uid=uid, name=name)


def instances(n: SimNode) -> list[tuple[int, int, int]]:
    """(profile id, start, size) of every GPU instance on GPU 0."""
    return [(gi.profile_id, gi.start, gi.size) for gi in n.admin.snapshot().gpus[0].gpu_instances]


def errors(n: SimNode) -> float:
    value = n.metrics.registry.get_sample_value(
        "flexmig_node_prepare_duration_seconds_count", {"result": "error"}
    )
    return value or 0.0


def refused(
    n: SimNode, ref: ClaimRef, *fragments: str, before: list[tuple[int, int, int]] | None = None
) -> str:
    """Prepare fails with every fragment in the claim's error and in the log; nothing is left behind."""
    checkpoint_before = n.store.load().claims
    errors_before = errors(n)
    with structlog.testing.capture_logs() as logs:
        result = n.preparer.prepare([ref])[ref.uid]
    assert result.devices == [] and result.error.startswith(f"flexmig: prepare {ref.namespace}/{ref.name}: ")
    for fragment in fragments:
        assert fragment in result.error, (fragment, result.error)
    logged = [e for e in logs if e["log_level"] == "error" and e["event"] == "prepare failed"]
    assert len(logged) == 1 and logged[0]["error"] in result.error and logged[0]["uid"] == ref.uid
    assert errors(n) == errors_before + 1
    assert instances(n) == (before or [])
    assert n.store.load().claims == checkpoint_before
    assert not (n.cdi_dir / f"{DRIVER_NAME}-{ref.uid}.json").exists()
    assert ref.uid not in n.api.status
    return result.error


def test_k1_a_device_that_does_not_exist_is_refused(node: SimNode) -> None:
    refused(
        node,
        allocate(node, UID, "c", "gpu-0-mig-9g99gb-99-0"),
        "devices ['gpu-0-mig-9g99gb-99-0'] are not published by node n1",
    )


def test_k2_a_gpu_the_node_does_not_have_is_refused(node: SimNode) -> None:
    refused(node, allocate(node, UID, "c", "gpu-7"), "devices ['gpu-7'] are not published by node n1")


def test_k3_a_name_that_is_no_device_name_is_refused(node: SimNode) -> None:
    refused(node, allocate(node, UID, "c", "gpu-zero"), "devices ['gpu-zero'] are not published")


def test_k4_overlapping_placements_in_one_claim_are_refused_before_any_instance(node: SimNode) -> None:
    ref = allocate(node, UID, "c", "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-2g10gb-14-0")
    refused(node, ref, "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-2g10gb-14-0", "overlap")


def test_k5_a_placement_overlapping_another_claims_instance_is_refused(node: SimNode) -> None:
    first = allocate(node, OTHER_UID, "held", "gpu-0-mig-3g20gb-9-0")
    assert node.preparer.prepare([first])[OTHER_UID].error == ""
    held = instances(node)
    assert held == [(9, 0, 4)]
    refused(node, allocate(node, UID, "c", "gpu-0-mig-2g10gb-14-2"), "overlap", before=held)
    assert OTHER_UID in node.store.load().claims  # the prepared claim is untouched


def test_k6_one_mig_device_given_to_two_requests_is_refused(node: SimNode) -> None:
    ref = allocate(node, UID, "c", ("a", "gpu-0-mig-1g5gb-19-0"), ("b", "gpu-0-mig-1g5gb-19-0"))
    refused(
        node, ref, "devices ['gpu-0-mig-1g5gb-19-0'] are allocated to more than one request", "['a', 'b']"
    )


def test_k7_a_result_in_another_nodes_pool_is_refused(node: SimNode) -> None:
    ref = allocate(node, UID, "c", "gpu-0-mig-1g5gb-19-0", pool="n2")
    refused(node, ref, "device gpu-0-mig-1g5gb-19-0 in pool 'n2', not this node's pool 'n1'")


def test_k8_an_instance_created_out_of_band_is_left_alone_and_named(node: SimNode) -> None:
    foreign = node.nvml.create_gpu_instance(0, 19, 3)  # someone ran nvidia-smi mig -cgi on the node
    before = instances(node)
    refused(
        node,
        allocate(node, UID, "c", "gpu-0-mig-1g5gb-19-3"),
        f"overlaps GI {foreign.gi_id}",
        "an instance flexmig did not create (left untouched)",
        before=before,
    )


def _pod_with_annotation(n: SimNode, claim: str, annotation: str) -> dict[str, Any]:
    pod = {
        "metadata": {
            "name": f"pod-{claim}",
            "namespace": "ns",
            "annotations": {ANNOTATION_MIG_ALLOCATIONS: annotation},
        },
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    n.api.pods[("ns", f"pod-{claim}")] = pod
    return pod


@pytest.mark.parametrize(
    "tampered",
    [
        # the whole GPU at another placement, as if written by hand
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"7g.40gb","placement":{"start":0,"size":8}}]',
        "not json at all",
    ],
    ids=["other-placement", "garbage"],
)
def test_k9_a_tampered_mirror_annotation_never_changes_what_is_prepared(node: SimNode, tampered: str) -> None:
    pod = _pod_with_annotation(node, "c", tampered)
    ref = allocate(node, UID, "c", ("gpu", "gpu-0-mig-1g5gb-19-3"))
    result = node.preparer.prepare([ref])[UID]
    assert result.error == "" and [d.device_name for d in result.devices] == ["gpu-0-mig-1g5gb-19-3"]
    assert instances(node) == [(19, 3, 1)]  # exactly the claim's status.allocation
    # The mirror is rewritten from what was prepared.
    (record,) = decode_mig_allocations(pod["metadata"]["annotations"][ANNOTATION_MIG_ALLOCATIONS])
    (gi,) = node.admin.snapshot().gpus[0].gpu_instances
    assert (record.profile, record.placement_start, record.placement_size) == ("1g.5gb", 3, 1)
    assert (record.gpu_uuid, record.gpu_instance_id) == (node.nvml.gpu(0).uuid, gi.gi_id)
    assert [k for k, _ in node.api.annotation_writes] == [ANNOTATION_MIG_ALLOCATIONS]


def test_k10_a_tampered_annotation_with_no_mig_device_is_removed(tmp_path: Path) -> None:
    api = PodApi()
    n = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB", mig_enabled=False)], api=api)
    try:
        tampered = '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.5gb","placement":{"start":0,"size":1}}]'
        pod = _pod_with_annotation(n, "c", tampered)
        ref = allocate(n, UID, "c", ("gpu", "gpu-0"))
        assert n.preparer.prepare([ref])[UID].error == ""
        assert instances(n) == []  # a whole GPU: no instance, whatever the annotation said
        assert ANNOTATION_MIG_ALLOCATIONS not in pod["metadata"]["annotations"]
        assert api.annotation_writes == [(ANNOTATION_MIG_ALLOCATIONS, None)]
    finally:
        n.preparer.close()


def test_k11_a_bad_shared_consumed_capacity_is_refused_naming_the_field(tmp_path: Path) -> None:
    n = make_node(tmp_path, NODE, [SimGpuSpec("A100-40GB", mig_enabled=False)], hami_library=True)
    try:
        dev = AllocatedDevice(
            "gpu", DRIVER_NAME, NODE, "gpu-0-shared", "share-1", {"memory": "lots", "cores": "10"}
        )
        n.api.claims[("ns", "c")] = ClaimView("ns", "c", UID, (dev,), ())
        refused(n, ClaimRef(namespace="ns", uid=UID, name="c"), "gpu-0-shared", "memory", "'lots'")
    finally:
        n.preparer.close()
