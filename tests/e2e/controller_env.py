"""An in-process controller against the real control plane, with hand-published ResourceSlices.

The controller e2e tests run no kubelet plugin: they create Ready nodes (kept Ready by heartbeats),
publish the slices the plugin's own builder (`build_node_slices`) makes for simulated GPUs, create
their DeviceClasses and a namespace, then run a LeaderElector and the Controller in threads.
`controller_env` does all of that and undoes it; `eventually` polls for what the tests wait on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes import client as k8s

from api.constants import DRIVER_NAME
from controller.allocation.loop import Controller
from controller.kube.leader import LeaderElector
from controller.kube.rest import request
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer
from driver.catalog.simulated import simulated_catalog
from driver.catalog.types import GpuCatalog
from kubeletplugin.publish.slices import build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode

from .k8sobjects import create_namespace, create_ready_node, heartbeat_node

T = TypeVar("T")
RESOURCE = "/apis/resource.k8s.io/v1"
HEARTBEAT_S = 5.0  # well inside the node-lifecycle controller's ~50 s grace period


def eventually(fn: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """The first truthy value of `fn()`, polled every `interval_s`; AssertionError naming `what` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def gpu_catalogs(
    model: str, count: int, uuid_prefix: str | None = None, memory_mib: Sequence[int] = ()
) -> list[GpuCatalog]:
    """`count` simulated GPUs of `model` with indexes 0..count-1 and UUIDs `<uuid_prefix><i>` (a fresh
    random prefix when None, so nodes of different tests never share a UUID); `memory_mib[i]`, when
    given, replaces GPU i's memory (shapes no real SKU has, to make packing choices visible)."""
    if memory_mib and len(memory_mib) != count:
        raise ValueError(f"memory_mib has {len(memory_mib)} entries for {count} GPUs")
    prefix = uuid_prefix if uuid_prefix is not None else f"GPU-{uuid.uuid4()}-"
    base = simulated_catalog(model)
    catalogs: list[GpuCatalog] = []
    for i in range(count):
        gpu = dataclasses.replace(base.gpu, index=i, uuid=f"{prefix}{i}")
        if memory_mib:
            gpu = dataclasses.replace(gpu, memory_total_mib=memory_mib[i])
        catalogs.append(dataclasses.replace(base, gpu=gpu))
    return catalogs


def published_slices(
    node: str,
    catalogs: Sequence[GpuCatalog],
    mode: OperatingMode = OperatingMode.MIG,
    *,
    mig_enabled: bool | None = None,
    split_count: int | None = None,
) -> list[dict[str, Any]]:
    """The slice bodies the kubelet plugin publishes for `catalogs` on a node of `mode`: MIG devices
    (and whole GPUs where MIG is off) on a mig node, one `gpu-<i>-shared` per GPU on a hami-core node.
    The GPUs' MIG mode is `mig_enabled`, by default what the node's mode wants (a hami-core node
    publishes no GPU in MIG mode)."""
    config = NodeConfig(node, mode)
    if split_count is not None:
        config = dataclasses.replace(config, device_split_count=split_count)
    mig_on = mode is OperatingMode.MIG if mig_enabled is None else mig_enabled
    mig = {c.gpu.index: mig_on for c in catalogs}
    return [s.body for s in build_node_slices(catalogs, node, 1, config, mig).slices]


def device_class_body(name: str, *conditions: str) -> dict[str, Any]:
    """A DeviceClass selecting this driver's devices that also meet every CEL `condition`."""
    expr = " && ".join([f'device.driver == "{DRIVER_NAME}"', *conditions])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


def type_is(kind: str) -> str:
    """The CEL condition `type == kind` (mig, gpu, hami-core) for `device_class_body`."""
    return f'device.attributes["{DRIVER_NAME}"].type == "{kind}"'


def create(api: Any, ns: str, plural: str, body: dict[str, Any]) -> None:
    """POST `body` to `plural` in `ns`: pods in the core group, anything else in resource.k8s.io."""
    group = "/api/v1" if plural == "pods" else RESOURCE
    request(api, "POST", f"{group}/namespaces/{ns}/{plural}", body)


def bound_node(api: Any, ns: str, pod: str) -> str | None:
    """The node kube-scheduler bound `pod` to, None while it is not bound."""
    core: Any = k8s.CoreV1Api(api)
    name = core.read_namespaced_pod(pod, ns).spec.node_name
    return str(name) if name else None


@dataclasses.dataclass(frozen=True)
class ControllerEnv:
    api: Any
    namespace: str
    controller: Controller
    elector: LeaderElector


@contextlib.contextmanager
def controller_env(
    api: Any,
    namespace: str,
    slices: Mapping[str, Sequence[dict[str, Any]]],
    device_classes: Sequence[dict[str, Any]],
    *,
    taints: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
) -> Iterator[ControllerEnv]:
    """Ready nodes (the keys of `slices`, with their `taints`) publishing `slices`, `device_classes`,
    `namespace`, and a Controller that leads through a LeaderElector in `namespace`; all removed after.
    """
    resource: Any = k8s.ResourceV1Api(api)
    core: Any = k8s.CoreV1Api(api)
    for node, bodies in slices.items():
        create_ready_node(api, node)
        for body in bodies:
            request(api, "POST", f"{RESOURCE}/resourceslices", body)
    for node, node_taints in (taints or {}).items():
        core.patch_node(node, {"spec": {"taints": [dict(t) for t in node_taints]}})
    for body in device_classes:
        request(api, "POST", f"{RESOURCE}/deviceclasses", body)
    create_namespace(api, namespace)
    stop = threading.Event()

    def heartbeats() -> None:
        while not stop.wait(HEARTBEAT_S):
            for node in slices:
                heartbeat_node(api, node)

    threading.Thread(target=heartbeats, daemon=True).start()
    # Short lease timings: a test waits for leadership before it expects anything to be allocated.
    elector = LeaderElector(api, namespace, f"e2e-{namespace}", lease_s=6, renew_deadline_s=4, retry_s=1)
    elector.start()
    controller = Controller(WatchCache.for_api(api), Writer(api), is_leader=elector.is_leader)
    runner = threading.Thread(target=controller.run, args=(stop.is_set,), daemon=True)
    runner.start()
    try:
        yield ControllerEnv(api, namespace, controller, elector)
    finally:
        stop.set()
        elector.stop_event.set()
        runner.join(timeout=10)
        core.delete_namespace(namespace)
        for body in device_classes:
            resource.delete_device_class(body["metadata"]["name"])
        for node in slices:
            resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
            core.delete_node(node)
