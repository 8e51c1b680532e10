"""Device health from NVML events, for kubelet's DRAResourceHealth stream.

A background loop (driver.looprunner: it survives any exception with backoff and shows in /healthz)
waits on NVML's event set (XID critical errors, double-bit ECC). An event scoped
to a GPU instance marks the MIG device realised on that GI unhealthy, for as long as that instance
exists (a new prepare creates a fresh one). An event for the whole GPU marks the GPU and every device
on it unhealthy until the plugin restarts, which is when an administrator has looked at the GPU.
XIDs that NVIDIA's own device plugin classifies as application errors (13, 31, 43, 45, 68, 109) say
nothing about the hardware and are ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import structlog

from driver.looprunner import LoopRunner
from driver.nvml.port import Nvml
from driver.nvml.types import HealthEvent, HealthEventKind, NvmlError
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.grpcserver import DeviceHealthState, Health
from kubeletplugin.publish.inventory import Inventory

log = structlog.get_logger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# Each round waits briefly for events, then pauses. Detection latency stays ~1 s (kubelet resends
# health every 10 s anyway), while a backend that implements the wait by polling a shared state (the
# simulator takes its file lock ~50 times a second while waiting) is not kept busy all the time,
# which would slow down every prepare on the node.
_WAIT_MS = 100
_PAUSE_S = 1.0
_ERROR_PAUSE_S = 5.0


class NvmlHealthSource:
    def __init__(
        self,
        nvml: Nvml,
        inventory: Inventory,
        store: CheckpointStore,
        pool: str,
        *,
        clock: Callable[[], float] = time.time,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._inventory = inventory
        self._store = store
        self._pool = pool
        self._clock = clock
        self._cond = threading.Condition()
        self._version = 0
        self._bad_gpus: dict[int, str] = {}
        self._bad_instances: dict[tuple[int, int], str] = {}  # (gpu, gi id) -> message
        self._more = threading.Event()  # set when a round found events: look again without pausing
        self.runner = LoopRunner(
            "health-events",
            self._round,
            interval_s=_PAUSE_S,
            wake=self._more,
            backoff_start_s=_ERROR_PAUSE_S,
            backoff_max_s=60.0,
            on_error=on_error,
        )

    def start(self) -> None:
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
        self.runner.join(5)

    def _round(self) -> None:
        try:
            events = self._nvml.wait_health_events(_WAIT_MS)
        except NvmlError as exc:
            log.error("waiting for NVML health events failed", error=str(exc))
            raise
        for event in events:
            self.record(event)
        if events:
            self._more.set()

    def record(self, event: HealthEvent) -> None:
        if event.kind is HealthEventKind.XID and event.xid in APPLICATION_XIDS:
            log.info("application XID ignored for device health", gpu=event.gpu_index, xid=event.xid)
            return
        what = f"XID {event.xid}" if event.kind is HealthEventKind.XID else event.kind.value
        with self._cond:
            if event.gi_id is None:
                self._bad_gpus[event.gpu_index] = f"GPU {event.gpu_index}: {what}"
            else:
                self._bad_instances[(event.gpu_index, event.gi_id)] = f"GI {event.gi_id}: {what}"
            self._version += 1
            self._cond.notify_all()
        log.warning("device health event", gpu=event.gpu_index, gi=event.gi_id, ci=event.ci_id, event=what)

    def snapshot(self) -> Sequence[DeviceHealthState]:
        realised: dict[str, tuple[int, int]] = {
            d.device_name: (d.gpu_index, d.gi_id)
            for c in self._store.load().claims.values()
            for d in c.devices
            if d.gi_id is not None
        }
        now = int(self._clock())
        with self._cond:
            states = []
            for name in self._inventory.names():
                nd = self._inventory.get(name)
                assert nd is not None
                message = self._bad_gpus.get(nd.gpu.index, "")
                key = realised.get(name)
                if not message and key is not None:
                    message = self._bad_instances.get(key, "")
                health = Health.UNHEALTHY if message else Health.HEALTHY
                states.append(DeviceHealthState(self._pool, name, health, now, message=message))
            live = set(realised.values())
            # A destroyed instance's health no longer applies to anything.
            for stale in [k for k in self._bad_instances if k not in live]:
                del self._bad_instances[stale]
            return states

    def wait_for_change(self, timeout_s: float) -> bool:
        with self._cond:
            seen = self._version
            return self._cond.wait_for(lambda: self._version != seen, timeout=timeout_s)
