"""HAMi's per-pod selection and scheduler-policy annotations: honoured where flexmig does the same
thing, refused (with what to write instead) where it cannot, never silently ignored.

A pod written for HAMi that says "H100 only" (`nvidia.com/use-gputype: H100`) must not land on an
A100. The shim cannot honour the model and UUID selections: its claims come from ResourceClaimTemplates
whose *name* fixes their body (controller/shim/templates.py `shape_from_name`, created by the leader from
the name alone), and a free-form model list or UUID list has no place in such a name. So these pods are
denied, and the denial names the annotation and gives the claim selector that does the same on the
published attributes (api/devicecontract.py: `productName`; `parentUUID` on MIG devices, `uuid` on whole
and shared GPUs), to use in a ResourceClaim (docs/compat-shim.md, "HAMi's selection annotations").

HAMi's scheduler policies: `binpack` is what flexmig's placement does anyway (it prices each placement
by the capacity it destroys, so it fills used GPUs and nodes before it breaks a whole one), so it is
accepted; `spread` (or anything else) is refused, because flexmig has no spreading placement.
Pure: no I/O. Only pods with legacy `nvidia.com/*` resources are held to these (as for vgpu-mode).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from api.constants import DRIVER_NAME
from api.devicecontract import ATTR_PARENT_UUID, ATTR_PRODUCT_NAME, ATTR_UUID

USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
USE_GPUUUID = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
SELECTION_ANNOTATIONS = (USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID)
POLICY_ANNOTATIONS = (NODE_POLICY, GPU_POLICY)
ACCEPTED_POLICY = "binpack"
_MAX_SHOWN = 120  # an annotation value is the user's text echoed back: keep the denial readable


def _values(raw: Any) -> list[str]:
    """HAMi's comma-separated list."""
    return [v.strip() for v in str(raw).split(",") if v.strip()]


def _shown(raw: Any) -> str:
    text = str(raw)
    return repr(text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...")


def _attr(name: str) -> str:
    return f'device.attributes["{DRIVER_NAME}"].{name}'


def suggested_selector(annotation: str, raw: Any) -> str:
    """The CEL selector of a ResourceClaim request that selects what the annotation asked HAMi for."""
    values = _values(raw)[:8]
    if annotation in (USE_GPUTYPE, NOUSE_GPUTYPE):
        # HAMi matches a model whose name contains the value, ignoring case. flexmig's CEL runtime has
        # no lowerAscii, so the value is tried as written and upper-cased (NVML names are upper-case).
        forms = list(dict.fromkeys(f for v in values for f in (v, v.upper())))
        terms = [f"{_attr(ATTR_PRODUCT_NAME)}.contains({json.dumps(f)})" for f in forms]
    else:
        uuid = f"(has({_attr(ATTR_PARENT_UUID)}) ? {_attr(ATTR_PARENT_UUID)} : {_attr(ATTR_UUID)})"
        terms = [f"{uuid} in {json.dumps(values)}"] if values else []
    expression = " || ".join(terms) or "true"
    return f"!({expression})" if annotation.startswith("nvidia.com/nouse-") else expression


def selection_problems(annotations: Mapping[str, Any] | None) -> list[str]:
    """One denial line per HAMi selection or policy annotation flexmig cannot honour; [] when none."""
    if not annotations:
        return []
    problems: list[str] = []
    for key in SELECTION_ANNOTATIONS:
        if key not in annotations:
            continue
        what = "GPU model" if "gputype" in key else "GPU UUID"
        problems.append(
            f"annotation {key}={_shown(annotations[key])} is not supported: flexmig's shim cannot "
            f"restrict the {what} of a rewritten request, and ignoring it could place the pod on a GPU "
            f"it excludes. Remove it and ask for the devices with a ResourceClaim (class "
            f"mig.gpu.flexmig.dev or hami-core.gpu.flexmig.dev) whose request has the selector "
            f"{suggested_selector(key, annotations[key])} (docs/compat-shim.md)"
        )
    for key in POLICY_ANNOTATIONS:
        if key in annotations and annotations[key] != ACCEPTED_POLICY:
            problems.append(
                f"annotation {key}={_shown(annotations[key])} is not supported (allowed: "
                f"{ACCEPTED_POLICY!r}, which is what flexmig's placement does anyway, or no annotation): "
                "flexmig packs devices to keep whole GPUs free and has no spreading placement"
            )
    return problems


__all__ = [
    "ACCEPTED_POLICY",
    "POLICY_ANNOTATIONS",
    "SELECTION_ANNOTATIONS",
    "selection_problems",
    "suggested_selector",
]
