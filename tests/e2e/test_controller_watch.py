"""The controller's reflector against a real API server: a too-old resourceVersion (410) relists."""

from __future__ import annotations

import queue
import threading
import time

from kubernetes import client as k8s

from controller.kube.store import Event, Store
from controller.kube.watchcache import Reflector

from .cluster import ControlPlane
from .k8sobjects import create_ready_node


def test_watch_from_a_compacted_version_relists_and_converges(control_plane: ControlPlane) -> None:
    with control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        create_ready_node(api, "watch-node-a")
        events: queue.Queue[Event] = queue.Queue()
        stop = threading.Event()
        reflector = Reflector("nodes", core.list_node, events, stop)
        reflector._list()  # the initial LIST, as run() would do
        store = Store()
        store.apply(events.get_nowait())
        assert "watch-node-a" in store.objects
        # While "disconnected", a node goes away and another appears; the resume point is so old that
        # the server no longer has it, which it answers with 410 Gone.
        core.delete_node("watch-node-a")
        create_ready_node(api, "watch-node-b")
        reflector.resource_version = "1"
        reflector.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                "watch-node-b" in store.objects and "watch-node-a" not in store.objects
            ):
                try:
                    store.apply(events.get(timeout=0.5))
                except queue.Empty:
                    continue
            assert reflector.relists >= 2, "the 410 must have caused a relist"
            assert "watch-node-b" in store.objects and "watch-node-a" not in store.objects
        finally:
            stop.set()
            core.delete_node("watch-node-b")
