"""TEST CODE: a kubelet stand-in for one simulated node of the e2e tests. It is not a kubelet.

The e2e environment has a real control plane but no kubelet and no container runtime. This class does
the part of kubelet's job flexmig relies on, in kubelet's order and with kubelet's identity
(`system:node:<name>`, so the Node authorizer and NodeRestriction judge every request as they would
judge kubelet's):

- registers the Node object (labels, capacity, Ready) and heartbeats it (status + node Lease);
- at start, deletes the node's ResourceSlices, as kubelet does when it starts; the plugin republishes
  them when it (re)registers;
- watches the plugin registry directory: a new registration socket gets `GetInfo` and
  `NotifyRegistrationStatus` (the `Kubelet` gRPC client of plugin_harness.py);
- watches the pods bound to the node (`spec.nodeName`) and hands them to a `PodWorker`
  (kubelet_pods.py), which prepares their claims, marks them Running and, when they are deleted,
  unprepares and removes them.

Everything runs in background threads; `stop()` ends them all (the watch is cut, not waited out).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from api.constants import DRIVER_NAME
from api.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from controller.kube.rest import request

from .k8sobjects import create_ready_node, heartbeat_node
from .kubelet_pods import BACKOFF_MAX_S, BACKOFF_START_S, Action, PodView, PodWorker
from .plugin_harness import Kubelet, NodeDir

WATCH_TIMEOUT_S = 60


class _Gone(Exception):
    """The watch's resourceVersion was compacted (410): relist."""


@dataclass
class KubeletStandIn:
    """One node's stand-in. `api_client` must authenticate as `system:node:<nd.node>`."""

    api_client: Any
    nd: NodeDir
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] | None = None
    heartbeat_s: float = 10.0
    driver: str = DRIVER_NAME
    errors: list[str] = field(default_factory=list)
    registrations: int = 0
    plugin_info: reg_pb2.PluginInfo | None = None
    pod_workers: int = 1  # pods prepared at once (kubelet_pods.py, `PodWorker.parallel`)

    def __post_init__(self) -> None:
        self.node = self.nd.node
        self._core = k8s.CoreV1Api(self.api_client)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._kubelet: Kubelet | None = None
        self._watch_resp: Any = None
        self.pods = PodWorker(
            self.api_client, self.node, self._plugin, self.driver, parallel=self.pod_workers
        )

    @property
    def actions(self) -> list[Action]:
        return self.pods.actions

    def _plugin(self) -> Kubelet | None:
        with self._lock:
            return self._kubelet

    # --- lifecycle --------------------------------------------------------------------------------

    def start(self) -> KubeletStandIn:
        try:
            create_ready_node(self.api_client, self.node, labels=self.labels, capacity=self.capacity)
        except ApiException as exc:
            if exc.status != 409:  # a restarted stand-in finds its Node
                raise
            heartbeat_node(self.api_client, self.node)
        request(
            self.api_client,
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            query=[("fieldSelector", f"spec.nodeName={self.node}")],
        )
        for name, loop in (
            ("heartbeat", self._heartbeat_loop),
            ("registry", self._registry_loop),
            ("pod-watch", self._watch_loop),
            ("pod-worker", lambda: self.pods.run(self._stop)),
        ):
            t = threading.Thread(
                target=self._guarded(name, loop), name=f"standin-{self.node}-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    def request_stop(self) -> None:
        """Ask every thread to end (returns at once; `stop` also waits)."""
        self._stop.set()
        self.pods.wake()
        resp = self._watch_resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks the watch thread's read now, not at the watch timeout

    def stop(self, timeout_s: float = 15.0) -> None:
        self.request_stop()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        with self._lock:
            if self._kubelet is not None:
                self._kubelet.close()
                self._kubelet = None
        assert not alive, f"stand-in threads did not stop: {alive}"

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _guarded(self, name: str, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except Exception as exc:  # a dead loop would hang tests silently: record it
                self.errors.append(f"{name}: {exc!r}")

        return run

    # --- queries for tests ------------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> PodView | None:
        return self.pods.view(namespace, name)

    def wait_registered(self, timeout_s: float = 60.0, after: int = 0) -> reg_pb2.PluginInfo:
        deadline = time.monotonic() + timeout_s
        while self.registrations <= after or self.plugin_info is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no plugin registered on {self.node} within {timeout_s}s: {self.errors}"
                )
            time.sleep(0.05)
        return self.plugin_info

    # --- node -------------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                heartbeat_node(self.api_client, self.node)
            except Exception as exc:  # the next beat retries; the grace period is ~50s
                self.errors.append(f"heartbeat: {exc!r}")

    def _registry_loop(self) -> None:
        seen: tuple[int, int] | None = None
        sock = self.nd.registration_socket
        while not self._stop.wait(0.1):
            try:
                st = sock.stat()
            except FileNotFoundError:
                continue
            ident = (st.st_ino, st.st_mtime_ns)  # a restarted plugin binds a new socket
            if ident == seen:
                continue
            kubelet = Kubelet(self.nd)
            try:
                info = kubelet.register()
            except grpc.RpcError:
                kubelet.close()
                continue  # not serving yet; try on the next tick
            if info.name != self.driver or info.endpoint != str(self.nd.dra_socket):
                kubelet.close()
                raise AssertionError(f"plugin on {self.node} registered as {info.name} at {info.endpoint}")
            with self._lock:
                old, self._kubelet = self._kubelet, kubelet
                self.plugin_info = info
                self.registrations += 1
            if old is not None:
                old.close()
            seen = ident
            self.pods.wake()  # pods waiting for the plugin can go on

    # --- pod watch --------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        rv = ""
        backoff = BACKOFF_START_S
        selector = f"spec.nodeName={self.node}"
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = request(
                        self.api_client, "GET", "/api/v1/pods", query=[("fieldSelector", selector)]
                    )
                    self.pods.replace(listed.get("items") or [])
                    rv = listed["metadata"]["resourceVersion"]
                rv = self._watch(selector, rv)
                backoff = BACKOFF_START_S
            except Exception as exc:
                if self._stop.is_set():
                    return
                if isinstance(exc, _Gone) or getattr(exc, "status", None) == 410:
                    rv = ""
                    continue
                self.errors.append(f"pod watch: {exc!r}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _watch(self, selector: str, rv: str) -> str:
        resp: Any = self._core.list_pod_for_all_namespaces(
            field_selector=selector,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(10, WATCH_TIMEOUT_S + 15),
        )
        self._watch_resp = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion") or rv
                if kind in ("ADDED", "MODIFIED"):
                    self.pods.update(obj["metadata"]["uid"], obj)
                elif kind == "DELETED":
                    self.pods.update(obj["metadata"]["uid"], None)
        finally:
            self._watch_resp = None
            resp.close()
            resp.release_conn()
        return rv
