"""Template names and bodies (contract C3 of docs/architecture.md), and the MIG selectors run through the controller's CEL."""

from __future__ import annotations

from typing import Any

import pytest

from controller.claims.cel import CelDevice, CelEnvironment
from controller.shim import Mode, Shape, is_shim_template
from controller.shim.templates import mig_selector, template_for, template_name

DRV = "gpu.flexmig.dev"
MIB_8000 = f'device.capacity["{DRV}"].memory.compareTo(quantity("8000Mi")) >= 0'

# A100-40GB: 8 memory slices, 7 compute slices; (profile, memory slices, compute slices, MiB)
A100_40GB = [
    ("1g.5gb", 1, 1, 4864),
    ("2g.10gb", 2, 2, 9984),
    ("3g.20gb", 4, 3, 19968),
    ("4g.20gb", 4, 4, 19968),
    ("7g.40gb", 8, 7, 40192),
]


def mig_device(profile: str, mem_slices: int, compute_slices: int, mib: int) -> CelDevice:
    return CelDevice.from_slice_device(
        DRV,
        {
            "name": f"gpu-0-mig-{profile.replace('.', '')}-0-0",
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": profile},
                "memorySlices": {"int": mem_slices},
                "computeSlices": {"int": compute_slices},
                "gpuMemorySlices": {"int": 8},
                "gpuComputeSlices": {"int": 7},
            },
            "capacity": {"memory": {"value": f"{mib}Mi"}},
        },
    )


def admitted(shape: Shape) -> list[str]:
    selector = CelEnvironment().compile(mig_selector(shape))
    out = []
    for profile, *rest in A100_40GB:
        verdict = selector.evaluate(mig_device(profile, *rest))
        assert isinstance(verdict, bool), verdict  # never a runtime error on a well-formed device
        if verdict:
            out.append(profile)
    return out


def shape(
    count: int = 1, mib: int | None = None, pct: int | None = None, cores: int = 0, mode: Mode = Mode.MIG
) -> Shape:
    return Shape(count=count, memory_mib=mib, memory_percent=pct, cores=cores, mode=mode)


@pytest.mark.parametrize(
    ("s", "profiles"),
    [
        (shape(mib=4864), ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(mib=4865), ["2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(mib=8000), ["2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(mib=19968), ["3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(mib=40193), []),
        # percent of the parent's memory, in slices: k/8 >= p/100
        (shape(pct=12), ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(pct=13), ["2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(pct=50), ["3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(pct=51), ["7g.40gb"]),
        (shape(pct=100), ["7g.40gb"]),  # "the whole GPU's memory"
        # cores: compute slices k/7 >= C/100
        (shape(pct=50, cores=42), ["3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(pct=50, cores=43), ["4g.20gb", "7g.40gb"]),
        (shape(mib=1, cores=15), ["2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (shape(mib=1, cores=100), ["7g.40gb"]),
    ],
)
def test_mig_selector_semantics(s: Shape, profiles: list[str]) -> None:
    assert admitted(s) == profiles


def test_selector_texts_match_the_contract() -> None:
    assert mig_selector(shape(mib=8000)) == MIB_8000
    assert mig_selector(shape(pct=50, cores=30)) == (
        f'device.attributes["{DRV}"].memorySlices * 100 >= 50 * device.attributes["{DRV}"].gpuMemorySlices'
        f' && device.attributes["{DRV}"].computeSlices * 100 >= 30 * device.attributes["{DRV}"].gpuComputeSlices'
    )


@pytest.mark.parametrize(
    ("s", "name"),
    [
        (shape(count=2, mib=8000, mode=Mode.ANY), "flexmig-any-2x8000mi-c0-d"),
        (shape(pct=50, cores=30), "flexmig-mig-1x50pct-c30"),
        (
            shape(count=32, mib=2**30, cores=100, mode=Mode.HAMI_CORE),
            "flexmig-hami-core-32x1073741824mi-c100",
        ),
    ],
)
def test_names(s: Shape, name: str) -> None:
    assert template_name(s) == name
    assert template_for("ns", s).body["metadata"]["name"] == name


def devices(s: Shape) -> dict[str, Any]:
    body = template_for("team-a", s).body
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceClaimTemplate"
    assert body["metadata"]["namespace"] == "team-a"
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "flexmig",
        "gpu.flexmig.dev/shim-template": "v1",
    }
    # generated claims carry the label: the controller keeps the strand-least rule for them only
    assert body["spec"]["metadata"] == {"labels": {"gpu.flexmig.dev/shim-template": "v1"}}
    assert set(body["spec"]) == {"metadata", "spec"} and set(body["spec"]["spec"]) == {"devices"}
    return dict(body["spec"]["spec"]["devices"])


def test_mig_body() -> None:
    assert devices(shape(count=2, mib=8000)) == {
        "requests": [
            {
                "name": "gpus",
                "exactly": {
                    "deviceClassName": "mig.gpu.flexmig.dev",
                    "allocationMode": "ExactCount",
                    "count": 2,
                    "selectors": [{"cel": {"expression": MIB_8000}}],
                },
            }
        ],
        # nvidia.com/gpu: 2 is two physical GPUs, in MIG mode too (HAMi's meaning).
        "constraints": [{"requests": ["gpus"], "distinctAttribute": "gpu.flexmig.dev/parentUUID"}],
    }
    assert "constraints" not in devices(shape(count=1, mib=8000))


def test_hami_core_body_mib() -> None:
    assert devices(shape(count=2, mib=8000, cores=30, mode=Mode.HAMI_CORE)) == {
        "requests": [
            {
                "name": "gpus",
                "exactly": {
                    "deviceClassName": "hami-core.gpu.flexmig.dev",
                    "allocationMode": "ExactCount",
                    "count": 2,
                    "capacity": {"requests": {"memory": "8000Mi", "cores": "30"}},
                },
            }
        ],
        "constraints": [{"requests": ["gpus"], "distinctAttribute": "gpu.flexmig.dev/uuid"}],
    }


def test_hami_core_body_percent_single() -> None:
    d = devices(shape(pct=25, mode=Mode.HAMI_CORE))
    assert d["requests"][0]["exactly"]["capacity"] == {"requests": {"cores": "0"}}
    assert "constraints" not in d
    assert d["config"] == [
        {
            "requests": ["gpus"],
            "opaque": {
                "driver": "gpu.flexmig.dev",
                "parameters": {
                    "apiVersion": "gpu.flexmig.dev/v1alpha1",
                    "kind": "SharedGpuRequest",
                    "memoryPercentage": 25,
                },
            },
        }
    ]


def test_any_body_offers_both_and_scopes_hami_fields_to_the_subrequest() -> None:
    d = devices(shape(count=3, pct=40, cores=10, mode=Mode.ANY))
    [request] = d["requests"]
    assert request["name"] == "gpus" and "exactly" not in request
    mig, hami = request["firstAvailable"]
    assert mig["name"] == "mig" and mig["deviceClassName"] == "mig.gpu.flexmig.dev" and mig["count"] == 3
    assert mig["selectors"] == [{"cel": {"expression": mig_selector(shape(count=3, pct=40, cores=10))}}]
    assert hami["name"] == "hami-core" and hami["deviceClassName"] == "hami-core.gpu.flexmig.dev"
    assert hami["capacity"] == {"requests": {"cores": "10"}} and hami["count"] == 3
    assert d["constraints"] == [
        {"requests": ["gpus/mig"], "distinctAttribute": "gpu.flexmig.dev/parentUUID"},
        {"requests": ["gpus/hami-core"], "distinctAttribute": "gpu.flexmig.dev/uuid"},
    ]
    assert d["config"][0]["requests"] == ["gpus/hami-core"]
    assert d["config"][0]["opaque"]["parameters"]["memoryPercentage"] == 40


def test_shape_annotation_is_human() -> None:
    ann = template_for("n", shape(count=2, mib=8000, mode=Mode.ANY)).body["metadata"]["annotations"]
    assert ann == {"gpu.flexmig.dev/shape": "2 GPU devices, each >= 8000 MiB (MIG instance or shared GPU)"}
    ann = template_for("n", shape(pct=50, cores=30)).body["metadata"]["annotations"]
    assert ann["gpu.flexmig.dev/shape"] == (
        "1 GPU device, each >= 50% of its GPU's memory and >= 30% of its GPU's compute (MIG instances only)"
    )


def test_is_shim_template() -> None:
    assert is_shim_template(template_for("n", shape(mib=1)).body)
    assert not is_shim_template({"metadata": {"labels": {"app.kubernetes.io/managed-by": "flexmig"}}})
    assert not is_shim_template({"metadata": {"labels": {"gpu.flexmig.dev/shim-template": "v1"}}})
    assert not is_shim_template(
        {
            "metadata": {
                "labels": {"app.kubernetes.io/managed-by": "helm", "gpu.flexmig.dev/shim-template": "v1"}
            }
        }
    )
    assert not is_shim_template({})


@pytest.mark.parametrize(
    "bad",
    [
        {"count": 0, "memory_mib": 1},
        {"count": 33, "memory_mib": 1},
        {"count": 1},
        {"count": 1, "memory_mib": 1, "memory_percent": 1},
        {"count": 1, "memory_percent": 0},
        {"count": 1, "memory_mib": 1, "cores": 101},
    ],
)
def test_shape_invariants(bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"memory_mib": None, "memory_percent": None, "cores": 0, "mode": Mode.MIG} | bad
    with pytest.raises(ValueError):
        Shape(**fields)
