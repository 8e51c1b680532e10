"""End-to-end: HAMi-style pods through the compatibility shim (issue 5's "done when", issue 6 scenario 3).

The chart is installed with its webhook on (served by the controller, a local process, at
`webhook.url`), into a pool of one MIG node (A100-40GB x2) and one hami-core node (A100-40GB x2). The
pods are written exactly as a HAMi user writes them: `nvidia.com/gpu` + `nvidia.com/gpumem`, no claims,
no gate. Everything after that is flexmig: the webhook's rewrite, the controller's allocation, the
plugin's prepare through the simulated NVML, the kubelet stand-in running the pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.constants import (
    ALLOCATION_GATE,
    ANNOTATION_MIG_ALLOCATIONS,
    ANNOTATION_VGPU_MODE,
    DRIVER_NAME,
    DeviceKind,
    parse_device_name,
)
from controller.claims.quantity import parse_quantity
from controller.kube.rest import request
from driver.cdi import spec_file_name
from driver.migannotation import decode_mig_allocations

from .cluster import ControlPlane, wait_until
from .objects import UNPULLABLE_IMAGE
from .plugin_harness import metric_samples
from .scenario import SCENARIO_LABEL, NodeSpec, Scenario, ScenarioOptions, SimNode, run_for_module

pytestmark = pytest.mark.e2e
NODE_INFO = "hami_mig_device_info"
CLUSTER_INFO = "hami_node_gpu_mig_instance_info"
GUIDE_MEMORY_MIB = 8000
# The allowlist the chart ships for the A100-40GB (the user guide's).
A100_ALLOWED = {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}


@pytest.fixture(scope="module")
def sc(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Scenario]:
    nodes = [
        NodeSpec("shim-mig", ("A100-40GB",) * 2, mode="mig"),
        # HAMi-core's library is there before the plugin starts, so the enforcing path - library mounted
        # and preloaded - is the one exercised (without it, shares are refused by default).
        NodeSpec("shim-hami", ("A100-40GB",) * 2, mode="hami-core", hami_core_library=True),
    ]
    s = Scenario(control_plane, nodes, ScenarioOptions(webhook=True))
    yield from run_for_module(s, request, ready=lambda sc: sc.wait_webhook())


def node(sc: Scenario, mode: str) -> SimNode:
    return next(n for n in sc.nodes.values() if n.spec.mode == mode)


def guide_pod(sc: Scenario, name: str, *, mode: str | None, on: SimNode | None = None) -> dict[str, Any]:
    """The user guide's example: two GPUs, 8000 MiB each, optionally nvidia.com/vgpu-mode."""
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": str(GUIDE_MEMORY_MIB)}
    selector = {SCENARIO_LABEL: sc.suffix, **({"kubernetes.io/hostname": on.name} if on else {})}
    meta: dict[str, Any] = {"name": name}
    if mode:
        meta["annotations"] = {ANNOTATION_VGPU_MODE: mode}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "automountServiceAccountToken": False,
            "nodeSelector": selector,
            "containers": [{"name": "main", "image": UNPULLABLE_IMAGE, "resources": {"limits": limits}}],
        },
    }


def results(sc: Scenario, pod: dict[str, Any]) -> list[dict[str, Any]]:
    [claim] = sc.claims_of(pod)
    out: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return out


def assert_rewritten(created: dict[str, Any]) -> None:
    """What the webhook did to the pod as the API server stored it."""
    spec = created["spec"]
    [container] = spec["containers"]
    resources = container.get("resources") or {}
    assert not [
        r for part in ("limits", "requests") for r in resources.get(part) or {} if r.startswith("nvidia.com/")
    ]
    [pod_claim] = spec["resourceClaims"]
    assert resources["claims"] == [{"name": pod_claim["name"]}]
    assert pod_claim["resourceClaimTemplateName"].startswith("flexmig-")
    assert {"name": ALLOCATION_GATE} in spec["schedulingGates"]


def test_guide_pod_in_mig_mode_gets_two_instances_and_gives_them_back(sc: Scenario) -> None:
    ns = sc.test_namespace("shim-guide")
    mig = node(sc, "mig")
    created = sc.create(ns, "pods", guide_pod(sc, "guide", mode="mig"))
    assert_rewritten(created)
    pod = sc.wait_running(ns, "guide")
    assert pod["spec"]["nodeName"] == mig.name

    # Two realised MIG instances of an allowed profile with >= 8000 MiB, on non-overlapping placements.
    found = results(sc, pod)
    assert len(found) == 2 and {parse_device_name(r["device"]).kind for r in found} == {DeviceKind.MIG}
    gis = mig.instances()
    assert len(gis) == 2, gis
    used: set[tuple[int, int]] = set()
    for gpu, _profile_id, start, size, cis in gis:
        assert len(cis) == 1
        cells = {(gpu, k) for k in range(start, start + size)}
        assert not cells & used, f"overlapping placements: {gis}"
        used |= cells

    # The mirror annotation (HAMi's format) names both, with their realised identities.
    def mirrored() -> list[Any]:
        current = request(sc.api, "GET", f"/api/v1/namespaces/{ns}/pods/guide")
        raw = (current["metadata"].get("annotations") or {}).get(ANNOTATION_MIG_ALLOCATIONS)
        return decode_mig_allocations(raw) if raw else []

    wait_until(
        lambda: len(mirrored()) == 2 and all(r.mig_uuid for r in mirrored()), 30, "the mirror annotation"
    )
    records = mirrored()
    assert {r.profile for r in records} <= A100_ALLOWED
    profiles = {r.profile for r in records}
    memory = {p: int(p.split(".")[1].removesuffix("gb")) * 1024 for p in profiles}
    assert all(m >= GUIDE_MEMORY_MIB for m in memory.values()), profiles
    mig_uuids = {r.mig_uuid for r in records}

    # Both metrics ports show both instances with the user guide's labels.
    rows = [r for r in metric_samples(mig.metrics(), NODE_INFO) if r["pod"] == "guide"]
    assert {r["mig_uuid"] for r in rows} == mig_uuids and all(r["namespace"] == ns for r in rows)

    def cluster_rows() -> list[dict[str, str]]:
        assert sc.controller is not None
        return [
            r for r in metric_samples(sc.controller.metrics(), CLUSTER_INFO) if r["mig_uuid"] in mig_uuids
        ]

    wait_until(lambda: len(cluster_rows()) == 2, 30, "the controller's metrics to show both instances")
    assert {r["node"] for r in cluster_rows()} == {mig.name}

    sc.delete_pod(ns, "guide")
    assert mig.instances() == []
    assert not [r for r in metric_samples(mig.metrics(), NODE_INFO) if r["pod"] == "guide"]
    wait_until(lambda: not cluster_rows(), 30, "the controller's metrics to drop both instances")


def _shared_env(hami: SimNode, claim_uid: str) -> list[str]:
    spec = json.loads((Path(hami.nd.cdi_dir) / spec_file_name(claim_uid)).read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"]["env"]] + list(
        spec.get("containerEdits", {}).get("env") or ()
    )


def _check_on_hami_core(sc: Scenario, hami: SimNode, pod: dict[str, Any]) -> None:
    found = results(sc, pod)
    assert len(found) == 2
    gpus = set()
    for r in found:
        name = parse_device_name(r["device"])
        assert name.kind is DeviceKind.SHARED and r.get("shareID"), r
        assert parse_quantity(r["consumedCapacity"]["memory"]) == GUIDE_MEMORY_MIB * 2**20
        gpus.add(name.gpu_index)
    assert len(gpus) == 2, "HAMi's gpu: 2 means two different GPUs"
    assert hami.instances() == []  # shares never create MIG instances
    [claim] = sc.claims_of(pod)
    env = _shared_env(hami, claim["metadata"]["uid"])
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8000m" in env and "CUDA_DEVICE_MEMORY_LIMIT_1=8000m" in env, env


def test_guide_pod_without_mode_runs_on_either_kind_of_node(sc: Scenario) -> None:
    ns = sc.test_namespace("shim-either")
    mig, hami = node(sc, "mig"), node(sc, "hami-core")

    # Unpinned: the controller picks (an exact share strands no memory, so hami-core wins while it has room).
    sc.create(ns, "pods", guide_pod(sc, "free", mode=None))
    pod = sc.wait_running(ns, "free")
    where = pod["spec"]["nodeName"]
    assert where in (mig.name, hami.name)
    if where == hami.name:
        _check_on_hami_core(sc, hami, pod)
    else:
        assert len(mig.instances()) == 2

    # The same pod runs on each kind of node when only that one is allowed.
    sc.create(ns, "pods", guide_pod(sc, "on-mig", mode=None, on=mig))
    on_mig = sc.wait_running(ns, "on-mig")
    assert {parse_device_name(r["device"]).kind for r in results(sc, on_mig)} == {DeviceKind.MIG}
    sc.create(ns, "pods", guide_pod(sc, "on-hami", mode=None, on=hami))
    _check_on_hami_core(sc, hami, sc.wait_running(ns, "on-hami"))

    for name in ("free", "on-mig", "on-hami"):
        sc.delete_pod(ns, name)
    assert mig.instances() == [] and hami.instances() == []
    assert not list(Path(hami.nd.cdi_dir).glob(f"{DRIVER_NAME}-*.json"))


def test_hami_core_mode_pod_is_limited_by_the_library(sc: Scenario) -> None:
    ns = sc.test_namespace("shim-hami")
    hami = node(sc, "hami-core")
    sc.create(ns, "pods", guide_pod(sc, "shared", mode="hami-core"))
    pod = sc.wait_running(ns, "shared")
    assert pod["spec"]["nodeName"] == hami.name
    _check_on_hami_core(sc, hami, pod)
    [claim] = sc.claims_of(pod)
    spec = json.loads((Path(hami.nd.cdi_dir) / spec_file_name(claim["metadata"]["uid"])).read_text())
    mounts = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"} <= mounts, mounts
    present = metric_samples(hami.metrics(), "flexmig_hami_core_library_present")
    assert present and present[0]["node"] == hami.name

    def allocated_mib() -> float:
        assert sc.controller is not None
        return sum(
            s.value
            for family in text_string_to_metric_families(sc.controller.metrics())
            for s in family.samples
            if s.name == "flexmig_shared_gpu_allocated_memory_mib" and s.labels["node"] == hami.name
        )

    wait_until(lambda: allocated_mib() == 2 * GUIDE_MEMORY_MIB, 30, "the controller's share metrics")
    sc.delete_pod(ns, "shared")
    wait_until(lambda: allocated_mib() == 0, 30, "the controller's share metrics to drop the shares")


def test_bad_legacy_pod_is_denied_by_the_api_server(sc: Scenario) -> None:
    from kubernetes.client.exceptions import ApiException

    ns = sc.test_namespace("shim-deny")
    body = guide_pod(sc, "bad", mode="mig")
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "50"
    with pytest.raises(ApiException) as err:
        sc.create(ns, "pods", body)
    assert err.value.status == 400
    message = str(err.value.body)
    assert 'container \\"main\\"' in message or 'container "main"' in message
    assert "nvidia.com/gpumem-percentage" in message
    assert sc.pods(ns) == []
