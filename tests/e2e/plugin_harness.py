"""Run `flexmig kubeletplugin` as a separate process on the NVML simulator and drive it like kubelet.

- `NodeDir`: a node's private directories (short paths under /tmp: unix sockets are limited to 107
  bytes), simulator state, boot-ID file and kubeconfig.
- `PluginProcess`: starts `python -m flexmig.cli kubeletplugin ...`, waits until it is ready, reads the
  metrics port from its JSON log, and can be stopped gracefully or killed with SIGKILL.
- `Kubelet`: the kubelet stand-in over the real unix sockets: registration handshake
  (GetInfo + NotifyRegistrationStatus), NodePrepareResources / NodeUnprepareResources (v1), health stream.
- `ClaimFactory`: creates what the allocator and the API server would have for a pod: a ResourceClaim
  whose `status.allocation` names our devices (written through the status subresource, acting as the
  allocator) and a pod bound to the node that reserves it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from api.gen.dra_health_v1 import api_pb2 as h1_pb2
from api.gen.dra_health_v1 import api_pb2_grpc as h1_grpc
from api.gen.dra_v1 import api_pb2 as dra_pb2
from api.gen.dra_v1 import api_pb2_grpc as dra_grpc
from api.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from api.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state

from .cluster import wait_until
from .k8sobjects import heartbeat_node

REPO = Path(__file__).resolve().parents[2]
DEVICE_CLASS = "mig.gpu.flexmig.dev"


@dataclass
class NodeDir:
    node: str
    root: Path
    kubeconfig: Path

    @classmethod
    def create(cls, node: str, kubeconfig: Path, gpus: Sequence[SimGpuSpec]) -> NodeDir:
        root = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))
        nd = cls(node, root, kubeconfig)
        for sub in ("reg", "plugins", "cdi", "state"):
            (root / sub).mkdir()
        init_sim_state(nd.sim_state, list(gpus))
        nd.set_boot_id(str(uuid.uuid4()))
        return nd

    @property
    def sim_state(self) -> Path:
        return self.root / "sim.json"

    @property
    def boot_id_file(self) -> Path:
        return self.root / "boot_id"

    @property
    def checkpoint(self) -> Path:
        return self.root / "state" / "checkpoint.json"

    @property
    def marker(self) -> Path:
        return self.root / "state" / "crashpoint-reached"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def registration_socket(self) -> Path:
        return self.root / "reg" / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.root / "plugins" / DRIVER_NAME / "dra.sock"

    def set_boot_id(self, boot_id: str) -> None:
        self.boot_id_file.write_text(boot_id + "\n")

    def admin(self) -> SimAdmin:
        return SimAdmin(self.sim_state)

    def argv(self, extra: Sequence[str] = ()) -> list[str]:
        return [
            sys.executable,
            "-m",
            "flexmig.cli",
            "--log-format",
            "json",
            "kubeletplugin",
            "--node-name",
            self.node,
            "--registry-dir",
            str(self.root / "reg"),
            "--plugins-dir",
            str(self.root / "plugins"),
            "--cdi-dir",
            str(self.cdi_dir),
            "--checkpoint-path",
            str(self.checkpoint),
            "--boot-id-path",
            str(self.boot_id_file),
            "--nvml",
            f"sim:{self.sim_state}",
            "--kubeconfig",
            str(self.kubeconfig),
            "--operating-mode",
            "mig",
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            "0",
            *extra,
        ]

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class PluginProcess:
    def __init__(
        self, nd: NodeDir, *, env: Mapping[str, str] | None = None, extra: Sequence[str] = ()
    ) -> None:
        self.nd = nd
        self.log_path = nd.root / f"plugin-{time.monotonic_ns()}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEXMIG_CRASHPOINT")}
        environ.update({"PYTHONPATH": str(REPO), **(env or {})})
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            nd.argv(extra), stdout=self._log, stderr=subprocess.STDOUT, env=environ, cwd=str(REPO)
        )
        self.metrics_port: int | None = None

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
        return out

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_event(self, event: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for item in self.events():
                if item.get("event") == event:
                    return item
            if self.proc.poll() is not None:
                raise AssertionError(f"plugin exited ({self.proc.returncode}):\n{self.log_text()[-4000:]}")
            time.sleep(0.05)
        raise AssertionError(f"plugin never logged {event!r}:\n{self.log_text()[-4000:]}")

    def wait_ready(self, timeout_s: float = 60.0) -> PluginProcess:
        self.metrics_port = int(self.wait_event("metrics server listening", timeout_s)["port"])
        self.wait_event("kubelet plugin ready", timeout_s)
        return self

    def metrics(self) -> str:
        assert self.metrics_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()

    def stop(self, timeout_s: float = 20.0) -> int:
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM (a graceful shutdown, as kubelet does it), SIGKILL after `timeout_s`; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


class Kubelet:
    """kubelet's side of the plugin protocol over the real unix sockets."""

    def __init__(self, nd: NodeDir) -> None:
        self.nd = nd
        self._reg = grpc.insecure_channel(f"unix:{nd.registration_socket}")
        self._dra = grpc.insecure_channel(f"unix:{nd.dra_socket}")
        self.registration = reg_grpc.RegistrationStub(self._reg)
        self.dra = dra_grpc.DRAPluginStub(self._dra)
        self.health = h1_grpc.DRAResourceHealthStub(self._dra)

    def close(self) -> None:
        self._reg.close()
        self._dra.close()

    def register(self) -> reg_pb2.PluginInfo:
        info = self.registration.GetInfo(reg_pb2.InfoRequest(), timeout=10)
        self.registration.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=True), timeout=10
        )
        return info

    @staticmethod
    def _claims(claims: Sequence[Mapping[str, str]]) -> list[dra_pb2.Claim]:
        return [dra_pb2.Claim(namespace=c["namespace"], uid=c["uid"], name=c["name"]) for c in claims]

    def prepare(
        self, claims: Sequence[Mapping[str, str]], timeout_s: float = 45.0
    ) -> dict[str, dra_pb2.NodePrepareResourceResponse]:
        resp = self.dra.NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=self._claims(claims)), timeout=timeout_s
        )
        return dict(resp.claims)

    def unprepare(self, claims: Sequence[Mapping[str, str]], timeout_s: float = 45.0) -> dict[str, str]:
        resp = self.dra.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims)), timeout=timeout_s
        )
        return {uid: r.error for uid, r in resp.claims.items()}

    def watch_health(self) -> Any:
        return self.health.NodeWatchResources(h1_pb2.NodeWatchResourcesRequest(), timeout=60)


class ClaimFactory:
    """Claims allocated to devices of one node, plus pods on that node that reserve them."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        self.api_client = api_client
        self.resource = k8s.ResourceV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.namespace = namespace

    def create(
        self,
        name: str,
        node: str,
        devices: Sequence[str],
        *,
        pool: str | None = None,
        driver: str = DRIVER_NAME,
        containers: int = 1,
        device_class: str = DEVICE_CLASS,
        result_fields: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, str]:
        """Claim `name` with request `gpu` (count = len(devices)) allocated to `devices`, and pod `name`.

        `result_fields[i]` is merged into the i-th allocation result (e.g. `shareID`, `consumedCapacity`
        of a shared device).
        """
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": len(devices)}}
                    ]
                }
            },
        }
        created = self.resource.create_namespaced_resource_claim(self.namespace, claim)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeName": node,
                "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": f"c{i}",
                        "image": "registry.invalid/none",
                        "resources": {"claims": [{"name": "mig"}]},
                    }
                    for i in range(containers)
                ],
            },
        }
        pod_obj = self.core.create_namespaced_pod(self.namespace, pod)
        status = {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": driver,
                                "pool": pool or node,
                                "device": d,
                                **(result_fields[i] if result_fields else {}),
                            }
                            for i, d in enumerate(devices)
                        ]
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    },
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": pod_obj.metadata.uid}],
            }
        }
        self.resource.patch_namespaced_resource_claim_status(name, self.namespace, status)
        return {"namespace": self.namespace, "name": name, "uid": str(created.metadata.uid)}

    def claim(self, name: str) -> dict[str, Any]:
        obj = self.resource.read_namespaced_resource_claim(name, self.namespace)
        data: dict[str, Any] = self.api_client.sanitize_for_serialization(obj)
        return data

    def pod(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = self.api_client.sanitize_for_serialization(
            self.core.read_namespaced_pod(name, self.namespace)
        )
        return data

    def delete(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            self.resource.delete_namespaced_resource_claim(name, self.namespace)


def ensure_device_class(api_client: Any) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    }
    try:
        k8s.ResourceV1Api(api_client).create_device_class(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


@contextlib.contextmanager
def heartbeats(api_client: Any, nodes: Callable[[], Sequence[str]], every_s: float = 10.0) -> Iterator[None]:
    """Keep nodes Ready (no kubelet runs) so the node-lifecycle controller never evicts test pods."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            for node in nodes():
                with contextlib.suppress(Exception):
                    heartbeat_node(api_client, node)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)


def node_slices(api_client: Any, node: str) -> list[dict[str, Any]]:
    items = (
        k8s.ResourceV1Api(api_client)
        .list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={DRIVER_NAME}")
        .items
    )
    return [api_client.sanitize_for_serialization(i) for i in items]


def wait_slices(
    api_client: Any, node: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30
) -> list[dict[str, Any]]:
    found: list[list[dict[str, Any]]] = []

    def complete(slices: list[dict[str, Any]]) -> bool:
        # The publisher writes slices one by one: a reader can see a partial pool, as the scheduler
        # can (which ignores it until resourceSliceCount slices of one generation exist).
        pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
        return len(pools) == 1 and next(iter(pools))[1] == len(slices)

    def check() -> bool:
        found[:] = [node_slices(api_client, node)]
        return bool(found[0]) and complete(found[0]) and predicate(found[0])

    wait_until(check, timeout_s, f"ResourceSlices of {node}")
    return found[0]


def instances(nd: NodeDir) -> list[tuple[int, int, int, int, tuple[int, ...]]]:
    """(gpu, profile id, start, size, ci ids) for every GI on the node's simulated GPUs."""
    snap = nd.admin().snapshot()
    return sorted(
        (g.index, gi.profile_id, gi.start, gi.size, tuple(ci.ci_id for ci in gi.compute_instances))
        for g in snap.gpus
        for gi in g.gpu_instances
    )


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> str:
    """The text of http://host:port/metrics: a plugin's node port (31992 in the chart) or the controller's (31993)."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as r:
        return str(r.read().decode())


def metric_samples(text: str, name: str) -> list[dict[str, str]]:
    """Labels of each sample of metric `name` with a non-zero value (an info gauge: one per instance)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.value != 0
    ]
