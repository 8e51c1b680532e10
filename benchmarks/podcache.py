"""Memory the controller's watch cache keeps per pod, before and after the pod projection.

Builds realistic pods as the API server sends them (managedFields of three managers, env, volumes,
probes, status with conditions and container statuses, kubectl's last-applied annotation), feeds them to
`Reflector` + `Store` from controller/kube/watchcache.py through the LIST path (one JSON body) and the
WATCH path (one JSON line per ADDED event), and measures with tracemalloc what stays allocated once the
decoded response is gone: bytes retained per pod, for ordinary (non-GPU) pods and for pods with
flexmig claims. "before" stores pods whole (no projection), "after" uses the cache's `PROJECTIONS`.

    python3 -m benchmarks.podcache [--pods 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from api.constants import ALLOCATION_GATE
from controller.kube.podview import PROJECTIONS, Projection
from controller.kube.store import Event, Store
from controller.kube.watchcache import Reflector

Obj = dict[str, Any]
# The controller's 1 Gi memory limit (deployments/helm/flexmig/values.yaml) and the target of issue 21.
LIMIT_BYTES = 1 << 30
TARGET_BYTES = 2048


def _managed_fields(i: int) -> list[Obj]:
    """Three managers' field sets, shaped like a Deployment-owned pod's (kube-controller-manager,
    kubelet's status, kubectl's annotate); these are most of a pod's bytes."""
    spec_fields: Obj = {
        f"f:{k}": {}
        for k in (
            "dnsPolicy",
            "enableServiceLinks",
            "restartPolicy",
            "schedulerName",
            "securityContext",
            "terminationGracePeriodSeconds",
        )
    }
    container: Obj = {
        f"f:{k}": {}
        for k in ("image", "imagePullPolicy", "name", "terminationMessagePath", "terminationMessagePolicy")
    }
    container["f:env"] = {
        f'k:{{"name":"ENV_{j}"}}': {".": {}, "f:name": {}, "f:value": {}} for j in range(12)
    }
    container["f:ports"] = {'k:{"containerPort":8080,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}}
    container["f:resources"] = {"f:limits": {"f:cpu": {}, "f:memory": {}}, "f:requests": {"f:cpu": {}}}
    spec_fields["f:containers"] = {'k:{"name":"app"}': container, 'k:{"name":"sidecar"}': container}
    spec_fields["f:volumes"] = {f'k:{{"name":"vol-{j}"}}': {".": {}, "f:configMap": {}} for j in range(4)}
    status_fields: Obj = {
        "f:conditions": {
            f'k:{{"type":"{t}"}}': {".": {}, "f:lastProbeTime": {}, "f:status": {}, "f:type": {}}
            for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")
        },
        "f:containerStatuses": {},
        "f:hostIP": {},
        "f:phase": {},
        "f:podIP": {},
        "f:startTime": {},
    }
    base = {"apiVersion": "v1", "fieldsType": "FieldsV1", "time": "2026-01-02T03:04:05Z"}
    return [
        {
            **base,
            "manager": "kube-controller-manager",
            "operation": "Update",
            "fieldsV1": {
                "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                "f:spec": spec_fields,
            },
        },
        {
            **base,
            "manager": "kubelet",
            "operation": "Update",
            "subresource": "status",
            "fieldsV1": {"f:status": status_fields},
        },
        {
            **base,
            "manager": "kubectl-annotate",
            "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:team.example.com/note-{i % 3}": {}}}},
        },
    ]


def _container(name: str, i: int) -> Obj:
    return {
        "name": name,
        "image": f"registry.example.com/team/{name}:1.{i % 7}.0",
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": f"ENV_{j}", "value": f"value-{j}-{i}"} for j in range(12)],
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "100m"}},
        "volumeMounts": [{"name": f"vol-{j}", "mountPath": f"/etc/vol-{j}"} for j in range(4)],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def ordinary_pod(i: int) -> Obj:
    """A running Deployment pod with no GPU, as a LIST or WATCH returns it."""
    name = f"web-7d9f8b6c5-{i:06d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": "web-7d9f8b6c5-",
            "namespace": f"team-{i % 50}",
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100_000 + i),
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"},
            "annotations": {
                f"team.example.com/note-{i % 3}": "owned by the web team",
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {"spec": {"containers": [_container("app", 0)]}}
                ),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d9f8b6c5",
                    "uid": "11111111-0000-4000-8000-000000000000",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": _managed_fields(i),
        },
        "spec": {
            "containers": [_container("app", i), _container("sidecar", i)],
            "volumes": [{"name": f"vol-{j}", "configMap": {"name": f"cm-{j}"}} for j in range(4)],
            "nodeName": f"node-{i % 500:04d}",
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
            ],
            "priority": 0,
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": f"10.1.{i % 250}.{i % 200}",
            "startTime": "2026-01-02T03:04:06Z",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-01-02T03:04:07Z"}
                for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": n,
                    "ready": True,
                    "restartCount": 0,
                    "image": f"registry.example.com/team/{n}:1.0.0",
                    "imageID": "registry.example.com/team/app@sha256:" + "ab" * 32,
                    "containerID": "containerd://" + "cd" * 32,
                    "state": {"running": {"startedAt": "2026-01-02T03:04:07Z"}},
                }
                for n in ("app", "sidecar")
            ],
        },
    }


def gpu_pod(i: int, gated: bool = False) -> Obj:
    """An ordinary pod whose app container uses a flexmig claim made from a template."""
    pod = ordinary_pod(i)
    pod["metadata"]["name"] = f"train-{i:06d}"
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "mig-1g"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"train-{i:06d}-gpu-x"}]
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": ALLOCATION_GATE}]
        pod["spec"].pop("nodeName")
    return pod


class _Response:
    """What the kubernetes client returns with _preload_content=False, for a body or a watch stream."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        yield self.data

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def list_fn(pods: list[Obj], resource_version: str = "1") -> Callable[..., _Response]:
    """A LIST returning `pods` and a WATCH sending each as ADDED, one JSON line each."""

    def call(**kwargs: Any) -> _Response:
        if kwargs.get("watch"):
            lines = b"".join(json.dumps({"type": "ADDED", "object": p}).encode() + b"\n" for p in pods)
            return _Response(lines)
        body = {"metadata": {"resourceVersion": resource_version}, "items": pods}
        return _Response(json.dumps(body).encode())

    return call


def fill(pods: list[Obj], projection: Projection | None, path: str) -> Store:
    """Run the reflector's list or watch path over `pods` and apply its events to a store."""
    events: queue.Queue[Event] = queue.Queue()
    reflector = Reflector("pods", list_fn(pods), events, threading.Event(), projection=projection)
    store = Store(None if projection is None else projection.strip)
    if path == "list":
        reflector._list()
    else:
        reflector._watch()
    while not events.empty():
        store.apply(events.get_nowait())
    return store


def retained_per_pod(make: Callable[[int], Obj], n: int, projection: Projection | None, path: str) -> float:
    """Bytes still allocated per pod once the store holds what the reflector gave it."""
    pods = [make(i) for i in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = fill(pods, projection, path)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del store
    return (after - before) / n


def measure(n: int) -> list[tuple[str, str, str, float]]:
    rows = []
    for kind, make in (("ordinary", ordinary_pod), ("flexmig claim", gpu_pod)):
        for path in ("list", "watch"):
            for label, projection in (("before", None), ("after", PROJECTIONS["pods"])):
                rows.append((kind, path, label, retained_per_pod(make, n, projection, path)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args(argv)
    wire = len(json.dumps(ordinary_pod(1)))
    print(f"{args.pods} pods per row; one ordinary pod is {wire} bytes of JSON on the wire")
    print("| pods | path | cache | bytes/pod retained | pods filling 1 GiB |")
    print("|---|---|---|---|---|")
    rows = measure(args.pods)
    for kind, path, label, per_pod in rows:
        fits = f"{LIMIT_BYTES / per_pod:,.0f}" if per_pod >= 1 else "unbounded"
        print(f"| {kind} | {path} | {label} | {per_pod:,.0f} | {fits} |")
    worst = max(b for k, _, label, b in rows if k == "ordinary" and label == "after")
    verdict = "met" if worst < TARGET_BYTES else "MISSED"
    print(f"target < {TARGET_BYTES} bytes per ordinary pod: {verdict} (worst {worst:,.0f})")


if __name__ == "__main__":
    main()
