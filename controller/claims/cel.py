"""CEL device selectors with the Kubernetes DRA environment, on the `common-expression-language` runtime.

What an expression sees is what kube-scheduler gives it: `device.driver`, `device.attributes[domain].id`,
`device.capacity[domain].id` (a quantity) and `device.allowMultipleAllocations`, plus the Kubernetes
extension functions selectors use: `quantity()`, `isQuantity()`, `semver()`, `isSemver()` and the
receiver-style methods `compareTo`, `isGreaterThan`, `isLessThan`, `add`, `sub`, `asInteger`,
`asApproximateFloat`, `sign`, `isInteger`, `major`, `minor`, `patch`.

The runtime has no opaque object types, so quantities and versions travel as one-key maps
(`{"__quantity__": "<exact fraction>"}`, `{"__semver__": "1.2.3"}`) in canonical form: `==` between two
of them is exact equality, and the extension functions unwrap them. Attribute keys without a domain
belong to the driver's domain, as in Kubernetes.

Evaluation is memoised per (expression, the part of the device the expression can see): identical
GPUs on a thousand nodes differ only in attributes like `parentUUID`, and an expression that never
names them gets one evaluation for all of them. An expression that iterates or tests membership
(`exists`, `all`, `in`, `size`, ...) gets the whole device as its key, so the memo is never wrong.

A runtime error (a missing attribute, a type mismatch) makes the device not match; the error is kept
so that a pod nobody can serve is told why instead of silently staying pending.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import cel

from controller.claims.quantity import QuantityError, format_fraction, parse_quantity

MAX_EXPRESSION_LENGTH = 10 * 1024  # the API's limit on one selector
_QKEY = "__quantity__"
_VKEY = "__semver__"
_SEMVER_RE = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHOLE_DEVICE_RE = re.compile(r"\b(exists|exists_one|all|map|filter|size|in|has)\b")


class CelCompileError(ValueError):
    """An expression does not compile; the message quotes it."""


class CelRuntimeError(RuntimeError):
    """An expression failed on one device."""


# --- quantity and semver values ---------------------------------------------------------------------


def quantity_value(fraction: Fraction) -> dict[str, str]:
    return {_QKEY: format_fraction(fraction)}


def _q(value: Any, what: str) -> Fraction:
    if isinstance(value, Mapping) and _QKEY in value:
        return Fraction(value[_QKEY])
    if isinstance(value, bool):
        raise CelRuntimeError(f"{what}: expected a quantity, got a bool")
    if isinstance(value, int):
        return Fraction(value)
    raise CelRuntimeError(f"{what}: expected a quantity, got {value!r}")


def _semver_tuple(text: str) -> tuple[int, int, int, tuple[tuple[int, int | str], ...] | None]:
    m = _SEMVER_RE.fullmatch(text)
    if m is None:
        raise CelRuntimeError(f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-pre][+build])")
    pre: tuple[tuple[int, int | str], ...] | None = None
    if m[4]:
        # Numeric identifiers sort before alphanumeric ones (semver 2.0 rule 11).
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in m[4].split("."))
    return int(m[1]), int(m[2]), int(m[3]), pre


def _v(value: Any, what: str) -> tuple[int, int, int, tuple[tuple[int, int | str], ...] | None]:
    if isinstance(value, Mapping) and _VKEY in value:
        return _semver_tuple(str(value[_VKEY]))
    raise CelRuntimeError(f"{what}: expected a semver, got {value!r}")


def _version_key(
    t: tuple[int, int, int, tuple[tuple[int, int | str], ...] | None],
) -> tuple[Any, ...]:
    # A release sorts after its pre-releases; the build suffix never counts.
    return (t[0], t[1], t[2], 1 if t[3] is None else 0, t[3] or ())


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Mapping) and _VKEY in a:
        ka, kb = _version_key(_v(a, "compareTo")), _version_key(_v(b, "compareTo"))
        return (ka > kb) - (ka < kb)
    qa, qb = _q(a, "compareTo"), _q(b, "compareTo")
    return (qa > qb) - (qa < qb)


def _quantity(text: Any) -> dict[str, str]:
    try:
        return quantity_value(parse_quantity(text))
    except QuantityError as exc:
        raise CelRuntimeError(str(exc)) from exc


def _is_quantity(text: Any) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


def _semver(text: Any) -> dict[str, str]:
    if not isinstance(text, str):
        raise CelRuntimeError(f"semver() needs a string, got {text!r}")
    _semver_tuple(text)
    return {_VKEY: text}


def _is_semver(text: Any) -> bool:
    return isinstance(text, str) and _SEMVER_RE.fullmatch(text) is not None


def _as_integer(q: Any) -> int:
    value = _q(q, "asInteger")
    if value.denominator != 1:
        raise CelRuntimeError(f"asInteger: {float(value)} is not an integer")
    return int(value)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "add": lambda a, b: quantity_value(_q(a, "add") + _q(b, "add")),
    "sub": lambda a, b: quantity_value(_q(a, "sub") - _q(b, "sub")),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: float(_q(q, "asApproximateFloat")),
    "sign": lambda q: (_q(q, "sign") > 0) - (_q(q, "sign") < 0),
    "isInteger": lambda q: _q(q, "isInteger").denominator == 1,
    "major": lambda v: _v(v, "major")[0],
    "minor": lambda v: _v(v, "minor")[1],
    "patch": lambda v: _v(v, "patch")[2],
}


# --- devices ------------------------------------------------------------------------------------------


def _attribute_value(raw: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool"):
        if kind in raw:
            return raw[kind]
    if "version" in raw:
        return {_VKEY: raw["version"]}
    for kind in ("strings", "ints", "bools"):
        if kind in raw:
            return list(raw[kind])
    if "versions" in raw:
        return [{_VKEY: v} for v in raw["versions"]]
    raise CelRuntimeError(f"attribute value {dict(raw)!r} has no known type")


def _split(key: str, driver: str) -> tuple[str, str]:
    domain, _, ident = key.rpartition("/")
    return (domain or driver), ident


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


_INTERNED: dict[Any, Any] = {}
_INTERN_LIMIT = 1_000_000


def _intern(value: Any) -> Any:
    """One shared object per distinct (name, value) pair: at 1000 nodes x 8 GPUs there are ~200k
    published devices, but their attribute/capacity pairs repeat across GPUs of a model."""
    if len(_INTERNED) >= _INTERN_LIMIT:
        _INTERNED.clear()
    return _INTERNED.setdefault(value, value)


@dataclass(slots=True)
class CelDevice:
    """A published device as CEL sees it.

    Only the memo key (`items`, of interned pairs) is kept per device; the CEL activation (`env`) is
    rebuilt from the slice JSON, which the watch cache holds anyway, on the rare memo miss. Keeping a
    parsed activation per device cost ~3 KB each, most of the controller's memory at 1000 nodes.
    """

    driver: str
    raw: Mapping[str, Any]
    # ((domain, id), frozen value) pairs for memo keys
    items: tuple[tuple[tuple[str, str], Any], ...]
    allow_multiple: bool = False

    @classmethod
    def from_slice_device(cls, driver: str, device: Mapping[str, Any]) -> CelDevice:
        _, items = _parse(driver, device)
        allow = bool(device.get("allowMultipleAllocations", False))
        return cls(driver, device, tuple(sorted(_intern(i) for i in items)), allow)

    @property
    def env(self) -> dict[str, Any]:
        env, _ = _parse(self.driver, self.raw)
        return env


def _parse(
    driver: str, device: Mapping[str, Any]
) -> tuple[dict[str, Any], list[tuple[tuple[str, str], Any]]]:
    attributes: dict[str, dict[str, Any]] = {}
    capacity: dict[str, dict[str, Any]] = {}
    items: list[tuple[tuple[str, str], Any]] = []
    for key, raw in (device.get("attributes") or {}).items():
        domain, ident = _split(key, driver)
        try:
            value = _attribute_value(raw)
        except CelRuntimeError:
            continue  # an attribute type this runtime does not know cannot be selected on
        attributes.setdefault(domain, {})[ident] = value
        items.append(((domain, ident), _freeze(value)))
    for key, raw in (device.get("capacity") or {}).items():
        domain, ident = _split(key, driver)
        try:
            value = quantity_value(parse_quantity(raw.get("value", "")))
        except QuantityError:
            continue
        capacity.setdefault(domain, {})[ident] = value
        items.append(((domain, "cap:" + ident), value[_QKEY]))
    env = {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
    return env, items


@dataclass(slots=True)
class DeviceSelector:
    """One compiled expression, with its per-device-view memo."""

    source: str
    program: Any
    tokens: frozenset[str]
    whole_device: bool
    memo: dict[Any, bool | str] = field(default_factory=dict)

    def _key(self, device: CelDevice) -> Any:
        if self.whole_device:
            return (device.driver, device.allow_multiple, device.items)
        seen = tuple(item for item in device.items if item[0][1].removeprefix("cap:") in self.tokens)
        return (device.driver, device.allow_multiple, seen)

    def evaluate(self, device: CelDevice) -> bool | str:
        """True/False, or the runtime error message (which counts as no match)."""
        key = self._key(device)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        context = cel.Context()
        for name, fn in _FUNCTIONS.items():
            context.add_function(name, fn)
        context.add_variable("device", device.env)
        result: bool | str
        try:
            value = self.program.execute(context)
        except Exception as exc:  # the runtime raises KeyError/TypeError/RuntimeError alike
            result = f"CEL runtime error in {self.source!r}: {exc}"
        else:
            result = value if isinstance(value, bool) else f"{self.source!r} returned {value!r}, not a bool"
        if len(self.memo) < 100_000:  # bound memory if every device is unique to the expression
            self.memo[key] = result
        return result

    def matches(self, device: CelDevice) -> bool:
        return self.evaluate(device) is True


class CelEnvironment:
    """Compiles selectors once and keeps them (expressions are few; devices are many)."""

    def __init__(self) -> None:
        self._compiled: dict[str, DeviceSelector] = {}

    def compile(self, expression: str) -> DeviceSelector:
        hit = self._compiled.get(expression)
        if hit is not None:
            return hit
        if len(expression) > MAX_EXPRESSION_LENGTH:
            raise CelCompileError(f"CEL expression longer than {MAX_EXPRESSION_LENGTH} characters")
        try:
            program = cel.compile(expression)
        except Exception as exc:
            raise CelCompileError(f"CEL expression {expression!r} does not compile: {exc}") from exc
        unknown = set(program.variables()) - {"device"}
        if unknown:
            raise CelCompileError(
                f"CEL expression {expression!r} uses unknown variable(s) {sorted(unknown)}; only 'device'"
            )
        selector = DeviceSelector(
            source=expression,
            program=program,
            tokens=frozenset(_TOKEN_RE.findall(expression)),
            whole_device=_WHOLE_DEVICE_RE.search(expression) is not None,
        )
        self._compiled[expression] = selector
        return selector

    def clear_memos(self) -> None:
        """Forget per-device results (the published devices changed)."""
        for selector in self._compiled.values():
            selector.memo.clear()
