"""migProfileAllowlist parsing: strict validation, defaults, model matching."""

from __future__ import annotations

import json
from typing import Any

import pytest
import structlog
import yaml

from driver.catalog.allowlist import (
    DEFAULT_MIG_PROFILE_ALLOWLIST,
    AllowlistError,
    parse_allowlist,
)


def _entry(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"models": ["A30"], "profiles": ["1g.6gb"]}
    base.update(fields)
    return base


def test_parses_yaml_and_json() -> None:
    text = """
    - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
      profiles: ["1g.5gb", "3g.20gb"]
    - models: [H20]
      profiles: [1g.12gb]
    """
    parsed = parse_allowlist(yaml.safe_load(text))
    assert parse_allowlist(json.loads(json.dumps(parsed.to_data()))) == parsed
    assert parsed.profiles_for("NVIDIA A100-SXM4-40GB") == ("1g.5gb", "3g.20gb")
    assert parsed.profiles_for("NVIDIA A100-PCIE-40GB") == ("1g.5gb", "3g.20gb")
    assert parsed.profiles_for("NVIDIA H20") == ("1g.12gb",)
    assert parsed.profiles_for("NVIDIA H200") is None


def test_empty_list_is_valid() -> None:
    assert parse_allowlist([]).entries == ()


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (None, ["migProfileAllowlist", "expected a list", "NoneType"]),
        ({"models": ["A30"]}, ["expected a list", "dict"]),
        ("A30", ["expected a list", "str"]),
        ([["A30"]], ["migProfileAllowlist[0]", "expected a mapping", "models, profiles"]),
        ([_entry(), "x"], ["migProfileAllowlist[1]", "expected a mapping"]),
        ([{"profiles": ["1g.6gb"]}], ["migProfileAllowlist[0].models", "missing"]),
        ([{"models": ["A30"]}], ["migProfileAllowlist[0].profiles", "missing"]),
        ([_entry(models="A30")], ["[0].models", "expected a list of strings", "str"]),
        ([_entry(profiles={"a": 1})], ["[0].profiles", "expected a list of strings", "dict"]),
        ([_entry(models=None)], ["[0].models", "NoneType"]),
        ([_entry(models=[])], ["[0].models", "must not be empty"]),
        ([_entry(profiles=[])], ["[0].profiles", "must not be empty"]),
        ([_entry(models=["A30", 3])], ["[0].models[1]", "expected a string", "int"]),
        ([_entry(profiles=[None])], ["[0].profiles[0]", "expected a string"]),
        ([_entry(models=["  "])], ["[0].models[0]", "must not be empty"]),
        ([_entry(profiles=["1g.6gb", "1g.6gb"])], ["[0].profiles[1]", "listed twice"]),
        ([_entry(profiles=["2g.10g"])], ["[0].profiles[0]", "'2g.10g'", "+me.all", "-me", "<G>g.<GB>gb"]),
        ([_entry(profiles=["1g.6gb", "MIG 1g.6gb"])], ["[0].profiles[1]", "not a MIG profile name"]),
        ([_entry(profiles=["1g.6gb+ME"])], ["[0].profiles[0]"]),
        (
            [_entry(extra=1)],
            ["migProfileAllowlist[0]", "unknown field", "extra", "allowed fields: models, profiles"],
        ),
        (
            [_entry(models=["A100-SXM4-40GB"]), _entry(models=["A100-PCIE-40GB"])],
            ["migProfileAllowlist[1].models", "A100-PCIE-40GB", "migProfileAllowlist[0]"],
        ),
    ],
)
def test_malformed(data: object, fragments: list[str]) -> None:
    with pytest.raises(AllowlistError) as info:
        parse_allowlist(data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_model_warns_and_still_matches_exactly() -> None:
    with structlog.testing.capture_logs() as logs:
        parsed = parse_allowlist([{"models": ["NVIDIA Z999"], "profiles": ["1g.10gb"]}])
    assert any(e["log_level"] == "warning" and e.get("model") == "NVIDIA Z999" for e in logs)
    assert parsed.profiles_for("NVIDIA Z999") == ("1g.10gb",)
    assert parsed.profiles_for("NVIDIA Z9999") is None


def test_defaults_have_the_user_guide_shape_and_known_models() -> None:
    data = DEFAULT_MIG_PROFILE_ALLOWLIST.to_data()
    # The user guide's nine entries, then A800 40/80GB, H800, H20 141GB and GB200 (docs/hardware.md).
    assert len(data) == 14
    for entry in data:
        assert set(entry) == {"models", "profiles"}
    with structlog.testing.capture_logs() as logs:
        assert parse_allowlist(data) == DEFAULT_MIG_PROFILE_ALLOWLIST
    assert not [e for e in logs if e["log_level"] == "warning"]


def test_default_a100_80gb_uses_nvidia_name() -> None:
    profiles = DEFAULT_MIG_PROFILE_ALLOWLIST.profiles_for("NVIDIA A100-SXM4-80GB")
    assert profiles is not None
    assert "7g.80gb" in profiles and "7g.79gb" not in profiles


def test_default_h200_does_not_get_h20_list() -> None:
    assert DEFAULT_MIG_PROFILE_ALLOWLIST.profiles_for("NVIDIA H200") == (
        "1g.18gb",
        "2g.35gb",
        "3g.71gb",
        "7g.141gb",
    )
    assert DEFAULT_MIG_PROFILE_ALLOWLIST.profiles_for("NVIDIA H20") == (
        "1g.12gb",
        "2g.24gb",
        "3g.48gb",
        "7g.96gb",
    )


def test_default_data_copy_is_independent() -> None:
    from driver.catalog.allowlist import default_allowlist_data

    data = default_allowlist_data()
    data[0]["profiles"].append("x")
    assert "x" not in default_allowlist_data()[0]["profiles"]


def test_hami_guides_7g_79gb_is_read_as_7g_80gb_with_a_warning() -> None:
    """HAMi's guide and example config name the A100-80GB's full profile 7g.79gb; NVML says 7g.80gb."""
    from driver.catalog.discover import discover
    from driver.catalog.types import CatalogWarningKind
    from driver.nvml.sim import SimGpuSpec, init_memory_sim, open_sim

    allowlist = parse_allowlist(
        [{"models": ["A100-SXM4-80GB"], "profiles": ["1g.10gb", "7g.79gb", "5g.99gb"]}]
    )
    with open_sim(init_memory_sim([SimGpuSpec("A100-80GB")])) as nvml:
        catalog = discover(nvml, 0, allowlist)
    assert {p.name for p in catalog.profiles} == {"1g.10gb", "7g.80gb"}
    kinds = {(w.kind, w.profile) for w in catalog.warnings}
    assert (CatalogWarningKind.PROFILE_NAME_ROUNDED, "7g.79gb") in kinds
    assert (CatalogWarningKind.PROFILE_NOT_OFFERED, "5g.99gb") in kinds
