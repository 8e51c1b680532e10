"""Controller metrics computed from a published snapshot (scrape side only)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.runtime.metrics import ControllerMetrics, Snapshot
from driver.policy.model import GpuRef
from driver.policy.shared import ShareAmount, SharedGpuState


def _samples(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_shared_gpu_usage_and_capacity_per_gpu() -> None:
    metrics = ControllerMetrics()
    busy = SharedGpuState(GpuRef("node-b", 1), ShareAmount(40960, 100, 10), ShareAmount(16000, 30, 2))
    idle = SharedGpuState(GpuRef("node-a", 0), ShareAmount(81920, 100, 4))
    metrics.publish(Snapshot(shared=(busy, idle)))
    got = _samples(metrics)

    def value(name: str, node: str, index: str) -> float:
        return got[(name, (("device_index", index), ("node", node)))]

    assert value("flexmig_shared_gpu_allocated_memory_mib", "node-b", "1") == 16000
    assert value("flexmig_shared_gpu_allocated_cores", "node-b", "1") == 30
    assert value("flexmig_shared_gpu_allocated_shares", "node-b", "1") == 2
    assert value("flexmig_shared_gpu_capacity_memory_mib", "node-b", "1") == 40960
    assert value("flexmig_shared_gpu_capacity_shares", "node-a", "0") == 4
    assert value("flexmig_shared_gpu_allocated_memory_mib", "node-a", "0") == 0


def test_no_shared_gpus_no_samples() -> None:
    metrics = ControllerMetrics()
    metrics.publish(Snapshot())
    assert not [k for k in _samples(metrics) if k[0].startswith("flexmig_shared_gpu_")]


def _instance_row() -> tuple[str, ...]:
    return ("node-a", "GPU-1", "0", "MIG-1", "1g.10gb", "9", "0", "6", "1")


def test_instance_info_has_hamis_labels_and_zone() -> None:
    metrics = ControllerMetrics()
    metrics.publish(Snapshot(instances=(_instance_row(),)))
    [labels] = [dict(k[1]) for k in _samples(metrics) if k[0] == "hami_node_gpu_mig_instance_info"]
    assert labels == {
        "node": "node-a",
        "device_uuid": "GPU-1",
        "device_index": "0",
        "mig_uuid": "MIG-1",
        "profile": "1g.10gb",
        "gpu_instance_id": "9",
        "compute_instance_id": "0",
        "placement_start": "6",
        "placement_size": "1",
        "zone": "vGPU",  # HAMi's constant label
    }


def test_cluster_gauges_only_from_the_leader() -> None:
    metrics = ControllerMetrics()
    metrics.publish(Snapshot(instances=(_instance_row(),), gated={"Fragmented": 2}))
    metrics.set_leader(False)
    names = {k[0] for k in _samples(metrics)}
    assert "hami_node_gpu_mig_instance_info" not in names and "flexmig_gated_pods" not in names
    assert _samples(metrics)[("flexmig_leader", ())] == 0
    metrics.set_leader(True)
    assert _samples(metrics)[("flexmig_gated_pods", (("reason", "Fragmented"),))] == 2


def test_build_info() -> None:
    [labels] = [dict(k[1]) for k in _samples(ControllerMetrics()) if k[0] == "flexmig_build_info"]
    assert labels["component"] == "controller" and labels["version"] and labels["revision"] == "unknown"
