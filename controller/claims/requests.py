"""A pod's claims -> the device requests the policy places (candidate filtering by CEL selectors).

For every request of every claim (`exactly`, or each `firstAvailable` subrequest in order) this finds
the published MIG devices its DeviceClass selectors and its own selectors admit, and hands the policy a
`DeviceRequest` whose `device_filter` admits exactly those (profile, placement) pairs per GPU. A request
with `count: N` becomes N policy requests. The per-GPU candidate sets come from the candidate index
(controller/claims/candidates.py), cached per selector set until the published devices change.

Shared (HAMi-core) GPUs: an alternative whose selectors match `gpu-<i>-shared` devices and no MIG
device, or one with `capacity.requests`, is served by shares; its `ShareSpec` holds the capacity
requests (names and values checked here and against each GPU's requestPolicy at decision time) and the
memory percentage of a `SharedGpuRequest` opaque config that names it (or names no request).

Whole GPUs (`gpu-<i>`, class gpu.flexmig.dev): an alternative whose selectors admit whole-GPU devices
and no MIG or shared device is served by idle whole GPUs (driver/policy/whole.py); `whole_candidates`
gives the GPUs whose whole device it admits. Selectors admitting MIG devices as well stay MIG requests.

What the controller does not allocate is refused with a message naming the field, never guessed at:
`allocationMode: All` on MIG or shared devices (controller/allocation/allmode.py), `adminAccess` outside
`exactly` or with capacity, a selector that is not CEL or a constraint of an unknown kind
(controller/claims/fields.py), a claim whose requests need more than 32 results, an opaque config
for gpu.flexmig.dev that is not a known type (api/opaqueconfig.py), and a memoryPercentage config that
applies only to requests no share can serve (or names no request of the claim). Capacity requests on
MIG or whole-GPU devices are filters (controller/claims/resultconfig.py `dedicated`); tolerations
ride in the selector set, so tainted devices drop out of the candidates (fields.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from api.constants import DRIVER_NAME
from api.opaqueconfig import OpaqueConfigError, decode_parameters
from controller.claims import fields
from controller.shared.capacity import ShareRequestError, ShareSpec, parse_capacity_requests

if TYPE_CHECKING:  # candidates.py reads Alternative from here
    from controller.claims.candidates import CandidateIndex


class RequestError(ValueError):
    """A claim asks for something the controller cannot allocate; the message names the field."""


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a claim request: `exactly`, or one `firstAvailable` subrequest."""

    result_name: str  # "gpu" or "gpu/sub", as written in allocation results
    class_name: str
    selectors: tuple[str, ...]  # class selectors first, then the request's
    count: int
    share: ShareSpec | None = None  # what a share must hold, when capacity or a percent config is given
    capacity_requested: bool = False  # capacity.requests present: only shared devices can serve it
    # Copied into every result (upstream does); the selectors carry them for candidate filtering.
    tolerations: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    all_devices: bool = False  # allocationMode All (whole GPUs only: controller/allocation/allmode.py)
    admin: bool = (
        False  # adminAccess: any matching device, in use or not (controller/allocation/adminaccess.py)
    )

    @property
    def request_name(self) -> str:
        return self.result_name.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    claim: str  # namespace/name
    name: str
    alternatives: tuple[Alternative, ...]


def _spec_requests(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(((claim.get("spec") or {}).get("devices") or {}).get("requests") or [])


def _alternative(
    where: str,
    result_name: str,
    body: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    path: str,
) -> Alternative:
    """`where` names the request for messages; `path` is its field path by index (selectors[j])."""
    class_name = body.get("deviceClassName")
    if not class_name:
        raise RequestError(f"{where}.deviceClassName is required")
    device_class = classes.get(class_name)
    if device_class is None:
        raise RequestError(f"{where}.deviceClassName: DeviceClass {class_name!r} does not exist")
    mode = body.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise RequestError(f"{where}.allocationMode {mode!r} is not known; allowed: ExactCount, All")
    try:
        admin = fields.admin_access(where, path, body)
    except fields.FieldError as exc:
        raise RequestError(str(exc)) from exc
    try:
        sels = fields.selectors(f"DeviceClass {class_name} spec", device_class.get("spec"))
        sels += fields.selectors(path, body)
        tols = fields.tolerations(path, body)
    except fields.FieldError as exc:
        raise RequestError(str(exc)) from exc
    try:
        capacity = parse_capacity_requests(where, body)
    except ShareRequestError as exc:
        raise RequestError(str(exc)) from exc
    # All: every matching device of the chosen node; the decision counts them (count is not used).
    count = 1 if mode == "All" else body.get("count", 1)
    # No upper bound here: a firstAvailable alternative asking for more than a claim holds is skipped
    # (upstream), and the claim as a whole is checked against the 32-result limit.
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise RequestError(f"{where}.count must be a positive integer, got {count!r}")
    return Alternative(
        result_name,
        class_name,
        sels + fields.tolerations_selector(tols),
        count,
        ShareSpec(capacity) if capacity is not None else None,
        capacity is not None,
        tols,
        mode == "All",
        admin,
    )


@dataclass(frozen=True, slots=True)
class PercentConfig:
    """A `SharedGpuRequest` opaque config of a claim: where it is, the requests it names, its percent."""

    where: str  # "claim ns/name spec.devices.config[i]"
    names: tuple[str, ...]  # empty: every request of the claim
    percent: int


def _percent_configs(claim: Mapping[str, Any], key: str) -> list[PercentConfig]:
    """Every opaque config of the claim for our driver, decoded strictly (api/opaqueconfig.py): a config
    for gpu.flexmig.dev that is not a known type is an error, never ignored (a typo in `kind` would
    otherwise hand the pod the whole GPU instead of its percentage)."""
    out = []
    for i, cfg in enumerate(((claim.get("spec") or {}).get("devices") or {}).get("config") or ()):
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        where = f"claim {key} spec.devices.config[{i}]"
        try:
            decoded = decode_parameters(f"{where}.opaque.parameters", opaque.get("parameters"))
        except OpaqueConfigError as exc:
            raise RequestError(str(exc)) from exc
        out.append(PercentConfig(where, tuple(cfg.get("requests") or ()), decoded.memory_percentage))
    return out


def _applies(cfg: PercentConfig, alt: Alternative) -> bool:
    return not cfg.names or alt.result_name in cfg.names or alt.request_name in cfg.names


def _with_percent(alt: Alternative, percents: list[PercentConfig], where: str) -> Alternative:
    mine = sorted({c.percent for c in percents if _applies(c, alt)})
    if not mine:
        return alt
    if len(mine) > 1:
        raise RequestError(f"{where}: more than one SharedGpuRequest memoryPercentage applies: {mine}")
    requests = dict(alt.share.requests) if alt.share is not None else {}
    if "memory" in requests:
        raise RequestError(
            f"{where}: capacity.requests.memory and SharedGpuRequest.memoryPercentage both set; use one"
        )
    return replace(alt, share=ShareSpec(requests, mine[0]))


def _check_names(percents: list[PercentConfig], out: list[ClaimRequest]) -> None:
    """A config naming no request of the claim would be silently dropped; refuse it."""
    known = {n for r in out for a in r.alternatives for n in (a.result_name, a.request_name)}
    for cfg in percents:
        missing = [n for n in cfg.names if n not in known]
        if missing:
            raise RequestError(
                f"{cfg.where}.requests: {', '.join(map(repr, missing))} names no request of the claim; "
                f"allowed: {', '.join(sorted(known))}"
            )


def claim_requests(
    claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]], index: CandidateIndex
) -> list[ClaimRequest]:
    """The requests of one claim with their alternatives (RequestError for what cannot be served).

    `index` tells which alternatives HAMi-core shares can serve: a memoryPercentage config that applies
    only to requests no share can serve would be dropped silently, so it is refused."""
    meta = claim.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    try:
        fields.check_constraints(key, claim)
    except fields.FieldError as exc:
        raise RequestError(str(exc)) from exc
    percents = _percent_configs(claim, key)
    out = []
    for i, req in enumerate(_spec_requests(claim)):
        name = req.get("name") or f"#{i}"
        where = f"claim {key} spec.devices.requests[{name}]"
        path = f"claim {key} spec.devices.requests[{i}]"
        alts: tuple[Alternative, ...]
        if req.get("exactly"):
            alts = (_alternative(f"{where}.exactly", name, req["exactly"], classes, f"{path}.exactly"),)
        elif req.get("firstAvailable"):
            alts = tuple(
                _alternative(
                    f"{where}.firstAvailable[{sub.get('name')}]",
                    f"{name}/{sub.get('name')}",
                    sub,
                    classes,
                    f"{path}.firstAvailable[{k}]",
                )
                for k, sub in enumerate(req["firstAvailable"])
            )
        else:
            raise RequestError(f"{where}: one of exactly or firstAvailable is required")
        if percents:
            alts = tuple(_with_percent(a, percents, where) for a in alts)
        out.append(ClaimRequest(key, name, alts))
    if not out:
        raise RequestError(f"claim {key} has no device requests")
    _check_result_limit(key, out)
    if percents:
        _check_names(percents, out)
        _check_percent_targets(percents, out, index)
    return out


def _check_result_limit(key: str, out: list[ClaimRequest]) -> None:
    """The API takes at most 32 results per claim: refuse a claim whose least count over its requests'
    alternatives exceeds it, as upstream does, before anything is written (the write would get a 422)."""
    least = sum(min(a.count for a in r.alternatives) for r in out)
    if least > fields.ALLOCATION_RESULTS_MAX:
        counts = ", ".join(f"{r.name}: {min(a.count for a in r.alternatives)}" for r in out)
        raise RequestError(
            f"claim {key} spec.devices.requests ask for {least} devices ({counts}); a claim holds at most "
            f"{fields.ALLOCATION_RESULTS_MAX} (AllocationResultsMaxSize): split the requests over "
            "several claims"
        )


def _check_percent_targets(
    percents: list[PercentConfig], out: list[ClaimRequest], index: CandidateIndex
) -> None:
    """A named request must have an alternative shares can serve; a config naming no request must
    apply to at least one such alternative of the claim (it is meant for the claim's shared requests)."""
    for cfg in percents:
        targets = [a for r in out for a in r.alternatives if _applies(cfg, a)]
        if cfg.names:
            for r in out:
                alts = [a for a in r.alternatives if _applies(cfg, a)]
                if alts and not any(index.may_share(a) for a in alts):
                    raise _no_share(cfg, ", ".join(a.result_name for a in alts))
        elif not any(index.may_share(a) for a in targets):
            raise _no_share(cfg, "every request of the claim")


def _no_share(cfg: PercentConfig, what: str) -> RequestError:
    return RequestError(
        f"{cfg.where}: SharedGpuRequest.memoryPercentage applies to {what}, which only MIG or whole-GPU "
        "devices serve; a percentage is for shares of HAMi-core GPUs: name a request whose class is "
        "hami-core.gpu.flexmig.dev (or that asks for capacity), or remove the config"
    )
