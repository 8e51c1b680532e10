"""Device-name encoding and shared constants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api import constants as c
from api.constants import (
    DeviceKind,
    DeviceName,
    counter_set_name,
    encode_profile_name,
    is_dns_label,
    memory_slice_counter_name,
    mig_device_name,
    parse_device_name,
    shared_gpu_device_name,
    whole_gpu_device_name,
)


def test_identities() -> None:
    assert c.DRIVER_NAME == "gpu.flexmig.dev"
    assert c.ALLOCATION_GATE == "gpu.flexmig.dev/allocation"
    assert c.ANNOTATION_MIG_ALLOCATIONS == "hami.io/vgpu-mig-allocations"
    assert c.ANNOTATION_VGPU_MODE == "nvidia.com/vgpu-mode"
    assert (c.VGPU_MODE_MIG, c.VGPU_MODE_HAMI_CORE) == ("mig", "hami-core")
    assert (c.RESOURCE_GPU, c.RESOURCE_GPUMEM, c.RESOURCE_GPUMEM_PERCENTAGE, c.RESOURCE_GPUCORES) == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
    )
    assert (c.DEFAULT_NODE_METRICS_PORT, c.DEFAULT_CONTROLLER_METRICS_PORT) == (31992, 31993)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, "1g.5gb", 19, 3), "gpu-0-mig-1g5gb-19-3"),
        ((2, "1g.10gb+me", 20, 0), "gpu-2-mig-1g10gbplusme-20-0"),
        ((0, "1g.24gb-me", 67, 3), "gpu-0-mig-1g24gb-me-67-3"),
        ((1, "1g.24gb+me.all", 65, 9), "gpu-1-mig-1g24gbplusmeall-65-9"),
        ((3, "1c.2g.10gb", 14, 4), "gpu-3-mig-1c2g10gb-14-4"),
        ((7, "7g.80gb", 0, 0), "gpu-7-mig-7g80gb-0-0"),
        ((0, "1g5gb", 19, 3), "gpu-0-mig-1g5gb-19-3"),  # already encoded: unchanged
    ],
)
def test_mig_device_names(args: tuple[int, str, int, int], name: str) -> None:
    assert mig_device_name(*args) == name
    parsed = parse_device_name(name)
    assert parsed == DeviceName(DeviceKind.MIG, args[0], encode_profile_name(args[1]), args[2], args[3])
    assert str(parsed) == name


def test_other_names() -> None:
    assert whole_gpu_device_name(0) == "gpu-0"
    assert parse_device_name("gpu-12") == DeviceName(DeviceKind.WHOLE, 12)
    assert str(DeviceName(DeviceKind.WHOLE, 12)) == "gpu-12"
    assert counter_set_name(3) == "gpu-3-counter-set"
    assert memory_slice_counter_name(7) == "memory-slice-7"
    with pytest.raises(ValueError, match="incomplete"):
        str(DeviceName(DeviceKind.MIG, 0, "1g5gb"))


def test_shared_names() -> None:
    assert shared_gpu_device_name(0) == "gpu-0-shared"
    assert shared_gpu_device_name(3) == "gpu-3-shared"
    assert parse_device_name("gpu-3-shared") == DeviceName(kind=DeviceKind.SHARED, gpu_index=3)
    assert str(DeviceName(DeviceKind.SHARED, 11)) == "gpu-11-shared"
    # The shared device of a GPU is distinct from its whole-GPU and MIG devices.
    assert parse_device_name("gpu-3").kind is DeviceKind.WHOLE
    with pytest.raises(ValueError):
        shared_gpu_device_name(-1)
    with pytest.raises(ValueError):
        shared_gpu_device_name(True)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "gpu",
        "gpu-",
        "gpu--1",
        "gpu-01",
        "GPU-0",
        "gpu-0-counter-set",
        "memory-slice-0",
        "gpu-0-mig",
        "gpu-0-mig-1g5gb",
        "gpu-0-mig-1g5gb-19",
        "gpu-0-mig-19-3",
        "gpu-0-mig-1g.5gb-19-3",
        "gpu-0-mig-1g5gb-019-3",
        "gpu-0-mig-1g5gb-19-03",
        "gpu-0-mig--1g5gb-19-3",
        "gpu-0-mig-1g5gb--19-3",
        "gpu-0-mig-1g5gb-19-3-",
        "gpu-x-mig-1g5gb-19-3",
        "gpu-0-mag-1g5gb-19-3",
        "gpu-0-mig-" + "a" * 60 + "-1-2",
        "gpu-0-shared-",
        "gpu-00-shared",
        "gpu--shared",
        "gpu-shared",
        "gpu-0-shared-1",
        "gpu-0-Shared",
        "gpu-0-mig-shared",
    ],
)
def test_parse_rejects(name: str) -> None:
    with pytest.raises(ValueError):
        parse_device_name(name)


@pytest.mark.parametrize(
    "args",
    [
        (-1, "1g.5gb", 19, 3),
        (0, "1g.5gb", -1, 3),
        (0, "1g.5gb", 19, -3),
        (True, "1g.5gb", 19, 3),
        (0, "1G.5GB", 19, 3),
        (0, "", 19, 3),
        (0, "1g..5gb", 19, 3),
        (0, "1g.5gb+", 19, 3),
        (0, "1g 5gb", 19, 3),
        (0, "a" * 60, 19, 3),
    ],
)
def test_mig_device_name_rejects(args: tuple[int, str, int, int]) -> None:
    with pytest.raises(ValueError):
        mig_device_name(*args)


def test_index_helpers_reject_negative() -> None:
    for fn in (whole_gpu_device_name, shared_gpu_device_name, counter_set_name, memory_slice_counter_name):
        with pytest.raises(ValueError):
            fn(-1)


_segment = st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True)
profiles = st.builds(
    lambda first, rest: first + "".join(sep + seg for sep, seg in rest),
    _segment,
    st.lists(st.tuples(st.sampled_from(".+-"), _segment), max_size=3),
)
small = st.integers(min_value=0, max_value=10_000)


@given(small, profiles, small, small)
def test_mig_round_trip(gpu: int, profile: str, gi: int, start: int) -> None:
    try:
        name = mig_device_name(gpu, profile, gi, start)
    except ValueError:
        # Only length may reject a well-formed profile.
        assert len(f"gpu-{gpu}-mig-{encode_profile_name(profile)}-{gi}-{start}") > 63
        return
    assert is_dns_label(name)
    parsed = parse_device_name(name)
    assert (parsed.kind, parsed.gpu_index, parsed.gi_profile_id, parsed.start) == (
        DeviceKind.MIG,
        gpu,
        gi,
        start,
    )
    assert parsed.profile == encode_profile_name(profile)
    assert str(parsed) == name


@given(st.integers(min_value=0, max_value=10**50))
def test_whole_round_trip(gpu: int) -> None:
    name = whole_gpu_device_name(gpu)
    assert is_dns_label(name)
    assert parse_device_name(name) == DeviceName(DeviceKind.WHOLE, gpu)


@given(st.integers(min_value=0, max_value=10**40))
def test_shared_round_trip(gpu: int) -> None:
    name = shared_gpu_device_name(gpu)
    assert is_dns_label(name)
    assert parse_device_name(name) == DeviceName(DeviceKind.SHARED, gpu)


@given(st.text(alphabet="abcdeghmprsu0123456789-.+", max_size=40))
def test_parse_is_total_and_canonical(text: str) -> None:
    # Whatever parses must format back to exactly the same string; everything else is ValueError.
    try:
        parsed = parse_device_name(text)
    except ValueError:
        return
    assert str(parsed) == text
    assert is_dns_label(text)


def test_api_does_not_import_other_layers() -> None:
    import ast
    from pathlib import Path

    root = Path(c.__file__).parent
    for path in root.rglob("*.py"):
        if "gen" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in {"driver", "controller", "kubeletplugin"}, f"{path}: {n}"
