"""The ResourceClaimTemplates the shim references: one per (namespace, shape), with a readable,
deterministic name, so that admitting the same legacy request twice names the same template.

Body shapes are contract C3 (docs/architecture.md): request `gpus`; mode mig selects MIG devices by a CEL
selector on memory (MiB, or percent of the parent GPU through the `gpuMemorySlices` attribute) and
compute; mode hami-core asks for consumable capacity on a shared GPU; mode any offers both as
`firstAvailable` alternatives and the controller picks what packs better.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api import devicecontract as dc
from api.constants import DRIVER_NAME
from api.opaqueconfig import SharedGpuRequest
from controller.shim.legacy import Mode, Shape
from controller.shim.migprofile import ProfileShape, profile_from_slug, slug

AnyShape = Shape | ProfileShape
"""What a shim template stands for: a HAMi request, or N instances of one MIG profile."""

API_VERSION = "resource.k8s.io/v1"
REQUEST_NAME = "gpus"
MIG_DEVICE_CLASS = f"mig.{DRIVER_NAME}"
HAMI_CORE_DEVICE_CLASS = f"hami-core.{DRIVER_NAME}"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "flexmig"
LABEL_SHIM_TEMPLATE = f"{DRIVER_NAME}/shim-template"
SHIM_TEMPLATE_VERSION = "v1"
ANNOTATION_SHAPE = f"{DRIVER_NAME}/shape"
UUID_ATTRIBUTE = f"{DRIVER_NAME}/{dc.ATTR_UUID}"
PARENT_UUID_ATTRIBUTE = f"{DRIVER_NAME}/{dc.ATTR_PARENT_UUID}"
DISTINCT_SUFFIX = "-d"
"""Ends the name of a template whose MIG devices must sit on different GPUs (count > 1), so a template
written before that rule (same shape, no constraint) is never reused for it."""


@dataclass(frozen=True)
class TemplateSpec:
    """A ResourceClaimTemplate a rewritten pod names (the controller creates it once the pod exists,
    idempotently: same namespace and name means same body)."""

    namespace: str
    name: str
    body: dict[str, Any]


def template_name(shape: AnyShape) -> str:
    """e.g. `flexmig-any-2x8000mi-c0-d`, `flexmig-mig-1x50pct-c30`: a DNS subdomain (and label) that
    says the shape (`-d`: MIG devices on distinct GPUs). At most 38 characters ("flexmig-hami-core-32x1073741824mi-c100"), never truncated.
    A MIG profile: `flexmig-profile-1x-3g20gb`, `flexmig-profile-2x-1g10gb-me` (profile slugs: migprofile.py)."""
    if isinstance(shape, ProfileShape):
        return f"{_PROFILE_PREFIX}{shape.count}x-{slug(shape.profile)}"
    memory = f"{shape.memory_mib}mi" if shape.memory_mib is not None else f"{shape.memory_percent}pct"
    distinct = DISTINCT_SUFFIX if shape.count > 1 and shape.mode is not Mode.HAMI_CORE else ""
    return f"flexmig-{shape.mode.value}-{shape.count}x{memory}-c{shape.cores}{distinct}"


_NAME_RE = re.compile(
    r"flexmig-(?P<mode>mig|hami-core|any)-(?P<count>[0-9]+)x(?:(?P<mib>[0-9]+)mi|(?P<pct>[0-9]+)pct)"
    rf"-c(?P<cores>[0-9]+)(?:{DISTINCT_SUFFIX})?"
)


_PROFILE_PREFIX = "flexmig-profile-"
_PROFILE_NAME_RE = re.compile(rf"{_PROFILE_PREFIX}(?P<count>[0-9]+)x-(?P<slug>.+)")


def _profile_shape_from_name(name: str) -> ProfileShape | None:
    m = _PROFILE_NAME_RE.fullmatch(name)
    profile = profile_from_slug(m["slug"]) if m else None
    if m is None or profile is None:
        return None
    try:
        shape = ProfileShape(count=int(m["count"]), profile=profile)
    except ValueError:  # out of the shim's ranges
        return None
    return shape if template_name(shape) == name else None


def shape_from_name(name: object) -> AnyShape | None:
    """The shape a shim template name stands for, or None if `template_name` would never write it
    (so a name that parses always gives back the same template body: names are deterministic)."""
    if not isinstance(name, str) or len(name) > 64:
        return None
    if name.startswith(_PROFILE_PREFIX):
        return _profile_shape_from_name(name)
    m = _NAME_RE.fullmatch(name)
    if m is None:
        return None
    try:
        shape = Shape(
            count=int(m["count"]),
            memory_mib=None if m["mib"] is None else int(m["mib"]),
            memory_percent=None if m["pct"] is None else int(m["pct"]),
            cores=int(m["cores"]),
            mode=Mode(m["mode"]),
        )
    except ValueError:  # out of the shim's ranges
        return None
    return shape if template_name(shape) == name else None  # leading zeros, a misplaced -d


def describe(shape: AnyShape) -> str:
    """The shape in words, for the template's annotation and the webhook's log."""
    if isinstance(shape, ProfileShape):
        instances = "1 MIG instance" if shape.count == 1 else f"{shape.count} MIG instances"
        return f"{instances} of profile {shape.profile} ({shape.resource})"
    memory = (
        f">= {shape.memory_mib} MiB"
        if shape.memory_mib is not None
        else f">= {shape.memory_percent}% of its GPU's memory"
    )
    devices = "1 GPU device" if shape.count == 1 else f"{shape.count} GPU devices"
    where = {
        Mode.MIG: "MIG instances only",
        Mode.HAMI_CORE: "shared GPUs on hami-core nodes only",
        Mode.ANY: "MIG instance or shared GPU",
    }[shape.mode]
    compute = f" and >= {shape.cores}% of its GPU's compute" if shape.cores else ""
    return f"{devices}, each {memory}{compute} ({where})"


def _attr(name: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].{name}'


def mig_selector(shape: Shape) -> str:
    """The CEL selector that admits MIG devices big enough for the shape.

    Percent is compared in slices, exactly, with integers only: a device with k of the GPU's n memory
    slices holds at least p% when k*100 >= p*n (HAMi resolves percent against the parent's memory;
    slices are what the hardware divides, so "50%" of an A100 is a 4-slice instance, 3g.20gb).
    """
    if shape.memory_mib is not None:
        expr = f'device.capacity["{DRIVER_NAME}"].{dc.CAP_MEMORY}.compareTo(quantity("{shape.memory_mib}Mi")) >= 0'
    else:
        expr = f"{_attr(dc.ATTR_MEMORY_SLICES)} * 100 >= {shape.memory_percent} * {_attr(dc.ATTR_GPU_MEMORY_SLICES)}"
    if shape.cores > 0:
        expr += f" && {_attr(dc.ATTR_COMPUTE_SLICES)} * 100 >= {shape.cores} * {_attr(dc.ATTR_GPU_COMPUTE_SLICES)}"
    return expr


def _mig_fields(shape: Shape) -> dict[str, Any]:
    return {
        "deviceClassName": MIG_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": shape.count,
        "selectors": [{"cel": {"expression": mig_selector(shape)}}],
    }


def _hami_fields(shape: Shape) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if shape.memory_mib is not None:
        # A percent leaves memory out: the request policy's default is the whole GPU, and the
        # controller reads the percentage from the opaque config instead.
        requests[dc.CAP_MEMORY] = f"{shape.memory_mib}Mi"
    requests[dc.CAP_CORES] = str(shape.cores)
    return {
        "deviceClassName": HAMI_CORE_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": shape.count,
        "capacity": {"requests": requests},
    }


def profile_selector(shape: ProfileShape) -> str:
    """MIG devices of exactly the profile: the name the node publishes is NVIDIA's, so it also picks
    the models, as the device plugin's resource did (`3g.20gb` exists on A100-40GB and A800-40GB)."""
    return f"{_attr(dc.ATTR_PROFILE)} == {json.dumps(shape.profile)}"


def _profile_claim_spec(shape: ProfileShape) -> dict[str, Any]:
    # No distinct-GPU constraint: the device plugin hands out N instances of a profile from any GPUs,
    # several from one GPU included, and so does this claim.
    exactly = {
        "deviceClassName": MIG_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": shape.count,
        "selectors": [{"cel": {"expression": profile_selector(shape)}}],
    }
    return {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}


def claim_spec(shape: AnyShape) -> dict[str, Any]:
    """The ResourceClaimSpec (`spec.spec` of the template) for a shape."""
    if isinstance(shape, ProfileShape):
        return _profile_claim_spec(shape)
    request: dict[str, Any] = {"name": REQUEST_NAME}
    hami_ref = REQUEST_NAME
    if shape.mode is Mode.MIG:
        request["exactly"] = _mig_fields(shape)
    elif shape.mode is Mode.HAMI_CORE:
        request["exactly"] = _hami_fields(shape)
    else:
        request["firstAvailable"] = [
            {"name": "mig", **_mig_fields(shape)},
            {"name": "hami-core", **_hami_fields(shape)},
        ]
        hami_ref = f"{REQUEST_NAME}/hami-core"
    devices: dict[str, Any] = {"requests": [request]}
    constraints: list[dict[str, Any]] = []
    if shape.mode is not Mode.HAMI_CORE and shape.count > 1:
        # HAMi's nvidia.com/gpu: N means N different physical GPUs, in MIG mode too: each MIG device
        # of the request on its own parent GPU. Several instances on one GPU take a ResourceClaim.
        mig_ref = REQUEST_NAME if shape.mode is Mode.MIG else f"{REQUEST_NAME}/mig"
        constraints.append({"requests": [mig_ref], "distinctAttribute": PARENT_UUID_ATTRIBUTE})
    if constraints:
        devices["constraints"] = constraints
    if shape.mode is not Mode.MIG:
        if shape.count > 1:
            # Two shares of one GPU are not two GPUs.
            devices["constraints"] = [
                *constraints,
                {"requests": [hami_ref], "distinctAttribute": UUID_ATTRIBUTE},
            ]
        if shape.memory_percent is not None:
            devices["config"] = [
                {
                    "requests": [hami_ref],
                    "opaque": {
                        "driver": DRIVER_NAME,
                        # The api/ type writes it, so the controller's strict decoder reads it back.
                        "parameters": SharedGpuRequest(shape.memory_percent).to_parameters(),
                    },
                }
            ]
    return {"devices": devices}


def template_for(namespace: str, shape: AnyShape) -> TemplateSpec:
    name = template_name(shape)
    body = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SHIM_TEMPLATE: SHIM_TEMPLATE_VERSION},
            "annotations": {ANNOTATION_SHAPE: describe(shape)},
        },
        # Generated claims carry the shim label (the controller keeps the strand-least firstAvailable
        # rule for them only); the stored spec equals this one, so the webhook can compare versions.
        "spec": {
            "metadata": {"labels": {LABEL_SHIM_TEMPLATE: SHIM_TEMPLATE_VERSION}},
            "spec": claim_spec(shape),
        },
    }
    return TemplateSpec(namespace=namespace, name=name, body=body)


def is_shim_template(obj: Mapping[str, Any]) -> bool:
    """Whether a ResourceClaimTemplate was written by the shim (by its labels; contract C3)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(LABEL_MANAGED_BY) == MANAGED_BY
        and labels.get(LABEL_SHIM_TEMPLATE) == SHIM_TEMPLATE_VERSION
    )
