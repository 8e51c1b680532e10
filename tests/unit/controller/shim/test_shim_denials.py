"""Every bad input is denied with a message naming the container, the resource and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
from shim_helpers import container, pod

from controller.shim import AdmissionDenied, ShimDefaults, mutate_pod


def deny(p: dict[str, Any], defaults: ShimDefaults | None = None) -> str:
    with pytest.raises(AdmissionDenied) as info:
        mutate_pod(p, "ns1", defaults or ShimDefaults(), lambda _c: False)
    assert str(info.value) == info.value.message
    return info.value.message


@pytest.mark.parametrize(
    ("limits", "fragments"),
    [
        # not whole numbers
        (
            {"nvidia.com/gpu": "1.5"},
            ['container "main"', "nvidia.com/gpu='1.5'", "not a whole number", "0..32"],
        ),
        ({"nvidia.com/gpu": "1500m"}, ["nvidia.com/gpu='1500m'", "not a whole number"]),
        ({"nvidia.com/gpu": "abc"}, ["nvidia.com/gpu='abc'", "not a whole number", "GPUs"]),
        ({"nvidia.com/gpu": 1.5}, ["nvidia.com/gpu=1.5", "not a whole number"]),
        ({"nvidia.com/gpu": True}, ["nvidia.com/gpu=True", "not a whole number"]),
        ({"nvidia.com/gpu": None}, ["nvidia.com/gpu=None", "not a whole number"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8.5"}, ["nvidia.com/gpumem='8.5'", "MiB"]),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8Gi"},
            ["nvidia.com/gpumem='8Gi'", "binary suffixes", "MiB", "e.g. 8000"],
        ),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "512Mi"}, ["binary suffixes"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "12.5"}, ["nvidia.com/gpucores='12.5'", "0..100"]),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "half"},
            ["nvidia.com/gpumem-percentage='half'", "1..100"],
        ),
        # negative
        ({"nvidia.com/gpu": "-1"}, ["nvidia.com/gpu='-1'", "out of range", "0..32"]),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-8000"},
            ["nvidia.com/gpumem='-8000'", "out of range"],
        ),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "-5"},
            ["nvidia.com/gpucores='-5'", "out of range", "0..100"],
        ),
        # ranges
        ({"nvidia.com/gpu": "33"}, ["nvidia.com/gpu='33'", "out of range", "0..32"]),
        ({"nvidia.com/gpu": "1k"}, ["nvidia.com/gpu='1k'", "out of range"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}, ["gpumem-percentage='0'", "1..100"]),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "101"},
            ["gpumem-percentage='101'", "1..100"],
        ),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}, ["gpucores='101'", "0..100"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(2**30 + 1)}, ["nvidia.com/gpumem", "out of range"]),
        # combinations
        (
            {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "8000"},
            ["nvidia.com/gpu is 0", "nvidia.com/gpumem", "1..32"],
        ),
        (
            {"nvidia.com/gpu": "0", "nvidia.com/gpucores": "10"},
            ["nvidia.com/gpu is 0", "nvidia.com/gpucores"],
        ),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpumem-percentage": "50"},
            [
                'container "main"',
                "nvidia.com/gpumem and nvidia.com/gpumem-percentage are both given",
                "one of them",
            ],
        ),
    ],
)
def test_bad_values(limits: dict[str, Any], fragments: list[str]) -> None:
    message = deny(pod(container("main", limits)))
    for fragment in fragments:
        assert fragment in message


def test_gpumem_with_no_gpu_when_default_gpu_num_is_zero() -> None:
    message = deny(pod(container("main", {"nvidia.com/gpumem": "8000"})), ShimDefaults(default_gpu_num=0))
    assert 'container "main"' in message
    assert "nvidia.com/gpumem given with no nvidia.com/gpu" in message
    assert "defaultGPUNum is 0" in message and "1..32" in message


def test_percentage_and_cores_with_no_gpu_when_default_gpu_num_is_zero() -> None:
    limits = {"nvidia.com/gpumem-percentage": "10", "nvidia.com/gpucores": "10"}
    message = deny(pod(container("c", limits)), ShimDefaults(default_gpu_num=0))
    assert "nvidia.com/gpumem-percentage, nvidia.com/gpucores given with no nvidia.com/gpu" in message


def test_limits_and_requests_differ() -> None:
    c = container("main")
    c["resources"] = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}
    message = deny(pod(c))
    assert "nvidia.com/gpu differs between limits ('2') and requests ('1')" in message
    assert 'container "main"' in message


def test_equal_values_in_different_spellings_are_not_a_difference() -> None:
    c = container("main")
    c["resources"] = {"limits": {"nvidia.com/gpumem": "8k"}, "requests": {"nvidia.com/gpumem": "8000"}}
    mutate_pod(pod(c), "ns1", ShimDefaults(), lambda _c: False)


@pytest.mark.parametrize("mode", ["MIG", "hami", "", "mig,hami-core", "any"])
def test_unknown_vgpu_mode(mode: str) -> None:
    message = deny(pod(container("main", {"nvidia.com/gpu": "1"}), mode=mode))
    assert f"nvidia.com/vgpu-mode={mode!r}" in message
    assert "'mig'" in message and "'hami-core'" in message


@pytest.mark.parametrize("gpu", [True, False])
def test_gate_set_by_hand(gpu: bool) -> None:
    limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
    p = pod(
        container("main", limits), schedulingGates=[{"name": "a/b"}, {"name": "gpu.flexmig.dev/allocation"}]
    )
    message = deny(p)
    assert "spec.schedulingGates" in message and "set by hand" in message


def test_node_name_with_legacy_request() -> None:
    message = deny(pod(container("main", {"nvidia.com/gpu": "1"}), nodeName="node-a"))
    assert "spec.nodeName" in message and "main" in message and "nodeSelector" in message


def test_init_container_is_named_as_such() -> None:
    message = deny(pod(container("main"), init=[container("setup", {"nvidia.com/gpu": "x"})]))
    assert 'init container "setup"' in message


def test_every_container_problem_is_reported_at_once() -> None:
    p = pod(
        container("a", {"nvidia.com/gpu": "1.5"}),
        container("b", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "200"}),
        container("ok", {"nvidia.com/gpu": "1"}),
    )
    message = deny(p)
    assert 'container "a"' in message and 'container "b"' in message and '"ok"' not in message


def test_bad_value_in_requests_names_requests() -> None:
    c = container("main")
    c["resources"] = {"requests": {"nvidia.com/gpu": "two"}}
    assert "in requests" in deny(pod(c))


@pytest.mark.parametrize("value", ["2", "-1", "0.5", "high"])
def test_priority_outside_zero_or_one(value: str) -> None:
    message = deny(pod(container("main", {"nvidia.com/gpu": "1", "nvidia.com/priority": value})))
    assert f"nvidia.com/priority={value!r}" in message and "0 high or 1 low" in message


@pytest.mark.parametrize("key", ["nvidia.com/gpu-type", "nvidia.com/mig-1g.10gb", "nvidia.com/vgpu"])
def test_unknown_nvidia_resource_beside_gpu_lists_the_accepted_ones(key: str) -> None:
    message = deny(pod(container("main", {"nvidia.com/gpu": "1", key: "1"})))
    assert 'container "main"' in message and key in message
    for accepted in ("gpu", "gpumem", "gpumem-percentage", "gpucores", "priority"):
        assert f"nvidia.com/{accepted}" in message


def test_unknown_nvidia_resource_in_requests_is_denied_too() -> None:
    c = container("main", {"nvidia.com/gpu": "1"})
    c["resources"]["requests"] = {"nvidia.com/gpu": "1", "nvidia.com/foo": "1"}
    assert "nvidia.com/foo" in deny(pod(c))


def test_priority_with_gpu_zero_is_denied() -> None:
    # gpu 0 leaves the container as written, and no node advertises nvidia.com/priority.
    message = deny(pod(container("main", {"nvidia.com/gpu": "0", "nvidia.com/priority": "1"})))
    assert "nvidia.com/gpu is 0 but nvidia.com/priority" in message
