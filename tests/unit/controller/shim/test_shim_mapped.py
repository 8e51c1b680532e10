"""Kubernetes' extended-resource mapping (KEP-5004) and the shim never both act on one pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from shim_helpers import container, mutate, pod

from controller.shim import AdmissionDenied, ShimDefaults
from flexmig.commands.controller_webhook import mapped_resources

GPU_MAPPED = ShimDefaults(mapped_resources=frozenset({"nvidia.com/gpu"}))
MIG_MAPPED = ShimDefaults(mapped_resources=frozenset({"gpu.flexmig.dev/mig"}))


def ours(_claim: Mapping[str, Any]) -> bool | None:
    return True


def test_count_only_pod_is_left_to_the_mapping() -> None:
    p = pod(container("a", {"nvidia.com/gpu": "1"}), init=[container("i", {"nvidia.com/gpu": "2"})])
    result, out = mutate(p, GPU_MAPPED)
    assert (result.patch, result.gated, result.templates) == ([], False, ())
    assert out == p
    assert "extended-resource mapping" in result.reason


def test_without_the_mapping_the_same_pod_is_translated() -> None:
    # The test above would pass on a shim that ignores every pod: this is the control.
    result, _ = mutate(pod(container("a", {"nvidia.com/gpu": "1"})))
    assert result.gated and result.templates


@pytest.mark.parametrize(
    ("p", "why"),
    [
        (pod(container("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"})), "gpumem"),
        (
            pod(container("a", {"nvidia.com/gpu": "1"}), container("b", {"nvidia.com/gpucores": "30"})),
            "another container needs the shim",
        ),
        (pod(container("a", {"nvidia.com/gpu": "1"}), mode="mig"), "vgpu-mode"),
        (pod(container("a", {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"})), "priority"),
    ],
)
def test_a_pod_the_shim_must_serve_is_translated_whole(p: dict[str, Any], why: str) -> None:
    result, out = mutate(p, GPU_MAPPED)
    assert result.gated, why
    # nvidia.com/gpu is gone from every container: kube-scheduler's mapping has nothing to act on.
    for c in out["spec"]["containers"]:
        assert "nvidia.com/gpu" not in (c["resources"].get("limits") or {}), why


def test_count_only_with_a_flexmig_claim_is_translated() -> None:
    p = pod(
        container("a", {"nvidia.com/gpu": "1"}), resourceClaims=[{"name": "c", "resourceClaimName": "mine"}]
    )
    result, out = mutate(p, GPU_MAPPED, lookup=ours)
    assert result.gated and result.templates
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "a-gpu"}]


def test_selection_annotation_is_still_refused() -> None:
    p = pod(container("a", {"nvidia.com/gpu": "1"}))
    p["metadata"]["annotations"] = {"nvidia.com/use-gputype": "H100"}
    with pytest.raises(AdmissionDenied, match=r"nvidia\.com/use-gputype"):
        mutate(p, GPU_MAPPED)


def test_another_mapped_name_alone_is_the_mappings() -> None:
    result, _ = mutate(pod(container("a", {"gpu.flexmig.dev/mig": "1"})), MIG_MAPPED)
    assert (result.patch, result.gated) == ([], False)


def test_another_mapped_name_beside_shim_devices_is_denied() -> None:
    p = pod(container("a", {"nvidia.com/gpu": "1"}), container("b", {"gpu.flexmig.dev/mig": "1"}))
    with pytest.raises(AdmissionDenied) as exc:
        mutate(p, MIG_MAPPED)
    assert exc.value.message.startswith('container "b": gpu.flexmig.dev/mig is served by Kubernetes\'')
    claim = pod(
        container("b", {"gpu.flexmig.dev/mig": "1"}), resourceClaims=[{"name": "c", "resourceClaimName": "x"}]
    )
    with pytest.raises(AdmissionDenied, match="cannot be combined in one pod"):
        mutate(claim, MIG_MAPPED, lookup=ours)


def test_flag_is_checked() -> None:
    assert mapped_resources(" nvidia.com/gpu, gpu.flexmig.dev/mig ,") == {
        "nvidia.com/gpu",
        "gpu.flexmig.dev/mig",
    }
    assert mapped_resources("") == frozenset()
    with pytest.raises(ValueError, match="--mapped-resources: 'gpu' is not an extended resource name"):
        mapped_resources("gpu")
