"""kubelet plugin registration (pluginregistration v1).

kubelet's plugin watcher finds our registration socket, calls GetInfo to learn the DRA endpoint
and the API versions we serve, then reports the outcome with NotifyRegistrationStatus. kubelet
wipes a node's ResourceSlices when it starts and when a driver stays disconnected, and it
re-registers us afterwards, so "registered again" is the moment to republish: RegistrationState
runs a callback on every successful notification for exactly that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from api.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from api.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc

log = structlog.get_logger(__name__)

PLUGIN_TYPE_DRA = "DRAPlugin"

# The "versions" kubelet reads from GetInfo are short gRPC service names. kubelet picks the first
# DRAPlugin entry it knows, so v1 goes first; it ignores names it does not know, which makes
# advertising the health services harmless to kubelets that predate them.
SERVICE_DRA_V1 = "v1.DRAPlugin"
SERVICE_DRA_V1BETA1 = "v1beta1.DRAPlugin"
SERVICE_HEALTH_V1 = "v1.DRAResourceHealth"
SERVICE_HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"

DRA_SERVICES: tuple[str, ...] = (SERVICE_DRA_V1, SERVICE_DRA_V1BETA1)
HEALTH_SERVICES: tuple[str, ...] = (SERVICE_HEALTH_V1, SERVICE_HEALTH_V1ALPHA1)


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """A point-in-time copy of RegistrationState."""

    registered: bool
    error: str
    notifications: int
    registrations: int


class RegistrationState:
    """What kubelet last told us about our registration. Safe to use from any thread.

    on_registered runs (in the gRPC handler thread) after every successful (re)registration; it
    should be quick or hand work to another thread, because kubelet waits for the RPC to return.
    An exception from it is logged and does not fail the RPC: kubelet would not retry anyway.
    """

    def __init__(self, on_registered: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._registered = False
        self._error = ""
        self._notifications = 0
        self._registrations = 0
        self._on_registered = on_registered

    def set_on_registered(self, callback: Callable[[], None] | None) -> None:
        """Install (or clear) the callback, e.g. once the ResourceSlice publisher exists."""
        with self._cond:
            self._on_registered = callback

    @property
    def registered(self) -> bool:
        with self._cond:
            return self._registered

    @property
    def error(self) -> str:
        with self._cond:
            return self._error

    @property
    def notifications(self) -> int:
        with self._cond:
            return self._notifications

    def status(self) -> RegistrationStatus:
        with self._cond:
            return RegistrationStatus(self._registered, self._error, self._notifications, self._registrations)

    def record(self, registered: bool, error: str) -> None:
        """Store one NotifyRegistrationStatus outcome and run the callback on success."""
        with self._cond:
            self._registered = registered
            self._error = error
            self._notifications += 1
            if registered:
                self._registrations += 1
            callback = self._on_registered
            self._cond.notify_all()
        # Called outside the lock so that the callback may read the state (or block) freely.
        if registered and callback is not None:
            try:
                callback()
            except Exception:
                log.exception("on_registered callback failed")

    def wait_registered(self, timeout_s: float | None = None) -> bool:
        """Block until kubelet reported a successful registration; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._registered, timeout=timeout_s)


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """Answers kubelet's plugin watcher on the registration socket."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        supported_versions: Sequence[str],
        state: RegistrationState,
    ) -> None:
        if not endpoint.startswith("/"):
            # kubelet dials the endpoint from its own mount namespace; a relative path is meaningless.
            raise ValueError(f"endpoint must be an absolute path, got {endpoint!r}")
        if not any(v in DRA_SERVICES for v in supported_versions):
            raise ValueError(f"supported_versions must include one of {DRA_SERVICES}")
        self._info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE_DRA,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(supported_versions),
        )
        self._state = state

    def GetInfo(self, request: reg_pb2.InfoRequest, context: Any) -> reg_pb2.PluginInfo:
        log.info(
            "kubelet requested plugin info",
            endpoint=self._info.endpoint,
            versions=list(self._info.supported_versions),
        )
        out = reg_pb2.PluginInfo()
        out.CopyFrom(self._info)
        return out

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered the plugin", driver=self._info.name)
        else:
            log.error("kubelet rejected the plugin registration", driver=self._info.name, error=request.error)
        self._state.record(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()
