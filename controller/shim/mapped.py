"""Kubernetes' own mapping of extended resources onto DRA (KEP-5004): a DeviceClass with
`spec.extendedResourceName` lets a pod ask for `<name>: N` in its limits, and kube-scheduler creates
and allocates the claim itself (first fit among published devices), recording it in
`pod.status.extendedResourceClaimStatus`.

flexmig's DeviceClasses may carry such a name (chart values `deviceClasses.*.extendedResourceName`;
the webhook learns them from `--mapped-resources`). This module keeps the shim and the mapping from
both acting on one pod, and one pod from having two allocators:

- The mapped name is the shim's count resource (`nvidia.com/gpu`): a pod whose every GPU container
  asks for that count and nothing else (no gpumem, gpucores, ..., no `nvidia.com/vgpu-mode` or other
  HAMi annotation, no flexmig claim of its own) is left to the mapping, unchanged and ungated. Any other
  pod is translated whole: the shim removes `nvidia.com/gpu` from every container, so the mapping
  never sees it, and the controller allocates every device of the pod.
- Any other mapped name (e.g. `gpu.flexmig.dev/mig`) is the mapping's alone. In a pod that also has
  devices the controller allocates (shim-translated or its own flexmig claims) it is denied: the
  controller would pick the node without knowing it, and kube-scheduler could then find no device
  there and clear the controller's allocation.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from api.constants import ANNOTATION_VGPU_MODE
from controller.shim.defaults import ShimDefaults
from controller.shim.migprofile import MIG_RESOURCE_PREFIX
from controller.shim.selection import POLICY_ANNOTATIONS, SELECTION_ANNOTATIONS

_CONTAINER_FIELDS = (("initContainers", "init container"), ("containers", "container"))
_HAMI_ANNOTATIONS = (ANNOTATION_VGPU_MODE, *SELECTION_ANNOTATIONS, *POLICY_ANNOTATIONS)


def _keys(container: Mapping[str, Any]) -> set[str]:
    resources = container.get("resources") or {}
    return {str(k) for part in ("limits", "requests") for k in resources.get(part) or {}}


def _shim_reads(key: str, defaults: ShimDefaults) -> bool:
    return key in defaults.names.removed or key.startswith(MIG_RESOURCE_PREFIX)


def left_to_mapping(
    translated: Iterable[Mapping[str, Any]],
    annotations: Mapping[str, Any] | None,
    defaults: ShimDefaults,
    has_flexmig_claims: bool,
) -> bool:
    """Whether the pod whose GPU containers are `translated` is the mapping's to serve (see above)."""
    count = defaults.names.count
    if count not in defaults.mapped_resources or has_flexmig_claims:
        return False
    if any(key in (annotations or {}) for key in _HAMI_ANNOTATIONS):
        return False  # they ask for something only the shim can honour (or refuse)
    containers = list(translated)
    return bool(containers) and all(
        {k for k in _keys(c) if _shim_reads(k, defaults)} == {count} for c in containers
    )


def mixing_problems(spec: Mapping[str, Any], defaults: ShimDefaults) -> list[str]:
    """For a pod whose devices the controller allocates: each container asking for a mapped name the
    shim does not translate."""
    mapped = {m for m in defaults.mapped_resources if not _shim_reads(m, defaults)}
    problems: list[str] = []
    for field, kind in _CONTAINER_FIELDS:
        for c in spec.get(field) or []:
            used = sorted(_keys(c) & mapped)
            if used:
                problems.append(
                    f'{kind} "{c.get("name", "?")}": {", ".join(used)} is served by Kubernetes\' '
                    "extended-resource mapping (kube-scheduler allocates it), which cannot be combined "
                    "in one pod with devices flexmig's controller allocates (allowed: ask for all of the "
                    "pod's GPUs one way: only mapped extended resources, or ResourceClaims and "
                    f"{defaults.names.count}-style requests)"
                )
    return problems


__all__ = ["left_to_mapping", "mixing_problems"]
