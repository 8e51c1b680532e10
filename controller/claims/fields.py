"""Fields of a claim read strictly, the way kube-scheduler's structured allocator reads them.

An API server newer than flexmig may send a selector or constraint kind flexmig does not know;
upstream refuses to allocate such a claim ("unsupported selector/constraint"), and so does flexmig,
naming the field: allocating as if it were absent would silently drop the user's intent.

Device taints (ResourceSlice `devices[].taints`, DRADeviceTaints, GA in 1.37): a device with a taint
whose effect is not `None` is allocated only to a request with a toleration for it; the request's
tolerations are copied into every result (`results[].tolerations`), as upstream does. A request's
tolerations travel with its selector set as one pseudo-selector (`TOLERATIONS_PREFIX` + JSON), so
every per-selector cache of the candidate index (controller/claims/requests.py) keys on them too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

ALLOCATION_RESULTS_MAX = 32  # resourceapi.AllocationResultsMaxSize: results of one claim
TOLERATIONS_PREFIX = "\x00tolerations:"  # never a CEL expression: it cannot start with a NUL
_OPERATORS = ("Equal", "Exists")
_EFFECTS = ("", "NoSchedule", "NoExecute", "None")  # None matches only informational taints


class FieldError(ValueError):
    """A field the controller does not understand; the message names it and says what would work."""


def selectors(where: str, obj: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The CEL expressions of `obj.selectors`; a selector without `cel` is refused, naming it."""
    out = []
    for j, sel in enumerate((obj or {}).get("selectors") or ()):
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, Mapping) else None
        if not expr:
            kinds = ", ".join(sorted(k for k in (sel or {}) if k != "cel")) or "nothing"
            raise FieldError(
                f"{where}.selectors[{j}]: only CEL selectors are supported (found {kinds}); "
                "write it as cel.expression, or remove it"
            )
        out.append(str(expr))
    return tuple(out)


def check_constraints(key: str, claim: Mapping[str, Any]) -> None:
    """Refuse a constraint that is neither matchAttribute nor distinctAttribute (or is both)."""
    constraints = ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or ()
    for k, c in enumerate(constraints):
        kinds = [f for f in ("matchAttribute", "distinctAttribute") if (c or {}).get(f)]
        if len(kinds) != 1:
            found = ", ".join(sorted(k2 for k2 in (c or {}) if k2 != "requests")) or "nothing"
            raise FieldError(
                f"claim {key} spec.devices.constraints[{k}]: exactly one of matchAttribute or "
                f"distinctAttribute is supported (found {found})"
            )


def tolerations(where: str, body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The request's tolerations, checked: operator Equal|Exists, effect NoSchedule|NoExecute|empty."""
    out = []
    for t, tol in enumerate(body.get("tolerations") or ()):
        if not isinstance(tol, Mapping):
            raise FieldError(f"{where}.tolerations[{t}] must be an object")
        operator = tol.get("operator") or "Equal"
        effect = tol.get("effect") or ""
        if operator not in _OPERATORS:
            raise FieldError(f"{where}.tolerations[{t}].operator {operator!r}: allowed: Equal, Exists")
        if effect not in _EFFECTS:
            raise FieldError(
                f"{where}.tolerations[{t}].effect {effect!r}: allowed: NoSchedule, NoExecute, None (or empty)"
            )
        if operator == "Equal" and not tol.get("key"):
            raise FieldError(f"{where}.tolerations[{t}]: operator Equal needs a key (or use Exists)")
        out.append(dict(tol))
    return tuple(out)


def tolerations_selector(tols: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The pseudo-selector carrying `tols` in a selector set (none when there are none)."""
    return (TOLERATIONS_PREFIX + json.dumps(list(tols), sort_keys=True),) if tols else ()


def split_tolerations(sels: Sequence[str]) -> tuple[list[str], list[Mapping[str, Any]]]:
    """(CEL expressions, tolerations) of a selector set."""
    cel, tols = [], []
    for s in sels:
        if s.startswith(TOLERATIONS_PREFIX):
            tols.extend(json.loads(s[len(TOLERATIONS_PREFIX) :]))
        else:
            cel.append(s)
    return cel, tols


def tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Upstream's ToleratesTaint: effect (empty matches all), key (empty with Exists matches all),
    then Exists, or Equal on the value."""
    if tol.get("effect") and tol.get("effect") != taint.get("effect"):
        return False
    if tol.get("key") and tol.get("key") != taint.get("key"):
        return False
    if (tol.get("operator") or "Equal") == "Exists":
        return True
    return bool(tol.get("key")) and (tol.get("value") or "") == (taint.get("value") or "")


def untolerated(device: Mapping[str, Any], tols: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first taint of `device` (its slice entry) that keeps it from a request with `tols`."""
    for taint in device.get("taints") or ():
        if (taint or {}).get("effect") == "None":  # informational only, as upstream
            continue
        if not any(tolerates(t, taint) for t in tols):
            return taint  # type: ignore[no-any-return]
    return None


def admin_access(where: str, path: str, body: Mapping[str, Any]) -> bool:
    """`adminAccess` of one request alternative (controller/allocation/adminaccess.py serves it)."""
    admin = body.get("adminAccess")
    if admin not in (None, False, True):
        raise FieldError(f"{where}.adminAccess must be true or false, got {admin!r}")
    if admin and ".exactly" not in path:
        # The API has adminAccess only on `exactly` (upstream never reads it on a subrequest).
        raise FieldError(f"{where}.adminAccess is allowed only in exactly: move the request there")
    if admin and body.get("capacity"):
        raise FieldError(
            f"{where}.capacity: an adminAccess request consumes nothing, so it cannot ask for capacity; "
            "remove capacity.requests (the admin sees the whole device)"
        )
    return bool(admin)
