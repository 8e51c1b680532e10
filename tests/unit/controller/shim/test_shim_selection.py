"""HAMi's per-pod selection and scheduler-policy annotations (controller/shim/selection.py): each one is
honoured or refused with what to write instead; none is silently ignored. Pods written like HAMi's own
examples (its docs' `nvidia.com/use-gputype: "A100"` pod)."""

from __future__ import annotations

from typing import Any

import pytest
from shim_helpers import container, mutate

from controller.claims.cel import CelDevice, CelEnvironment
from controller.shim import AdmissionDenied, ShimDefaults, mutate_pod
from controller.shim.selection import suggested_selector


def hami_pod(annotations: dict[str, str], limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """HAMi's example: `nvidia.com/gpu: 1`, `nvidia.com/gpumem: 3000`, and the annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "annotations": annotations},
        "spec": {
            "containers": [
                container("ubuntu-container", limits or {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
            ]
        },
    }


def denial(p: dict[str, Any]) -> str:
    with pytest.raises(AdmissionDenied) as info:
        mutate_pod(p, "ns1", ShimDefaults(), lambda _c: False)
    return info.value.message


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        (
            "nvidia.com/use-gputype",
            "A100",
            ["GPU model", 'productName.contains("A100")', "ResourceClaim", "mig.gpu.flexmig.dev"],
        ),
        ("nvidia.com/nouse-gputype", "1080,2080", ['!(device.attributes["gpu.flexmig.dev"].productName']),
        (
            "nvidia.com/use-gpuuuid",
            "GPU-123456789",
            ["GPU UUID", "parentUUID", 'in ["GPU-123456789"]'],
        ),
        ("nvidia.com/nouse-gpuuuid", "GPU-123456789", ["!((has("]),
        ("hami.io/node-scheduler-policy", "spread", ["allowed: 'binpack'", "no spreading placement"]),
        ("hami.io/gpu-scheduler-policy", "spread", ["allowed: 'binpack'"]),
        ("hami.io/gpu-scheduler-policy", "Binpack", ["='Binpack' is not supported"]),
    ],
)
def test_an_annotation_flexmig_cannot_honour_is_denied_naming_it(
    key: str, value: str, fragments: list[str]
) -> None:
    # Before: admitted, the annotation ignored; an "A100 only" pod could land on an H100.
    message = denial(hami_pod({key: value}))
    assert f"annotation {key}={value!r} is not supported" in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_binpack_is_honoured_as_flexmigs_own_placement() -> None:
    annotations = {"hami.io/node-scheduler-policy": "binpack", "hami.io/gpu-scheduler-policy": "binpack"}
    result, stored = mutate(hami_pod(annotations))
    assert result.templates and stored["spec"]["schedulingGates"]


def test_every_unsupported_annotation_is_named_in_one_answer_and_long_values_are_cut() -> None:
    message = denial(
        hami_pod({"nvidia.com/use-gputype": "A" * 500, "hami.io/gpu-scheduler-policy": "spread"})
    )
    assert "nvidia.com/use-gputype=" in message and "hami.io/gpu-scheduler-policy" in message
    assert len(message) < 2000


def test_a_pod_without_legacy_resources_is_not_held_to_them() -> None:
    p = hami_pod({"nvidia.com/use-gputype": "A100"}, limits={"cpu": "1"})
    result, _ = mutate(p)
    assert not result.templates


def _device(**attributes: str) -> CelDevice:
    return CelDevice.from_slice_device(
        "gpu.flexmig.dev", {"name": "d", "attributes": {k: {"string": v} for k, v in attributes.items()}}
    )


def test_the_suggested_selectors_select_what_hami_would_on_flexmigs_attributes() -> None:
    env = CelEnvironment()
    a100_mig = _device(type="mig", productName="NVIDIA A100-SXM4-40GB", parentUUID="GPU-aaa")
    h100_gpu = _device(type="gpu", productName="NVIDIA H100 80GB HBM3", uuid="GPU-bbb")

    def selects(key: str, value: str) -> list[bool]:
        selector = env.compile(suggested_selector(key, value))
        return [selector.evaluate(d) is True for d in (a100_mig, h100_gpu)]

    assert selects("nvidia.com/use-gputype", "a100") == [True, False]  # case as HAMi: ignored
    assert selects("nvidia.com/nouse-gputype", "A100,H200") == [False, True]
    assert selects("nvidia.com/use-gpuuuid", "GPU-bbb") == [False, True]  # whole GPU: uuid
    assert selects("nvidia.com/use-gpuuuid", "GPU-aaa") == [True, False]  # MIG device: its GPU's
    assert selects("nvidia.com/nouse-gpuuuid", "GPU-aaa,GPU-ccc") == [False, True]
