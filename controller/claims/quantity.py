"""Kubernetes resource quantities ("8000Mi", "80Gi", "1.5", "500m", "1e3") as exact fractions.

Device capacities and the `quantity()` CEL function both go through here, so "8Gi" and "8192Mi" compare
equal and a selector threshold is compared exactly, never through a float.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_RE = re.compile(
    r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))"
)

MEBI = 2**20


class QuantityError(ValueError):
    """Not a Kubernetes quantity; the message shows the accepted form."""


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string (raises QuantityError)."""
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {text!r}")
    m = _RE.fullmatch(text.strip())
    if m is None:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (e.g. '8000Mi', '80Gi', '1.5', '500m', '1e3')"
        )
    value = Fraction(m["num"])
    if m["bin"]:
        return value * _BINARY[m["bin"]]
    if m["exp"] is not None:
        return value * Fraction(10) ** int(m["exp"])
    return value * _DECIMAL[m["dec"] or ""]


def quantity_mib(text: str) -> int:
    """A memory quantity in whole MiB, rounded down (published capacities are whole MiB)."""
    return int(parse_quantity(text) // MEBI)


def format_fraction(value: Fraction) -> str:
    """A canonical string of an exact value: equal values give equal strings."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
