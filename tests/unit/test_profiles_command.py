"""`flexmig profiles`: every model name the allowlist accepts works, unconfirmed rows are marked."""

from __future__ import annotations

import pytest

from driver.catalog.allowlist import default_allowlist_data
from driver.catalog.models import KNOWN_MODELS, resolve_model
from driver.catalog.simulated import resolve_sku
from driver.nvml.sim import SKUS
from flexmig.cli import main

ALLOWLIST_NAMES = sorted({m for entry in default_allowlist_data() for m in entry["models"]})
IDENTIFIERS = sorted({i for m in KNOWN_MODELS for i in m.identifiers()})


def _run(model: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["profiles", model])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("name", sorted(set(ALLOWLIST_NAMES) | set(IDENTIFIERS)))
def test_every_name_the_allowlist_accepts_prints_that_models_table(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = _run(name, capsys)
    assert rc == 0, err
    model = resolve_model(name)
    assert model is not None
    board = SKUS[resolve_sku(name)]
    assert resolve_model(board.product_name) is model  # a board of the model the name means
    assert out.splitlines()[0].startswith(f"GPU instance profiles of {model.key} ({board.product_name},")


@pytest.mark.parametrize(
    ("alias", "sku"),
    [
        ("A100-40GB-PCIe", "A100-PCIE-40GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("H100-PCIE-80GB", "H100-PCIE-80GB"),
        ("H200-SXM5", "H200-141GB"),
        ("H200 NVL", "H200-NVL-141GB"),
        ("H100 on GH200", "H100-96GB"),
        ("h100 on gh200", "H100-96GB"),
        ("H100-PCIE-94GB", "H100-94GB"),
        ("A100-80GB-PCIe", "A100-80GB"),
        ("H20", "H20-96GB"),
    ],
)
def test_aliases_pick_the_board_they_name(alias: str, sku: str) -> None:
    assert resolve_sku(alias) == sku


def _rows(out: str) -> dict[str, list[str]]:
    """Table rows by profile name, each without the allowlist star: name, id, instances, GiB, SMs..."""
    rows: dict[str, list[str]] = {}
    for line in out.splitlines()[2:]:
        if " = " in line:  # the legend: the table is over
            break
        cells = line.split()
        cells = cells[1:] if cells[0] == "*" else cells
        rows[cells[0]] = cells
    return rows


def test_unconfirmed_rows_are_marked_with_their_notes(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run("B200", capsys)
    assert rc == 0
    rows = _rows(out)
    assert len(rows) == 7 and all(r[-2] == "no" for r in rows.values())
    assert "Confirmed = no: not every fact of the row is confirmed by a public capture:" in out
    assert "3g.90gb, 7g.180gb: B200: placements [D]" in out  # grouped by note
    assert "2g.45gb: B200: placements [D]; DEC 2 / JPEG 2 [C]" in out


def test_confirmed_model_has_no_unconfirmed_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run("H100-SXM5-80GB", capsys)
    assert rc == 0
    rows = _rows(out)
    assert len(rows) == 7 and all(r[-2] == "yes" for r in rows.values())
    assert "Confirmed = no" not in out
    assert rows["7g.80gb"][4] == "132"


def test_pcie_board_shows_its_own_sms(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run("H100 PCIe", capsys)
    assert rc == 0
    sms = [int(r[4]) for r in _rows(out).values()]
    assert sms == [14, 14, 14, 30, 46, 62, 114]


def test_unknown_model_lists_keys_and_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run("H2", capsys)
    assert rc == 2
    assert "unknown GPU model 'H2'" in err and "A30-24GB (NVIDIA A30)" in err
    assert "H100 on GH200" in err and "A100-40GB-PCIe" in err
