"""The compatibility shim's pure logic: HAMi-style pods (`nvidia.com/gpu`, `gpumem`, ...) rewritten onto
flexmig ResourceClaims, plus the allocation gate. No I/O: the webhook (`controller/webhook/`) serves it.
User-facing behaviour: docs/compat-shim.md.
"""

from controller.shim.defaults import ShimConfigError, ShimDefaults, parse_shim_defaults
from controller.shim.legacy import AdmissionDenied, Mode, Shape
from controller.shim.mutate import MutationResult, mutate_pod, template_names_used_by
from controller.shim.templates import TemplateSpec, is_shim_template

__all__ = [
    "AdmissionDenied",
    "Mode",
    "MutationResult",
    "Shape",
    "ShimConfigError",
    "ShimDefaults",
    "TemplateSpec",
    "is_shim_template",
    "mutate_pod",
    "parse_shim_defaults",
    "template_names_used_by",
]
