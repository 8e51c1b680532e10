"""Property: any valid legacy combination, in any containers, gives a patch that applies cleanly to the
pod, leaves no nvidia.com/* resource, points every container at its own claim whose template is in
the result, and gates the pod exactly once."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from shim_helpers import apply_patch, legacy_keys_left

from controller.claims.cel import CelEnvironment
from controller.shim import ShimDefaults, is_shim_template, mutate_pod
from controller.shim.legacy import Mode, container_shape
from controller.shim.templates import mig_selector

GATE = "gpu.flexmig.dev/allocation"
ENV = CelEnvironment()

quantity_of = st.sampled_from(["plain", "int", "canonical"])


def spell(value: int, how: str) -> Any:
    if how == "int":
        return value
    if how == "canonical" and value % 1000 == 0 and value:
        return f"{value // 1000}k"  # how the API server writes 8000
    return str(value)


@st.composite
def legacy_limits(draw: st.DrawFn) -> dict[str, Any]:
    how = draw(quantity_of)
    limits: dict[str, Any] = {}
    if draw(st.booleans()):
        limits["nvidia.com/gpu"] = spell(draw(st.integers(1, 32)), how)
    memory = draw(st.sampled_from(["none", "mib", "pct"]))
    if memory == "mib":
        limits["nvidia.com/gpumem"] = spell(
            draw(st.sampled_from([0, 1, 1000, 4864, 8000, 40192, 2**30])), how
        )
    elif memory == "pct":
        limits["nvidia.com/gpumem-percentage"] = spell(draw(st.integers(1, 100)), how)
    if draw(st.booleans()):
        limits["nvidia.com/gpucores"] = spell(draw(st.integers(0, 100)), how)
    if not limits:
        limits["nvidia.com/gpu"] = "1"
    if draw(st.booleans()):
        limits["cpu"] = "500m"
    return limits


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    def containers(prefix: str, n: int) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "x"}
            if draw(st.booleans()):
                limits = draw(legacy_limits())
                c["resources"] = {"limits": limits}
                if draw(st.booleans()):  # defaulting copies limits to requests for extended resources
                    c["resources"]["requests"] = dict(limits)
            out.append(c)
        return out

    main = containers("c", draw(st.integers(1, 4)))
    init = containers("init", draw(st.integers(0, 2)))
    if not any("resources" in c for c in main + init):
        main[0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    spec: dict[str, Any] = {"containers": main}
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["schedulingGates"] = [{"name": "example.com/other"}]
    if draw(st.booleans()):
        spec["resourceClaims"] = [{"name": "c0-gpu", "resourceClaimName": "taken"}]
    annotations = {}
    mode = draw(st.sampled_from([None, "mig", "hami-core"]))
    if mode:
        annotations["nvidia.com/vgpu-mode"] = mode
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}


defaults_st = st.builds(
    ShimDefaults,
    default_memory_mib=st.sampled_from([0, 1024, 8000]),
    default_cores=st.integers(0, 100),
    default_gpu_num=st.integers(1, 4),
)


@settings(max_examples=150, deadline=None)
@given(gpu_pods(), defaults_st)
def test_any_valid_legacy_pod_is_fully_rewritten(pod: dict[str, Any], defaults: ShimDefaults) -> None:
    result = mutate_pod(pod, "ns", defaults, lambda _c: False)
    out = apply_patch(pod, result.patch)
    assert legacy_keys_left(out) == []
    assert result.gated
    assert [g["name"] for g in out["spec"]["schedulingGates"]].count(GATE) == 1
    templates = {t.name: t for t in result.templates}
    assert all(is_shim_template(t.body) and t.namespace == "ns" for t in templates.values())
    claims = {c["name"]: c for c in out["spec"]["resourceClaims"]}
    assert len(claims) == len(out["spec"]["resourceClaims"])  # claim names unique
    assert all(len(n) <= 63 for n in claims)
    used = set()
    for field in ("initContainers", "containers"):
        for before, after in zip(pod["spec"].get(field) or [], out["spec"].get(field) or [], strict=True):
            if "resources" not in before:
                assert after == before
                continue
            [ref] = after["resources"]["claims"]
            entry = claims[ref["name"]]
            assert entry["resourceClaimTemplateName"] in templates
            used.add(entry["resourceClaimTemplateName"])
            assert after["resources"].get("limits", {}).get("cpu") == before["resources"]["limits"].get("cpu")
            mode = Mode((pod["metadata"]["annotations"] or {}).get("nvidia.com/vgpu-mode", "any"))
            shape = container_shape(before, mode, defaults)
            assert shape is not None
            # every generated selector compiles in the controller's CEL environment
            ENV.compile(mig_selector(shape))
    assert used == set(templates)  # no template is returned that nothing references
    # and the same pod mutates to the same templates (deterministic names and bodies)
    assert mutate_pod(pod, "ns", defaults, lambda _c: False) == result
