"""Versioned opaque-config types of the gpu.flexmig.dev driver, with strict decoding.

A claim (or DeviceClass) carries driver-specific settings as `config[].opaque.parameters` for
`opaque.driver == gpu.flexmig.dev`. Anything under that driver name is ours to interpret, so it is
decoded strictly: an unknown apiVersion or kind, an unknown field, or a value out of range is an
error naming the field and the allowed values. Silently ignoring it would give the pod something
else than it asked for (a typo in `kind` would hand it the whole GPU instead of a percentage).

Known types:
- `gpu.flexmig.dev/v1alpha1` `SharedGpuRequest{memoryPercentage: 1..100}`: a share of a HAMi-core
  GPU holding that percentage of the GPU's memory (contract C3 in docs/architecture.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from api.constants import DRIVER_NAME

API_VERSION_V1ALPHA1 = f"{DRIVER_NAME}/v1alpha1"


class OpaqueConfigError(ValueError):
    """Opaque parameters for our driver that do not decode; the message names the field."""


@dataclass(frozen=True, slots=True)
class SharedGpuRequest:
    """A share of a HAMi-core GPU sized as a percentage of the GPU's memory."""

    API_VERSION: ClassVar[str] = API_VERSION_V1ALPHA1
    KIND: ClassVar[str] = "SharedGpuRequest"
    FIELDS: ClassVar[frozenset[str]] = frozenset({"apiVersion", "kind", "memoryPercentage"})
    MIN_PERCENT: ClassVar[int] = 1
    MAX_PERCENT: ClassVar[int] = 100

    memory_percentage: int

    def __post_init__(self) -> None:
        pct = self.memory_percentage
        if (
            isinstance(pct, bool)
            or not isinstance(pct, int)
            or not self.MIN_PERCENT <= pct <= self.MAX_PERCENT
        ):
            raise OpaqueConfigError(
                f"memoryPercentage must be an integer in {self.MIN_PERCENT}..{self.MAX_PERCENT}, got {pct!r}"
            )

    @classmethod
    def decode(cls, where: str, params: Mapping[str, Any]) -> SharedGpuRequest:
        unknown = sorted(str(k) for k in set(params) - cls.FIELDS)
        if unknown:
            raise OpaqueConfigError(
                f"{where}: unknown field(s) {', '.join(unknown)} in {cls.KIND}; "
                f"allowed: {', '.join(sorted(cls.FIELDS))}"
            )
        if "memoryPercentage" not in params:
            raise OpaqueConfigError(
                f"{where}.memoryPercentage is required in {cls.KIND}; "
                f"allowed: an integer in {cls.MIN_PERCENT}..{cls.MAX_PERCENT}"
            )
        try:
            return cls(params["memoryPercentage"])
        except OpaqueConfigError as exc:
            raise OpaqueConfigError(f"{where}.{exc}") from exc

    def to_parameters(self) -> dict[str, Any]:
        """The `opaque.parameters` object that decodes back to this value."""
        return {"apiVersion": self.API_VERSION, "kind": self.KIND, "memoryPercentage": self.memory_percentage}


OpaqueConfig = SharedGpuRequest
"""Every type `decode_parameters` can return (a union once there is more than one)."""

_DECODERS: dict[tuple[str, str], Callable[[str, Mapping[str, Any]], OpaqueConfig]] = {
    (SharedGpuRequest.API_VERSION, SharedGpuRequest.KIND): SharedGpuRequest.decode,
}


def known_types() -> str:
    """The known types in words, for error messages: "gpu.flexmig.dev/v1alpha1 SharedGpuRequest"."""
    return ", ".join(f"{v} {k}" for v, k in sorted(_DECODERS))


def decode_parameters(where: str, parameters: Any) -> OpaqueConfig:
    """Decode `opaque.parameters` of a config for our driver; `where` names it in errors.

    `parameters` is the JSON object as the API returns it, or its serialised JSON (str or bytes)."""
    if isinstance(parameters, (str, bytes)):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise OpaqueConfigError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(parameters, Mapping):
        raise OpaqueConfigError(
            f"{where} must be an object with apiVersion and kind; allowed: {known_types()}"
        )
    version, kind = parameters.get("apiVersion"), parameters.get("kind")
    decoder = _DECODERS.get((version, kind)) if isinstance(version, str) and isinstance(kind, str) else None
    if decoder is None:
        known_kinds = sorted({k for _, k in _DECODERS})
        field = "kind" if kind not in known_kinds else "apiVersion"
        shown = kind if field == "kind" else version
        raise OpaqueConfigError(
            f"{where}.{field}: {shown!r} is not a known {DRIVER_NAME} config type "
            f"(apiVersion {version!r}, kind {kind!r}); allowed: {known_types()}"
        )
    return decoder(where, parameters)
