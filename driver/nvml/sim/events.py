"""Simulated NVML event sets: one-shot health events injected through the state file.

Event-set registrations belong to the calling process (like the real library's), so they live in
memory; the pending events themselves live in the state file, and the first wait that matches one
consumes it.
"""

from __future__ import annotations

import time
from typing import Any

import pynvml

from driver.nvml.sim import rules
from driver.nvml.sim.core import LibraryCore
from driver.nvml.sim.handles import HandleRef, Kind, make, parse
from driver.nvml.sim.memory import MemoryState
from driver.nvml.sim.state import EventState, SimState

SUPPORTED_EVENT_TYPES = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_POLL_S = 0.02
_ANY = 0xFFFFFFFF


class EventMixin(LibraryCore):
    def __init__(self, source: str | MemoryState) -> None:
        super().__init__(source)
        self._event_sets: dict[int, dict[int, int]] = {}  # set serial -> {gpu index: event mask}
        self._next_event_set = 1

    def _registry(self, event_set: Any) -> dict[int, int]:
        registry = self._event_sets.get(parse(event_set, Kind.EVENT_SET).serial)
        if registry is None:
            rules.fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return registry

    def nvmlEventSetCreate(self) -> Any:
        def op(st: SimState) -> Any:
            serial = self._next_event_set
            self._next_event_set += 1
            self._event_sets[serial] = {}
            return make(HandleRef(Kind.EVENT_SET, serial=serial))

        return self._invoke("nvmlEventSetCreate", op)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        def op(st: SimState) -> None:
            self._registry(eventSet)
            del self._event_sets[parse(eventSet, Kind.EVENT_SET).serial]

        self._invoke("nvmlEventSetFree", op)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        def op(st: SimState) -> int:
            self._device(st, handle)
            return int(SUPPORTED_EVENT_TYPES)

        return self._invoke("nvmlDeviceGetSupportedEventTypes", op, on=handle)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        def op(st: SimState) -> None:
            index = self._device(st, handle)[0]
            registry = self._registry(eventSet)
            if eventTypes & ~SUPPORTED_EVENT_TYPES:
                rules.fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            registry[index] = registry.get(index, 0) | eventTypes

        self._invoke("nvmlDeviceRegisterEvents", op, on=handle)

    @staticmethod
    def _match(events: list[EventState], registry: dict[int, int]) -> EventState | None:
        return next((e for e in events if registry.get(e.gpu_index, 0) & e.event_type), None)

    def _pop_event(self, registry: dict[int, int]) -> EventState | None:
        if self._memory is not None:
            return self._memory.pop_event(lambda events: self._match(events, registry))
        assert self._store is not None
        # Peek without writing (cheap); only take the lock for writing when there is something to take.
        if self._match(self._store.read().events, registry) is None:
            return None
        with self._store.transaction() as st:
            event = self._match(st.events, registry)
            if event is not None:
                st.events.remove(event)
            return event

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        registry = self._invoke("nvmlEventSetWait_v2", lambda st: self._registry(eventSet))
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            event = self._pop_event(registry)
            if event is not None:
                data = pynvml.c_nvmlEventData_t()
                data.device = make(HandleRef(Kind.DEVICE, event.gpu_index))
                data.eventType, data.eventData = event.event_type, event.data
                data.gpuInstanceId = _ANY if event.gi_id is None else event.gi_id
                data.computeInstanceId = _ANY if event.ci_id is None else event.ci_id
                return data
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_POLL_S, remaining))

    nvmlEventSetWait = nvmlEventSetWait_v2
