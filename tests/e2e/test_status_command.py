"""`flexmig status` against a real kube-apiserver: published A100 slices, claims allocated by writing
status.allocation directly (no controller runs here), one of them prepared (status.devices data)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from api.constants import DRIVER_NAME
from controller.kube.rest import claim_path, request
from controller.kube.roomstore import KEY, ROOM_STATE_NAME
from driver.catalog.simulated import simulated_catalog
from flexmig.cli import main
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

from .cluster import ControlPlane
from .k8sobjects import create_namespace
from .objects import claim_body, pod_body

pytestmark = pytest.mark.e2e


def _allocate(api: Any, ns: str, name: str, node: str, device: str, status: dict[str, Any]) -> None:
    body = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": node, "device": device}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            **status,
        }
    }
    request(api, "PATCH", claim_path(ns, name, "status"), body, content_type="application/merge-patch+json")


def test_status_draws_the_slice_map(control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> None:
    suffix = uuid.uuid4().hex[:6]
    node, ns = f"status-a100-{suffix}", f"status-{suffix}"
    base = simulated_catalog("A100-40GB")
    catalog = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, index=0, uuid=f"GPU-{suffix}"))
    built = build_node_slices([catalog], node, 1, NodeConfig(node, OperatingMode.MIG), {0: True})
    with control_plane.api_client() as api:
        resource: Any = k8s.ResourceV1Api(api)
        try:
            for s in built.slices:
                request(api, "POST", "/apis/resource.k8s.io/v1/resourceslices", s.body)
            create_namespace(api, ns)
            for name in ("train", "infer"):
                request(
                    api,
                    "POST",
                    f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                    claim_body(name, f"mig.{DRIVER_NAME}"),
                )
            pod = request(
                api,
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                pod_body("trainer", "train", gates=["e2e.flexmig.dev/hold"]),
            )
            big = "gpu-0-mig-3g20gb-9-4"
            _allocate(
                api,
                ns,
                "train",
                node,
                big,
                {
                    "reservedFor": [{"resource": "pods", "name": "trainer", "uid": pod["metadata"]["uid"]}],
                    "devices": [
                        {
                            "driver": DRIVER_NAME,
                            "pool": node,
                            "device": big,
                            "data": {
                                "migUUID": f"MIG-{suffix}",
                                "gpuInstanceID": 2,
                                "computeInstanceID": 0,
                                "parentUUID": f"GPU-{suffix}",
                                "profile": "3g.20gb",
                                "placement": {"start": 4, "size": 4},
                            },
                        }
                    ],
                },
            )
            # Allocated, not reserved by any pod yet: status finds no pod for it.
            _allocate(api, ns, "infer", node, "gpu-0-mig-1g5gb-19-0", {})
            # What a controller holds for a waiting pod (its room state): free in the map, yet kept.
            held = {"pool": node, "device": "gpu-0-mig-2g10gb-14-2"}
            state = {"schema": 1, "nominations": [
                {"pod": f"{ns}/urgent", "uid": "u", "node": node, "victims": [], "devices": [held],
                 "since": 1.0, "allGoneAt": 1.0},
            ], "moves": [], "targets": [], "moved": [], "evictions": [], "moveRefused": [], "preemptionRefused": []}  # fmt: skip
            room = {"metadata": {"name": ROOM_STATE_NAME}, "data": {KEY: json.dumps(state)}}
            request(api, "POST", f"/api/v1/namespaces/{ns}/configmaps", room)

            code = main(
                [
                    "status",
                    "--kubeconfig",
                    str(control_plane.kubeconfig),
                    "--no-color",
                    "--node",
                    node,
                    "--controller-namespace",
                    ns,
                ]
            )
            out, err = capsys.readouterr()
            assert code == 0, err
            print(out)  # shown on failure
            lines = out.splitlines()
            assert lines[0] == f"{node}  GPU 0  A100-40GB (NVIDIA A100-SXM4-40GB)  GPU-{suffix}"
            bar = next(ln for ln in lines if ln.startswith("  ["))
            assert "[1g.5gb " in bar and "[3g.20gb " in bar and "free" in bar
            assert any(
                "4-7  3g.20gb" in ln
                and f"pod {ns}/trainer" in ln
                and f"claim {ns}/train" in ln
                and f"GI 2 CI 0 MIG-{suffix}" in ln
                for ln in lines
            )
            assert any("0  1g.5gb" in ln and "pod ?" in ln and f"claim {ns}/infer" in ln for ln in lines)
            assert "  free: memory slices 1-3 (3/8); compute 4/7 slices used" in lines
            assert "  still fits: 1g.5gb x3, 2g.10gb x1" in lines
            summary = lines.index("1 GPU on 1 node, 2 allocated devices")
            assert lines[summary + 1 :] == [
                "Held for waiting pods (free in the maps above, kept by the controller):",
                f"  {ns}/urgent: preemption on {node}: gpu-0-mig-2g10gb-14-2",
            ]

            # The same as data for scripts (-o json / -o yaml).
            base = [
                "status",
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "--node",
                node,
                "--controller-namespace",
                ns,
            ]
            capsys.readouterr()  # drop the text printed above
            assert main([*base, "-o", "json"]) == 0
            doc = json.loads(capsys.readouterr().out)
            [gpu] = doc["gpus"]
            assert (gpu["node"], gpu["index"], gpu["model"]) == (node, 0, "A100-40GB")
            taken = {(i["profile"], i["start"], i["claim"]) for i in gpu["instances"]}
            assert taken == {("3g.20gb", 4, f"{ns}/train"), ("1g.5gb", 0, f"{ns}/infer")}
            assert {"profile": "2g.10gb", "count": 1} in gpu["fits"]
            assert doc["summary"] == {"gpus": 1, "nodes": 1, "allocatedDevices": 2}
            assert doc["held"] == [
                {
                    "for": f"{ns}/urgent",
                    "why": "preemption",
                    "node": node,
                    "devices": ["gpu-0-mig-2g10gb-14-2"],
                    "note": "",
                }
            ]
            assert main([*base, "-o", "yaml"]) == 0
            assert yaml.safe_load(capsys.readouterr().out) == doc

            # Unfiltered, the node is among the others the session's tests published.
            assert main(["status", "--kubeconfig", str(control_plane.kubeconfig), "--no-color"]) == 0
            assert f"{node}  GPU 0  A100-40GB" in capsys.readouterr().out
        finally:
            k8s.CoreV1Api(api).delete_namespace(ns)
            resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
