"""`hami_mig_device_info` with HAMi's labels exactly (and its constant zone label); build info."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeletplugin.agent.metrics import NodeMetrics, RealizedInstance


def _labels(metrics: NodeMetrics, name: str) -> list[dict[str, str]]:
    text = generate_latest(metrics.registry).decode()
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_mig_device_info_labels_are_hamis() -> None:
    m = NodeMetrics()
    m.set_realized_instances([RealizedInstance("ns", "p", "c", 0, "GPU-1", "MIG-1", "1g.10gb", 9, 0)])
    assert _labels(m, "hami_mig_device_info") == [
        {
            "namespace": "ns",
            "pod": "p",
            "container": "c",
            "vdevice_index": "0",
            "device_uuid": "GPU-1",
            "mig_uuid": "MIG-1",
            "profile": "1g.10gb",
            "gpu_instance_id": "9",
            "compute_instance_id": "0",
            "zone": "vGPU",
        }
    ]


def test_build_info() -> None:
    [labels] = _labels(NodeMetrics(), "flexmig_build_info")
    assert labels["component"] == "kubelet-plugin" and set(labels) == {
        "version",
        "revision",
        "python_version",
        "component",
    }
