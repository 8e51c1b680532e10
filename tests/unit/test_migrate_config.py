"""`flexmig migrate-config`: knownMigGeometries -> migProfileAllowlist, bad input named by path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.catalog.allowlist import parse_allowlist
from flexmig.cli import main
from flexmig.migrateconfig import MigrateError, geometry_names, map_profile, migrate

DATA = Path(__file__).resolve().parents[1] / "data" / "hami-v2.10"


def _doc(known: Any, **nvidia: Any) -> dict[str, Any]:
    return {"nvidia": {"knownMigGeometries": known, **nvidia}}


def test_both_geometry_shapes_give_the_union_in_order() -> None:
    lists = [
        [{"name": "1g.5gb", "memory": 5120, "count": 7}],
        [{"name": "2g.10gb", "count": 3}, {"name": "1g.5gb"}],
    ]
    groups = [{"group": "g1", "geometries": lists[0]}, {"group": "g2", "geometries": lists[1]}]
    assert geometry_names(lists, "x") == ["1g.5gb", "2g.10gb"]
    assert geometry_names(groups, "x") == ["1g.5gb", "2g.10gb"]


def test_user_guides_config_migrates_to_a_valid_allowlist() -> None:
    cm = yaml.safe_load((DATA / "known-mig-geometries.yaml").read_text())
    result = migrate(cm)
    allowlist = result.values["deviceConfig"]["migProfileAllowlist"]
    parse_allowlist(allowlist)
    assert allowlist == [
        {"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb", "4g.24gb"]},
        {
            "models": ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"],
            "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"],
        },
        {
            "models": ["A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"],
            "profiles": ["1g.10gb", "2g.20gb", "7g.80gb"],
        },
    ]
    # The rounding fix is reported, with where it came from.
    assert any("knownMigGeometries[2]: '7g.79gb' -> '7g.80gb' for A100-80GB" in c for c in result.changes)
    assert result.values["deviceConfig"]["deviceSplitCount"] == 10
    assert result.unmapped == [] and result.not_carried == []
    # The same from the ConfigMap's data map and from the bare document.
    assert migrate(cm["data"]).values == result.values
    assert migrate(yaml.safe_load(cm["data"]["device-config.yaml"])).values == result.values


def test_unmappable_and_unknown_names_are_reported() -> None:
    known = [
        {"models": ["A30"], "allowedGeometries": [[{"name": "1g.6gb"}, {"name": "3g.18gb"}]]},
        {"models": ["Some Future GPU"], "allowedGeometries": [[{"name": "1g.30gb"}]]},
    ]
    result = migrate(_doc(known, overwriteEnv=False, resourceCountName="example.com/vgpu"))
    assert result.values["deviceConfig"]["migProfileAllowlist"] == [
        {"models": ["A30"], "profiles": ["1g.6gb"]},
        {"models": ["Some Future GPU"], "profiles": ["1g.30gb"]},
    ]
    [unmapped] = result.unmapped
    assert (
        "knownMigGeometries[0]: '3g.18gb' is not a profile of A30-24GB" in unmapped and "1g.6gb" in unmapped
    )
    assert any("'Some Future GPU' is not a GPU flexmig knows" in c for c in result.changes)
    assert result.values["deviceConfig"]["resourceNames"] == {"resourceCountName": "example.com/vgpu"}
    assert result.not_carried == ["nvidia.overwriteEnv"]


def test_existing_allowlist_is_merged() -> None:
    known = [{"models": ["A30"], "allowedGeometries": [[{"name": "2g.12gb"}]]}]
    allow = [{"models": ["A30"], "profiles": ["1g.6gb"]}]
    result = migrate(_doc(known, migProfileAllowlist=allow))
    assert result.values["deviceConfig"]["migProfileAllowlist"] == [
        {"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb"]}
    ]


def test_map_profile() -> None:
    offered = ("1g.10gb", "1g.10gb+me", "7g.80gb")
    assert map_profile("7g.79gb", offered) == "7g.80gb"
    assert map_profile("1g.10gb+me", offered) == "1g.10gb+me"
    assert map_profile("7g.70gb", offered) is None
    assert map_profile("junk", offered) is None


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (None, "input: no nvidia section"),
        ([1], "input: must be a mapping, got list"),
        ({"foo": 1}, "input: no nvidia section"),
        ({"nvidia": []}, "input: nvidia: must be a mapping"),
        ({"nvidia": {"defaultMemory": 0}}, r"nvidia.knownMigGeometries: missing"),
        (_doc({"models": []}), r"nvidia.knownMigGeometries: must be a list"),
        (_doc(["x"]), r"nvidia.knownMigGeometries\[0\]: must be a mapping"),
        (_doc([{"models": ["A30"]}]), r"knownMigGeometries\[0\].allowedGeometries: must be a non-empty list"),
        (
            _doc([{"models": "A30", "allowedGeometries": [[{"name": "1g.6gb"}]]}]),
            r"\[0\].models: must be a non-empty list",
        ),
        (
            _doc([{"models": ["A30"], "allowedGeometries": [[{"memory": 1}]]}]),
            r"allowedGeometries\[0\]\[0\].name",
        ),
        (
            _doc([{"models": ["A30"], "allowedGeometries": [[{"name": "1g.6gb", "count": -1}]]}]),
            r"\[0\]\[0\].count",
        ),
        (
            _doc([{"models": ["A30"], "allowedGeometries": [{"group": "g"}]}]),
            r"allowedGeometries\[0\]: a grouped geometry",
        ),
        (
            _doc([{"models": ["A30"], "allowedGeometries": [{"group": "g", "geometries": []}]}]),
            r"allowedGeometries\[0\].geometries: must be a non-empty list",
        ),
        (
            _doc([{"models": ["A30"], "allowedGeometrys": []}]),
            r"knownMigGeometries\[0\]: unknown keys \['allowedGeometrys'\]",
        ),
        (_doc([], defaultCores=101), r"nvidia.defaultCores: 101 is out of range"),
        (_doc([], deviceSplitCount=0), r"nvidia.deviceSplitCount: 0 is not a valid device split count"),
        (
            _doc([], migProfileAllowlist=[{"models": ["A30"], "profiles": ["bad"]}]),
            r"nvidia.migProfileAllowlist\[0\].profiles\[0\]",
        ),
        (
            {"kind": "ConfigMap", "data": {"device-config.yaml": "nvidia: ["}},
            r"input: data.device-config.yaml: not valid YAML",
        ),
    ],
)
def test_bad_input_names_the_path(doc: Any, needle: str) -> None:
    with pytest.raises(MigrateError, match=needle):
        migrate(doc)


def test_cli_writes_values_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "values.yaml"
    src = DATA / "known-mig-geometries.yaml"
    assert main(["migrate-config", str(src), "-o", str(out)]) == 0
    values = yaml.safe_load(out.read_text())
    assert values["deviceConfig"]["migProfileAllowlist"][2]["profiles"][-1] == "7g.80gb"
    err = capsys.readouterr().err
    assert "changed: nvidia.knownMigGeometries[2]: '7g.79gb' -> '7g.80gb'" in err


def test_cli_bad_input_exits_non_zero_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc([{"models": ["A30"], "allowedGeometries": [[{"count": 1}]]}])))
    out = tmp_path / "values.yaml"
    assert main(["migrate-config", str(bad), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert "knownMigGeometries[0].allowedGeometries[0][0].name" in captured.err and str(bad) in captured.err
    assert main(["migrate-config", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def _typo_config(tmp_path: Path) -> Path:
    """HAMi's own knownMigGeometries example (v2.9 chart) with one typo, `1g.5gbx`, in the A100 entry."""
    cm = yaml.safe_load((DATA / "known-mig-geometries.yaml").read_text())
    text = cm["data"]["device-config.yaml"].replace("- - name: 1g.5gb\n", "- - name: 1g.5gbx\n", 1)
    assert "1g.5gbx" in text
    path = tmp_path / "device-config.yaml"
    path.write_text(text)
    return path


def test_cli_refuses_a_partial_migration_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _typo_config(tmp_path)
    out = tmp_path / "values.yaml"
    assert main(["migrate-config", str(src), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert not out.exists()
    # Each unmapped entry is named, with the names the model offers instead; the last line says why.
    assert "NOT MAPPED: nvidia.knownMigGeometries[1]: '1g.5gbx' is not a profile of A100-40GB" in captured.err
    assert "it offers: 1g.5gb," in captured.err
    assert "nothing written" in captured.err and "--allow-partial" in captured.err
    # To stdout: nothing either.
    assert main(["migrate-config", str(src)]) == 1
    assert capsys.readouterr().out == ""


def test_cli_allow_partial_writes_the_values_saying_what_was_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _typo_config(tmp_path)
    out = tmp_path / "values.yaml"
    assert main(["migrate-config", str(src), "-o", str(out), "--allow-partial"]) == 0
    text = out.read_text()
    head = text.split("deviceConfig:")[0]
    assert "# PARTIAL (--allow-partial)" in head and "'1g.5gbx' is not a profile of A100-40GB" in head
    assert all(line.startswith("#") for line in head.splitlines())
    a100 = yaml.safe_load(text)["deviceConfig"]["migProfileAllowlist"][1]
    assert "1g.5gbx" not in a100["profiles"] and "2g.10gb" in a100["profiles"]
    # A complete migration says nothing was dropped.
    full = tmp_path / "full.yaml"
    assert main(["migrate-config", str(DATA / "known-mig-geometries.yaml"), "-o", str(full)]) == 0
    assert "PARTIAL" not in full.read_text()


def test_a_model_with_no_name_left_is_named_and_so_is_a_bad_name_of_an_unknown_model() -> None:
    known = [
        {"models": ["A30"], "allowedGeometries": [[{"name": "1g.5gb"}]]},
        {"models": ["Some Future GPU"], "allowedGeometries": [[{"name": "1g.30gb"}, {"name": "one"}]]},
    ]
    result = migrate(_doc(known))
    assert result.values["deviceConfig"]["migProfileAllowlist"] == [
        {"models": ["Some Future GPU"], "profiles": ["1g.30gb"]}
    ]
    assert any("'1g.5gb' is not a profile of A30-24GB" in u and "1g.6gb" in u for u in result.unmapped)
    assert any("models A30: no profile left" in u for u in result.unmapped)
    assert any("'one' for 'Some Future GPU' is not a MIG profile name" in u for u in result.unmapped)
