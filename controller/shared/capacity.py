"""Shareable (HAMi-core) GPUs: their published capacities, what a request asks of them, what a result holds.

A hami-core node publishes one `gpu-<i>-shared` device per GPU with `allowMultipleAllocations` and three
consumable capacities (contract C1 in docs/architecture.md): `memory` (MiB), `cores` (percent of the SMs, 0..100) and `shares`
(the split count; each share consumes 1). A request asks through `capacity.requests` (any of the three
names, plain or qualified with the driver domain) or, for a percentage of the GPU's memory, through the
opaque config `SharedGpuRequest{memoryPercentage}` (decoded strictly by api/opaqueconfig.py). A missing
request takes the capacity's `requestPolicy.default`; a value is adjusted as KEP-5075 prescribes (raised to
the range minimum, rounded up to the step, or up to the next valid value), and refused, naming the field
and the allowed values, when no such value exists or the GPU is too small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from api import devicecontract as dc
from api.constants import DRIVER_NAME
from controller.claims.quantity import MEBI, QuantityError, format_fraction, parse_quantity
from driver.policy.sharemodel import ShareAmount

CAPACITY_NAMES = dc.SHARED_CAPACITY_NAMES


class ShareRequestError(ValueError):
    """A shared request (capacity or config) is malformed or asks for what no published GPU allows."""


class ShareTooLarge(ShareRequestError):
    """The request is valid but more than this GPU has."""


def _fmt(name: str, value: Fraction) -> str:
    if name == dc.CAP_MEMORY:
        return f"{format_fraction(value / MEBI)}Mi"
    return format_fraction(value)


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """A capacity's published `requestPolicy` (KEP-5075); all values in base units (bytes for memory)."""

    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    minimum: Fraction | None = None
    maximum: Fraction | None = None
    step: Fraction | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> RequestPolicy:
        if not raw:
            return cls()
        rng = raw.get("validRange") or {}

        def q(v: Any) -> Fraction | None:
            return None if v is None else parse_quantity(str(v))

        return cls(
            default=q(raw.get("default")),
            valid_values=tuple(sorted(parse_quantity(str(v)) for v in raw.get("validValues") or ())),
            minimum=q(rng.get("min")),
            maximum=q(rng.get("max")),
            step=q(rng.get("step")),
        )

    def allowed(self, name: str) -> str:
        if self.valid_values:
            return "one of " + ", ".join(_fmt(name, v) for v in self.valid_values)
        lo = _fmt(name, self.minimum) if self.minimum is not None else "0"
        hi = _fmt(name, self.maximum) if self.maximum is not None else "the GPU's capacity"
        step = f" in steps of {_fmt(name, self.step)}" if self.step else ""
        return f"{lo}..{hi}{step}"

    def adjust(self, value: Fraction) -> Fraction | None:
        """The value KEP-5075 consumes for a request of `value`, or None when the policy forbids it."""
        if self.valid_values:
            return next((v for v in self.valid_values if v >= value), None)
        if self.minimum is not None and value < self.minimum:
            value = self.minimum
        if self.step:
            base = self.minimum or Fraction(0)
            steps = -((base - value) // self.step)  # ceil
            value = base + steps * self.step
        if self.maximum is not None and value > self.maximum:
            return None
        return value


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Fraction
    policy: RequestPolicy


@dataclass(frozen=True, slots=True)
class SharedGpuInfo:
    """What a `gpu-<i>-shared` device publishes."""

    pool: str
    device: str
    uuid: str
    split_count: int
    capacity: Mapping[str, Capacity]

    @classmethod
    def parse(cls, pool: str, raw: Mapping[str, Any]) -> SharedGpuInfo:
        caps: dict[str, Capacity] = {}
        for key, body in (raw.get("capacity") or {}).items():
            name = key.removeprefix(DRIVER_NAME + "/")
            try:
                caps[name] = Capacity(
                    parse_quantity(str(body.get("value", "0"))),
                    RequestPolicy.parse(body.get("requestPolicy")),
                )
            except QuantityError:
                continue
        attrs = raw.get("attributes") or {}
        uuid = (attrs.get(dc.ATTR_UUID) or {}).get("string", "")
        split = (attrs.get(dc.ATTR_SPLIT_COUNT) or {}).get("int")
        shares = caps.get(dc.CAP_SHARES)
        if not isinstance(split, int):
            split = int(shares.value) if shares is not None else 0
        return cls(pool, str(raw.get("name", "")), str(uuid), split, caps)

    def total(self) -> ShareAmount:
        """Memory MiB, cores (100 unless published otherwise) and split slots this GPU offers."""
        mem = self.capacity.get(dc.CAP_MEMORY)
        cores = self.capacity.get(dc.CAP_CORES)
        shares = self.capacity.get(dc.CAP_SHARES)
        return ShareAmount(
            int(mem.value // MEBI) if mem is not None else 0,
            int(cores.value) if cores is not None else 100,
            int(shares.value) if shares is not None else self.split_count,
        )

    def default_amount(self) -> ShareAmount:
        """What a result without consumedCapacity holds: each capacity's policy default (C1)."""
        return self.amount({}) if dc.CAP_MEMORY in self.capacity else ShareAmount(0, 0, 1)

    def amount(self, requested: Mapping[str, Fraction], where: str = "") -> ShareAmount:
        """What a share asking `requested` (base units) consumes here; ShareRequestError if nothing fits."""
        out: dict[str, int] = {}
        for name in CAPACITY_NAMES:
            cap = self.capacity.get(name)
            wanted = requested.get(name)
            if cap is None:
                if wanted:
                    raise ShareRequestError(
                        f"{where}.capacity.requests.{name}: {self.device} publishes no {name!r} capacity"
                    )
                out[name] = 0 if name != dc.CAP_SHARES else 1
                continue
            got: Fraction
            if wanted is None:
                got = cap.policy.default if cap.policy.default is not None else cap.value
            else:
                adjusted = cap.policy.adjust(wanted)
                if adjusted is None:
                    raise ShareRequestError(
                        f"{where}.capacity.requests.{name}: {_fmt(name, wanted)} is not allowed by "
                        f"{self.device}'s requestPolicy; allowed: {cap.policy.allowed(name)}"
                    )
                got = adjusted
            if got > cap.value:
                raise ShareTooLarge(
                    f"{where}.capacity.requests.{name}: {_fmt(name, got)} exceeds the "
                    f"{_fmt(name, cap.value)} of {self.device}"
                )
            # Memory is consumed in whole MiB (the published step); cores and shares are integers.
            out[name] = -(-got // MEBI) if name == dc.CAP_MEMORY else -(-got // 1)
        return ShareAmount(out[dc.CAP_MEMORY], out[dc.CAP_CORES], out[dc.CAP_SHARES])


@dataclass(frozen=True, slots=True)
class ShareSpec:
    """What one alternative asks of a shareable GPU: capacity requests (base units) or a memory percent."""

    requests: Mapping[str, Fraction]
    memory_percent: int | None = None

    def amount(self, gpu: SharedGpuInfo, where: str) -> ShareAmount:
        requested = dict(self.requests)
        if self.memory_percent is not None:
            mem = gpu.capacity.get(dc.CAP_MEMORY)
            total_mib = int(mem.value // MEBI) if mem is not None else 0
            # floor(total * p / 100) MiB (contract C3), at least the 1 MiB a share must hold.
            requested[dc.CAP_MEMORY] = Fraction(max(1, total_mib * self.memory_percent // 100) * MEBI)
        return gpu.amount(requested, where)

    def memory_hint_mib(self) -> int | None:
        mem = self.requests.get(dc.CAP_MEMORY)
        return None if mem is None else int(-(-mem // MEBI))


def parse_capacity_requests(where: str, body: Mapping[str, Any]) -> dict[str, Fraction] | None:
    """`capacity.requests` of one request alternative (None when absent), names and values checked."""
    raw = (body.get("capacity") or {}).get("requests")
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise ShareRequestError(f"{where}.capacity.requests must be a map of capacity name to quantity")
    out: dict[str, Fraction] = {}
    for key, value in raw.items():
        name = str(key).removeprefix(DRIVER_NAME + "/")
        if name not in CAPACITY_NAMES:
            raise ShareRequestError(
                f"{where}.capacity.requests: unknown capacity {key!r}; allowed: {', '.join(CAPACITY_NAMES)}"
            )
        try:
            q = parse_quantity(str(value))
        except QuantityError as exc:
            raise ShareRequestError(f"{where}.capacity.requests.{name}: {exc}") from exc
        if q < 0:
            raise ShareRequestError(f"{where}.capacity.requests.{name}: {value!r} must not be negative")
        out[name] = q
    return out


def consumed_amount(result: Mapping[str, Any], gpu: SharedGpuInfo | None) -> ShareAmount | None:
    """What an allocation result holds on a shared GPU: consumedCapacity, defaults for what it omits.

    None when it cannot be read (the result is then counted at the defaults by the caller)."""
    consumed = result.get("consumedCapacity") or {}
    requested: dict[str, Fraction] = {}
    for key, value in consumed.items():
        name = str(key).removeprefix(DRIVER_NAME + "/")
        try:
            requested[name] = parse_quantity(str(value))
        except QuantityError:
            return None
    defaults = gpu.default_amount() if gpu is not None else ShareAmount(0, 0, 1)
    mem = requested.get(dc.CAP_MEMORY)
    cores = requested.get(dc.CAP_CORES)
    shares = requested.get(dc.CAP_SHARES)
    return ShareAmount(
        int(-(-mem // MEBI)) if mem is not None else defaults.memory_mib,
        int(-(-cores // 1)) if cores is not None else defaults.cores,
        int(-(-shares // 1)) if shares is not None else defaults.shares,
    )


def consumed_capacity(amount: ShareAmount) -> dict[str, str]:
    """The result's consumedCapacity (contract C2)."""
    return {
        dc.CAP_MEMORY: f"{amount.memory_mib}Mi",
        dc.CAP_CORES: str(amount.cores),
        dc.CAP_SHARES: str(amount.shares),
    }
