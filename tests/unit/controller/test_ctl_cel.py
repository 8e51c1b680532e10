"""CEL selectors with the Kubernetes DRA environment: quantities, semver, errors, memoisation."""

from __future__ import annotations

import pytest

from controller.claims.cel import CelCompileError, CelDevice, CelEnvironment
from controller.claims.quantity import QuantityError, parse_quantity

DRV = "gpu.flexmig.dev"
DEVICE = CelDevice.from_slice_device(
    DRV,
    {
        "name": "gpu-0-mig-1g10gb-19-3",
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": "1g.10gb"},
            "placementStart": {"int": 3},
            "driverVersion": {"version": "1.2.3"},
            "example.com/numa": {"int": 1},
        },
        "capacity": {"memory": {"value": "9984Mi"}},
    },
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'device.driver == "{DRV}"', True),
        (f'device.attributes["{DRV}"].profile == "1g.10gb"', True),
        (f'device.attributes["{DRV}"].placementStart > 2', True),
        (f'device.capacity["{DRV}"].memory.compareTo(quantity("8000Mi")) >= 0', True),
        (f'device.capacity["{DRV}"].memory.compareTo(quantity("10Gi")) >= 0', False),
        (f'device.capacity["{DRV}"].memory.isGreaterThan(quantity("9.75Gi"))', False),
        (f'device.capacity["{DRV}"].memory.isLessThan(quantity("11G"))', True),
        (f'device.capacity["{DRV}"].memory == quantity("9984Mi")', True),
        (f'device.capacity["{DRV}"].memory.asInteger() == 9984 * 1024 * 1024', True),
        (f'device.attributes["{DRV}"].driverVersion.isGreaterThan(semver("1.2.3-rc.1"))', True),
        (f'device.attributes["{DRV}"].driverVersion.compareTo(semver("1.10.0")) < 0', True),
        (f'device.attributes["{DRV}"].driverVersion.major() == 1', True),
        ('device.attributes["example.com"].numa == 1', True),
        ('isQuantity("1.5Gi") && !isQuantity("lots")', True),
        (f'"{DRV}" in device.attributes && !device.allowMultipleAllocations', True),
    ],
)
def test_kubernetes_dra_expressions(expression: str, expected: bool) -> None:
    assert CelEnvironment().compile(expression).evaluate(DEVICE) is expected


def test_runtime_error_is_no_match_with_message() -> None:
    verdict = CelEnvironment().compile('device.attributes["other.io"].x == 1').evaluate(DEVICE)
    assert isinstance(verdict, str) and "CEL runtime error" in verdict


def test_non_bool_result_is_no_match() -> None:
    assert isinstance(CelEnvironment().compile("1 + 1").evaluate(DEVICE), str)


def test_compile_errors_name_the_expression() -> None:
    with pytest.raises(CelCompileError, match="does not compile"):
        CelEnvironment().compile("device.driver ==")
    with pytest.raises(CelCompileError, match="unknown variable"):
        CelEnvironment().compile("pod.name == 'x'")


def test_memo_ignores_attributes_the_expression_never_names() -> None:
    env = CelEnvironment()
    sel = env.compile(f'device.attributes["{DRV}"].profile == "1g.10gb"')
    for uuid in ("GPU-a", "GPU-b", "GPU-c"):
        dev = CelDevice.from_slice_device(
            DRV, {"attributes": {"profile": {"string": "1g.10gb"}, "parentUUID": {"string": uuid}}}
        )
        assert sel.matches(dev)
    assert len(sel.memo) == 1
    by_uuid = env.compile(f'device.attributes["{DRV}"].parentUUID == "GPU-b"')
    results = [
        by_uuid.matches(CelDevice.from_slice_device(DRV, {"attributes": {"parentUUID": {"string": u}}}))
        for u in ("GPU-a", "GPU-b")
    ]
    assert results == [False, True]


@pytest.mark.parametrize(
    ("text", "value"),
    [("8000Mi", 8000 * 2**20), ("1.5Gi", 3 * 2**29), ("500m", 0.5), ("1e3", 1000), ("2k", 2000), ("10", 10)],
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == value


def test_bad_quantity() -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity("8 GB")
