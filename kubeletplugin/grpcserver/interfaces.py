"""The plain-Python contract between the kubelet gRPC servers and the rest of the node agent.

The servers only translate protobuf to these dataclasses and back; prepare logic, checkpointing
and health monitoring implement the Protocols below and never see a protobuf message. That keeps
them testable without sockets and independent of which kubelet API version made the call.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as kubelet names it. The UID is the identity; namespace/name locate it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device made available for a claim."""

    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str] = field(default_factory=list)
    """Fully qualified CDI device names (vendor/class=name)."""


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The outcome for one claim: devices on success, a non-empty error on failure."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


class ClaimPreparer(Protocol):
    """Prepares and unprepares claims. Both calls must be idempotent: kubelet retries them.

    Results are keyed by claim UID. A claim missing from a result is reported to kubelet as an
    error (kubelet retries it); an exception is reported as the error of the claims it concerns.
    """

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]: ...

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        """None (or "") for success, else the error message."""
        ...


class Health(enum.IntEnum):
    """Device health as kubelet's DRAResourceHealth API encodes it (same numbers on the wire)."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True, slots=True)
class DeviceHealthState:
    pool_name: str
    device_name: str
    health: Health
    last_updated_unix_s: int
    health_check_timeout_s: int = 0
    """How long kubelet may trust this status; 0 lets kubelet apply its default."""
    message: str = ""


@runtime_checkable
class HealthSource(Protocol):
    """Where the health servers read device health from."""

    def snapshot(self) -> Sequence[DeviceHealthState]:
        """The current health of every device the plugin publishes."""
        ...

    def wait_for_change(self, timeout_s: float) -> bool:
        """Block until the health may have changed (True) or timeout_s elapsed (False).

        Spurious True returns are allowed; the servers simply resend the full list.
        """
        ...
