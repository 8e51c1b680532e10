"""kubelet-facing gRPC servers: plugin registration, DRAPlugin (v1, v1beta1), DRAResourceHealth.

The rest of the node agent plugs in through ClaimPreparer and HealthSource (plain dataclasses,
no protobuf) and hooks ResourceSlice republishing into RegistrationState.
"""

from .interfaces import (
    ClaimPreparer,
    ClaimRef,
    DeviceHealthState,
    Health,
    HealthSource,
    PreparedDevice,
    PrepareResult,
)
from .registration import RegistrationServicer, RegistrationState, RegistrationStatus
from .server import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    PluginServers,
    install_signal_handlers,
)

__all__ = [
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_REGISTRY_DIR",
    "ClaimPreparer",
    "ClaimRef",
    "DeviceHealthState",
    "Health",
    "HealthSource",
    "PluginServers",
    "PrepareResult",
    "PreparedDevice",
    "RegistrationServicer",
    "RegistrationState",
    "RegistrationStatus",
    "install_signal_handlers",
]
