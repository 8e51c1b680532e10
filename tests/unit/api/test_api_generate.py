"""The committed stubs in api/gen are exactly what api/generate.py produces from api/proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from api import generate

REPO = Path(__file__).resolve().parents[3]


def test_committed_stubs_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "api.generate", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_detects_drift() -> None:
    committed = {"a.py": "x = 1\n", "gone.py": ""}
    fresh = {"a.py": "x = 2\n", "new.py": ""}
    problems = generate.diff(fresh, committed)
    assert any(p.startswith("missing: api/gen/new.py") for p in problems)
    assert any(p.startswith("unexpected: api/gen/gone.py") for p in problems)
    assert any("-x = 1" in p and "+x = 2" in p for p in problems)
    assert generate.diff(fresh, fresh) == []


def test_generated_imports_are_package_absolute() -> None:
    for path in (REPO / "api" / "gen").rglob("*_grpc.py"):
        for line in path.read_text().splitlines():
            if line.startswith("from ") and "_pb2" in line:
                assert line.startswith("from api.gen."), f"{path}: {line}"
