"""HAMi-style namespace quotas on nvidia.com/gpu and nvidia.com/gpumem, counted by the shim."""

from __future__ import annotations

from typing import Any

from shim_helpers import container, mutate, pod

from controller.shim import Mode, Shape
from controller.shim.defaults import ResourceNames
from controller.shim.migprofile import ProfileShape
from controller.shim.quota import gpu_quota_limits, pod_use, quota_problems
from controller.shim.templates import template_name

NAMES = ResourceNames()


def quota(name: str, **hard: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"hard": {k.replace("_", "/", 1): v for k, v in hard.items()}},
    }


def hami_quota() -> dict[str, Any]:
    # As HAMi's guide writes it: limits.nvidia.com/gpu and limits.nvidia.com/gpumem.
    return {
        "metadata": {"name": "gpu-quota"},
        "spec": {"hard": {"limits.nvidia.com/gpu": "2", "limits.nvidia.com/gpumem": "30000", "cpu": "10"}},
    }


def translated(name: str, shape: Shape | ProfileShape, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"resourceClaims": [{"name": "c-gpu", "resourceClaimTemplateName": template_name(shape)}]},
        "status": {"phase": phase},
    }


def mib(count: int, memory: int) -> Shape:
    return Shape(count=count, memory_mib=memory, memory_percent=None, cores=0, mode=Mode.ANY)


def test_limits_in_every_spelling_are_found() -> None:
    quotas = [hami_quota(), {"metadata": {"name": "k8s"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}]
    found = {(q.quota, q.key, q.role, int(q.hard)) for q in gpu_quota_limits(quotas, NAMES)}
    assert found == {
        ("gpu-quota", "limits.nvidia.com/gpu", "count", 2),
        ("gpu-quota", "limits.nvidia.com/gpumem", "memory", 30000),
        ("k8s", "requests.nvidia.com/gpu", "count", 4),
    }


def test_use_counts_translated_and_hami_pods_not_finished_ones() -> None:
    assert pod_use(translated("a", mib(2, 8000)), NAMES) == (2, 16000)
    assert pod_use(translated("b", mib(1, 8000), phase="Succeeded"), NAMES) == (0, 0)
    hami = pod(container("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10k"}))
    assert pod_use(hami, NAMES) == (1, 10000)
    assert pod_use(translated("p", ProfileShape(3, "1g.10gb")), NAMES) == (3, 0)


def test_pod_within_the_quota_is_admitted() -> None:
    limits = gpu_quota_limits([hami_quota()], NAMES)
    pods = [translated("a", mib(1, 10000))]
    assert quota_problems("team", limits, pods, [mib(1, 20000)], NAMES) == []


def test_pod_over_the_memory_limit_is_refused_with_the_numbers() -> None:
    limits = gpu_quota_limits([hami_quota()], NAMES)
    pods = [translated("a", mib(1, 10000))]
    [problem] = quota_problems("team", limits, pods, [mib(1, 24000)], NAMES)
    assert problem == (
        "namespace 'team': ResourceQuota 'gpu-quota' limits limits.nvidia.com/gpumem to 30000; 10000 in use "
        "by the namespace's pods, this pod asks for 24000 (allowed: at most 20000 more)"
    )


def test_pod_over_the_count_limit_is_refused() -> None:
    limits = gpu_quota_limits([hami_quota()], NAMES)
    pods = [translated("a", mib(2, 1000))]
    [problem] = quota_problems("team", limits, pods, [mib(1, 1000)], NAMES)
    assert "limits limits.nvidia.com/gpu to 2; 2 in use" in problem


def test_memory_without_mib_under_a_memory_quota_is_refused_not_uncounted() -> None:
    limits = gpu_quota_limits([hami_quota()], NAMES)
    percent = Shape(count=1, memory_mib=None, memory_percent=50, cores=0, mode=Mode.ANY)
    problems = quota_problems("team", limits, [], [percent, ProfileShape(1, "1g.10gb")], NAMES)
    assert any("50% of a GPU's memory, MIG profile 1g.10gb" in p for p in problems)
    assert any(
        "(allowed under this quota: give nvidia.com/gpu with nvidia.com/gpumem in MiB)" in p for p in problems
    )


def test_no_gpu_quota_no_problem() -> None:
    assert (
        quota_problems("team", gpu_quota_limits([quota("q", cpu="4")], NAMES), [], [mib(9, 9)], NAMES) == []
    )


def test_mutation_reports_one_shape_per_claim() -> None:
    # Two containers of one shape share a template but are two claims: both count.
    p = pod(
        container("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"}),
        container("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k"}),
    )
    result, _ = mutate(p)
    assert len(result.templates) == 1 and len(result.shapes) == 2
