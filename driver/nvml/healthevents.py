"""`HealthEventWatch`: the NVML event set behind `Nvml.wait_health_events` (driver/nvml/port.py).

One event set, created on the first wait, with every GPU registered for XID and double-bit ECC events
(XIDs alone where a board has no ECC events). GPUs are registered by handle address, so one that
appears later is registered on a later wait (the GPUs are counted again at most every
`RESCAN_INTERVAL_S`: the plugin waits in 100 ms slices, and counting and looking up every GPU on each
slice was nine NVML calls per node every 100 ms for nothing) and an event names its GPU by index. NVML calls go
through the port's own call wrapper, so every failure is the port's `NvmlError`.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

from driver.nvml.types import HealthEvent, HealthEventKind, NvmlError, NvmlErrorCode

_ID_ANY = 0xFFFFFFFF
_MAX_EVENTS_PER_WAIT = 64
RESCAN_INTERVAL_S = 10.0


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class HealthEventWatch:
    """XID / double-bit ECC events of every GPU, through `call(function, *args)` on pynvml-like `lib`."""

    def __init__(self, lib: Any, call: Callable[..., Any], handle: Callable[[int], Any]) -> None:
        self._lib = lib
        self._call = call
        self._handle = handle  # the port's, cached per NVML init
        self._next_scan = 0.0
        self._event_set: Any = None
        self._registered: dict[int, int] = {}  # device handle address -> GPU index

    def close(self) -> None:
        """Free the event set, if one was created (before nvmlShutdown)."""
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._registered.clear()
        self._next_scan = 0.0
        self._call("nvmlEventSetFree", event_set)

    def _ensure_registration(self) -> None:
        if self._event_set is None:
            self._event_set = self._call("nvmlEventSetCreate")
        elif time.monotonic() < self._next_scan:
            return
        xid = int(self._lib.nvmlEventTypeXidCriticalError)
        wanted = xid | int(self._lib.nvmlEventTypeDoubleBitEccError)
        for index in range(int(self._call("nvmlDeviceGetCount"))):
            h = self._handle(index)
            if _address(h) in self._registered:
                continue
            try:
                self._call("nvmlDeviceRegisterEvents", h, wanted, self._event_set)
            except NvmlError as exc:
                if exc.code is not NvmlErrorCode.NOT_SUPPORTED:
                    raise
                # Some boards lack ECC events; XIDs alone are still worth watching.
                self._call("nvmlDeviceRegisterEvents", h, xid, self._event_set)
            self._registered[_address(h)] = index
        self._next_scan = time.monotonic() + RESCAN_INTERVAL_S

    def wait(self, timeout_ms: int) -> list[HealthEvent]:
        """Wait up to `timeout_ms` for XID / double-bit ECC events; returns [] on timeout."""
        self._ensure_registration()
        events: list[HealthEvent] = []
        wait_ms = timeout_ms
        while len(events) < _MAX_EVENTS_PER_WAIT:
            try:
                data = self._call("nvmlEventSetWait_v2", self._event_set, wait_ms)
            except NvmlError as exc:
                if exc.code is NvmlErrorCode.TIMEOUT:
                    break
                raise
            event = self._health_event(data)
            if event is not None:
                events.append(event)
            wait_ms = 0  # drain whatever else is already queued, without waiting again
        return events

    def _health_event(self, data: Any) -> HealthEvent | None:
        index = self._registered.get(_address(data.device))
        if index is None:
            return None
        event_type = int(data.eventType)
        if event_type & int(self._lib.nvmlEventTypeXidCriticalError):
            kind, xid = HealthEventKind.XID, int(data.eventData)
        elif event_type & int(self._lib.nvmlEventTypeDoubleBitEccError):
            kind, xid = HealthEventKind.ECC_DOUBLE_BIT, 0
        else:
            return None
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        return HealthEvent(
            gpu_index=index,
            kind=kind,
            xid=xid,
            gi_id=None if gi == _ID_ANY else gi,
            ci_id=None if ci == _ID_ANY else ci,
        )
