"""DRAResourceHealth servicers (KEP-4680), v1 and v1alpha1.

kubelet opens one long-lived NodeWatchResources stream and expects the full device list in every
message. A stream holds a server thread for its whole life, so it must end promptly when the
server stops or kubelet goes away; the loop therefore waits in bounded steps and checks both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import structlog

from api.gen.dra_health_v1 import api_pb2 as h1_pb2
from api.gen.dra_health_v1 import api_pb2_grpc as h1_grpc
from api.gen.dra_health_v1alpha1 import api_pb2 as h1a1_pb2
from api.gen.dra_health_v1alpha1 import api_pb2_grpc as h1a1_grpc

from .interfaces import DeviceHealthState, HealthSource

log = structlog.get_logger(__name__)

# Upper bound on one wait_for_change call: how long a stream may lag behind a shutdown or a
# cancelled client.
DEFAULT_POLL_S = 0.5
# kubelet considers a status stale after health_check_timeout (30 s by default) and reports it as
# unknown, so the list is re-sent well inside that even when nothing changed; a source that stamps
# the current time into its snapshot thereby stays fresh.
DEFAULT_RESEND_S = 10.0


def to_response(pb: ModuleType, states: Sequence[DeviceHealthState]) -> Any:
    """A NodeWatchResourcesResponse of the given API module holding every state."""
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=s.pool_name, device_name=s.device_name),
                health=int(s.health),
                last_updated_time=s.last_updated_unix_s,
                health_check_timeout_seconds=s.health_check_timeout_s,
                message=s.message,
            )
            for s in states
        ]
    )


class HealthStreamer:
    """Produces the response stream for one NodeWatchResources call; shared by both versions."""

    def __init__(
        self,
        source: HealthSource,
        stopping: threading.Event,
        poll_s: float = DEFAULT_POLL_S,
        resend_s: float = DEFAULT_RESEND_S,
    ) -> None:
        if poll_s <= 0 or resend_s <= 0:
            raise ValueError("poll_s and resend_s must be positive")
        self._source = source
        self._stopping = stopping
        self._poll_s = poll_s
        self._resend_s = resend_s

    def stream(self, pb: ModuleType, context: Any, version: str) -> Iterator[Any]:
        # The callback fires when the RPC ends for any reason (client cancel, deadline, server
        # stop), so the loop below notices within one poll instead of at its next yield.
        rpc_done = threading.Event()
        if not context.add_callback(rpc_done.set):
            return  # the RPC ended before the stream began
        log.info("health stream opened", version=version)
        sent = 0
        try:
            yield to_response(pb, self._source.snapshot())
            sent += 1
            last_sent = time.monotonic()
            while not (self._stopping.is_set() or rpc_done.is_set()):
                changed = self._source.wait_for_change(self._poll_s)
                if self._stopping.is_set() or rpc_done.is_set():
                    break
                if changed or time.monotonic() - last_sent >= self._resend_s:
                    yield to_response(pb, self._source.snapshot())
                    sent += 1
                    last_sent = time.monotonic()
        except Exception:
            # An exception from the source ends this stream with an error status; kubelet
            # reopens the stream, which is the simplest sound recovery.
            log.exception("health stream failed", version=version)
            raise
        finally:
            log.info("health stream closed", version=version, messages=sent)


class DRAResourceHealthV1Servicer(h1_grpc.DRAResourceHealthServicer):
    """package v1 DRAResourceHealth, preferred by kubelet from 1.37."""

    def __init__(self, streamer: HealthStreamer) -> None:
        self._streamer = streamer

    def NodeWatchResources(self, request: h1_pb2.NodeWatchResourcesRequest, context: Any) -> Iterator[Any]:
        return self._streamer.stream(h1_pb2, context, "v1")


class DRAResourceHealthV1Alpha1Servicer(h1a1_grpc.DRAResourceHealthServicer):
    """package v1alpha1 DRAResourceHealth, consumed by kubelets 1.31 through 1.39."""

    def __init__(self, streamer: HealthStreamer) -> None:
        self._streamer = streamer

    def NodeWatchResources(self, request: h1a1_pb2.NodeWatchResourcesRequest, context: Any) -> Iterator[Any]:
        return self._streamer.stream(h1a1_pb2, context, "v1alpha1")


def add_health_servicers(server: Any, streamer: HealthStreamer) -> None:
    """Register both DRAResourceHealth versions on a grpc.Server."""
    h1_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1Servicer(streamer), server)
    h1a1_grpc.add_DRAResourceHealthServicer_to_server(DRAResourceHealthV1Alpha1Servicer(streamer), server)
