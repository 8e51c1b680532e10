"""The pod rewrite: legacy `nvidia.com/*` containers onto ResourceClaims, and the allocation gate.

Pure: the webhook hands in the pod of an admission request (CREATE only), the namespace, the
device-config defaults and a lookup that tells whether a pod claim uses a flexmig DeviceClass
(None: the claim or template does not exist, which is denied); it gets back an RFC 6902 patch, the templates the pod will name, and a log line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.constants import ALLOCATION_GATE, DNS_LABEL_MAX
from controller.kube.names import subdomain_problem
from controller.shim.defaults import ShimDefaults
from controller.shim.legacy import (
    REMOVED_RESOURCES,
    AdmissionDenied,
    container_shape,
    has_legacy_resources,
    vgpu_mode,
)
from controller.shim.mapped import left_to_mapping, mixing_problems
from controller.shim.migprofile import (
    MIG_RESOURCE_PREFIX,
    allowed_profiles,
    container_profile_shapes,
    has_profile_resources,
)
from controller.shim.selection import selection_problems
from controller.shim.templates import AnyShape, TemplateSpec, describe, template_for

# Init containers first: the order HAMi counts containers in, and the order they run.
_CONTAINER_FIELDS = (("initContainers", "init container"), ("containers", "container"))
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
_CLAIM_SUFFIX = "-gpu"


@dataclass(frozen=True)
class MutationResult:
    patch: list[dict[str, Any]]
    """RFC 6902 JSON patch ops against the pod ([] = unchanged)."""
    templates: tuple[TemplateSpec, ...]
    """Templates the patched pod names (created by the controller once the pod exists, never by the
    review: controller/webhook/templatesync.py)."""
    gated: bool
    """Whether the gate gpu.flexmig.dev/allocation is added."""
    reason: str
    """Short log text: what was done and why."""
    shapes: tuple[AnyShape, ...] = ()
    """What each new claim asks for, one entry per claim (the webhook checks namespace quotas on it)."""


@dataclass(frozen=True)
class _Rewrite:
    field: str
    index: int
    container: Mapping[str, Any]
    shapes: tuple[AnyShape, ...]
    """One claim each: a HAMi request is one shape, each nvidia.com/mig-<profile> resource another."""
    removed: Callable[[str], bool]
    """Whether a resource key of the container is taken out by the rewrite."""


def _claim_name(container_name: str, taken: set[str]) -> str:
    """`<container>-gpu` as a DNS label, not colliding with the pod's other claim names."""
    stem = _NOT_LABEL.sub("-", str(container_name).lower()).strip("-") or "container"
    for k in range(1, len(taken) + 2):
        suffix = _CLAIM_SUFFIX if k == 1 else f"{_CLAIM_SUFFIX}-{k}"
        name = stem[: DNS_LABEL_MAX - len(suffix)].rstrip("-") + suffix
        if name not in taken:
            return name
    raise AssertionError("unreachable: len(taken) + 1 candidates cannot all be taken")


def _rewritten_resources(
    resources: Mapping[str, Any] | None,
    claims: Sequence[str],
    removed: Callable[[str], bool] = REMOVED_RESOURCES.__contains__,
) -> dict[str, Any]:
    """The container's resources without the legacy keys and nvidia.com/priority (an emptied limits/requests map is dropped:
    an empty map and no map mean the same to Kubernetes) and with the claim added."""
    out: dict[str, Any] = dict(resources or {})
    for part in ("limits", "requests"):
        if part not in out:
            continue
        kept = {k: v for k, v in (out[part] or {}).items() if not removed(str(k))}
        if kept:
            out[part] = kept
        else:
            del out[part]
    out["claims"] = [*(out.get("claims") or []), *({"name": claim} for claim in claims)]
    return out


def _append(path: str, current: Sequence[Any] | None, items: Sequence[Any]) -> list[dict[str, Any]]:
    """Ops appending items to a list that may be absent (or null): create it whole, else add at '-'."""
    if not items:
        return []
    if current is None:
        return [{"op": "add", "path": path, "value": list(items)}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]


def _is_profile_resource(key: str) -> bool:
    return key.startswith(MIG_RESOURCE_PREFIX)


def _rewrites(
    spec: Mapping[str, Any], annotations: Mapping[str, Any] | None, defaults: ShimDefaults
) -> list[_Rewrite]:
    # A container with HAMi resources is read as HAMi's (an nvidia.com/mig-* beside them is denied
    # there); one with only nvidia.com/mig-<profile> resources as the device plugin's.
    found = [
        (field, kind, i, c, has_legacy_resources(c, defaults.names))
        for field, kind in _CONTAINER_FIELDS
        for i, c in enumerate(spec.get(field) or [])
        if has_legacy_resources(c, defaults.names) or has_profile_resources(c)
    ]
    if not found:
        return []
    mode = vgpu_mode(annotations)  # only a pod with GPU resources is held to the annotation
    # HAMi's selection and policy annotations: honoured or refused, never ignored (selection.py).
    errors: list[str] = selection_problems(annotations)
    legacy_keys = set(defaults.names.removed)
    out: list[_Rewrite] = []
    for field, kind, i, container, legacy in found:
        try:
            if legacy:
                shape = container_shape(container, mode, defaults, kind)
                shapes: tuple[AnyShape, ...] = () if shape is None else (shape,)
                removed: Callable[[str], bool] = legacy_keys.__contains__
            else:
                allowed = allowed_profiles(defaults.allowlist)
                shapes = tuple(container_profile_shapes(container, mode, allowed, kind))
                removed = _is_profile_resource
        except AdmissionDenied as exc:
            errors.append(exc.message)  # every container's problems in one answer
            continue
        if shapes:
            out.append(_Rewrite(field, i, container, shapes, removed))
    if errors:
        raise AdmissionDenied("; ".join(errors))
    return out


def _flexmig_claims(
    entries: Sequence[Any], namespace: str, claim_uses_flexmig: Callable[[Mapping[str, Any]], bool | None]
) -> list[str]:
    """Names of the pod claims that use flexmig devices; a claim or template name the API server would
    refuse is denied before anything is looked up. A claim or template that does not exist yet
    is denied: admitted ungated, kube-scheduler would allocate flexmig devices behind the controller
    once it appears. The denial is retryable; controllers (Jobs, Deployments) create the pod again."""
    invalid = [
        problem
        for i, entry in enumerate(entries)
        if isinstance(entry, Mapping)
        for field in ("resourceClaimName", "resourceClaimTemplateName")
        if entry.get(field) is not None
        and (problem := subdomain_problem(f"spec.resourceClaims[{i}].{field}", entry[field]))
    ]
    if invalid:
        # Checked before any lookup: the names become request paths in the namespace's API.
        raise AdmissionDenied("; ".join(invalid))
    ours: list[str] = []
    missing: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        answer = claim_uses_flexmig(entry)
        if answer is True:
            ours.append(str(entry.get("name")))
        elif answer is None:
            field = "resourceClaimName" if entry.get("resourceClaimName") else "resourceClaimTemplateName"
            kind = "ResourceClaim" if field == "resourceClaimName" else "ResourceClaimTemplate"
            missing.append(
                f"spec.resourceClaims[{i}].{field}: {kind} {entry.get(field)!r} does not exist in "
                f"namespace {namespace!r}"
            )
    if missing:
        raise AdmissionDenied(
            "; ".join(missing) + " (create it before the pod; flexmig must know whether it asks for "
            "flexmig devices, and controllers retry the pod)"
        )
    return ours


def mutate_pod(
    pod: Mapping[str, Any],
    namespace: str,
    defaults: ShimDefaults,
    claim_uses_flexmig: Callable[[Mapping[str, Any]], bool | None],
) -> MutationResult:
    """Rewrite a pod being created; raises AdmissionDenied for input the shim cannot serve."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    metadata: Mapping[str, Any] = pod.get("metadata") or {}
    gates = spec.get("schedulingGates")
    if any(isinstance(g, Mapping) and g.get("name") == ALLOCATION_GATE for g in gates or []):
        # The webhook sees only CREATE, so the gate can only come from the pod's author; a pod gated
        # by hand that the controller does not allocate would wait forever.
        raise AdmissionDenied(
            f"spec.schedulingGates: {ALLOCATION_GATE} is set by hand (allowed: leave it out; flexmig "
            "adds it to pods that ask for GPUs and removes it once their devices are allocated)"
        )
    rewrites = _rewrites(spec, metadata.get("annotations"), defaults)
    existing = [c for c in spec.get("resourceClaims") or [] if isinstance(c, Mapping)]
    ours = _flexmig_claims(spec.get("resourceClaims") or [], namespace, claim_uses_flexmig)
    if not rewrites and not ours:
        return MutationResult([], (), False, "no GPU request and no flexmig claim: unchanged")
    # Kubernetes' extended-resource mapping and the shim never both act on one pod (mapped.py).
    if left_to_mapping((r.container for r in rewrites), metadata.get("annotations"), defaults, bool(ours)):
        return MutationResult(
            [], (), False, f"only {defaults.names.count} counts: left to the extended-resource mapping"
        )
    if mixed := mixing_problems(spec, defaults):
        raise AdmissionDenied("; ".join(mixed))
    if spec.get("nodeName"):
        if rewrites:
            names = ", ".join(str(r.container.get("name")) for r in rewrites)
            raise AdmissionDenied(
                f"spec.nodeName is set and container(s) {names} ask for {defaults.names.count} or "
                f"{MIG_RESOURCE_PREFIX}<profile>: flexmig must choose "
                "the node and the devices together (allowed: leave spec.nodeName out; use a nodeSelector)"
            )
        # A gate cannot be combined with nodeName; such a pod can only use already-allocated claims.
        return MutationResult(
            [], (), False, f"flexmig claim(s) {', '.join(ours)} but nodeName set: not gated"
        )

    patch: list[dict[str, Any]] = []
    templates: dict[str, TemplateSpec] = {}
    taken = {str(c.get("name")) for c in existing}
    new_claims: list[dict[str, Any]] = []
    done: list[str] = []
    for r in rewrites:
        claims: list[str] = []
        for shape in r.shapes:
            built = template_for(namespace, shape)
            template = templates.setdefault(built.name, built)
            claim = _claim_name(str(r.container.get("name", "")), taken)
            taken.add(claim)
            claims.append(claim)
            new_claims.append({"name": claim, "resourceClaimTemplateName": template.name})
            done.append(f"{r.container.get('name')} -> claim {claim} ({template.name}: {describe(shape)})")
        patch.append(
            {
                "op": "add",  # "add" on an existing member replaces it (RFC 6902 4.1)
                "path": f"/spec/{r.field}/{r.index}/resources",
                "value": _rewritten_resources(r.container.get("resources"), claims, r.removed),
            }
        )
    patch += _append("/spec/resourceClaims", spec.get("resourceClaims"), new_claims)
    patch += _append("/spec/schedulingGates", gates, [{"name": ALLOCATION_GATE}])
    parts = []
    if done:
        parts.append("rewrote " + "; ".join(done))
    if ours:
        parts.append(f"flexmig claim(s) {', '.join(ours)}")
    shapes = tuple(shape for r in rewrites for shape in r.shapes)
    return MutationResult(patch, tuple(templates.values()), True, ", ".join(parts) + "; gated", shapes)


def template_names_used_by(pod: Mapping[str, Any]) -> set[str]:
    """Every ResourceClaimTemplate the pod's claims are made from (shim templates among them), so
    the garbage collector keeps templates a live pod still names."""
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    return {
        c["resourceClaimTemplateName"]
        for c in claims
        if isinstance(c, Mapping) and isinstance(c.get("resourceClaimTemplateName"), str)
    }
