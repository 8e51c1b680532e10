"""When each pod of a burst passed each stage, as seen by one watch on its namespace.

Stages, in the order a GPU pod goes through them in controller mode:
- `posted`: the client sent the create (taken before the POST, in this process);
- `admitted`: the POST returned (the webhook, if any, has answered: admission);
- `ungated`: first seen with no scheduling gates (the controller allocated the pod's claims);
- `bound`: first seen with `spec.nodeName` (kube-scheduler bound it);
- `running`: first seen in phase Running (the kubelet stand-in prepared its claims: the plugin's
  NodePrepareResources, CDI spec and status writes).
A pod that is created ungated (scheduler mode, no GPU) is `ungated` when it is admitted.

All times are this process's monotonic clock, so stages are comparable across pods; a watch event is
seen a few ms after the API server stored it, the same delay for every stage.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch

STAGES = ("admitted", "ungated", "bound", "running")


@dataclass
class PodTimes:
    posted: float | None = None
    admitted: float | None = None
    ungated: float | None = None
    bound: float | None = None
    running: float | None = None

    def stage_durations(self) -> dict[str, float] | None:
        """Seconds spent in each stage (admission, gate, scheduling, prepare), None if not Running."""
        t = (self.posted, self.admitted, self.ungated, self.bound, self.running)
        if any(x is None for x in t):
            return None
        p, a, u, b, r = (float(x) for x in t)  # type: ignore[arg-type]
        return {
            "admission": a - p,
            "gate": max(0.0, u - a),
            "scheduling": max(0.0, b - max(u, a)),
            "prepare": max(0.0, r - b),
            "total": r - p,
        }


@dataclass
class Timeline:
    """Records stage times of every pod in `namespace` until `stop()`."""

    api: k8s.ApiClient
    namespace: str
    pods: dict[str, PodTimes] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _watch: watch.Watch | None = None

    def start(self) -> Timeline:
        self._thread = threading.Thread(target=self._run, name="e2e-bench-timeline", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(10)

    def times(self, name: str) -> PodTimes:
        with self._lock:
            return self.pods.setdefault(name, PodTimes())

    def mark(self, name: str, stage: str, at: float | None = None) -> None:
        """Set `stage` of pod `name` to `at` (now) unless it is already set: the first sighting counts."""
        now = time.monotonic() if at is None else at
        with self._lock:
            times = self.pods.setdefault(name, PodTimes())
            if getattr(times, stage) is None:
                setattr(times, stage, now)

    def running_count(self) -> int:
        with self._lock:
            return sum(1 for t in self.pods.values() if t.running is not None)

    def _observe(self, pod: Any) -> None:
        name = pod.metadata.name
        if not pod.spec.scheduling_gates:
            self.mark(name, "ungated")
        if pod.spec.node_name:
            self.mark(name, "bound")
        if pod.status is not None and pod.status.phase == "Running":
            self.mark(name, "running")

    def _run(self) -> None:
        core = k8s.CoreV1Api(self.api)
        version = ""
        while not self._stop.is_set():
            self._watch = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                kwargs: dict[str, Any] = {"timeout_seconds": 60, "_request_timeout": 75}
                if version:
                    kwargs["resource_version"] = version
                for event in self._watch.stream(core.list_namespaced_pod, self.namespace, **kwargs):  # type: ignore[no-untyped-call]
                    obj = event["object"]
                    version = obj.metadata.resource_version or version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._observe(obj)
                    if self._stop.is_set():
                        return
            except Exception as exc:  # a cut watch restarts from a fresh list; stages already seen stay
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                version = ""
                time.sleep(0.2)
