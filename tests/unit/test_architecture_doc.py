"""docs/architecture.md names real files and functions: every `path` and `path::name` it cites exists.

The page answers "where is placement decided / a GPU instance created / the checkpoint written" by
naming code; when code moves or is renamed the page must follow, and this test says where it did not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"

# A backticked repository path (a folder ends with '/'), optionally followed by ::Name or ::Class.method.
_CITE = re.compile(r"`((?:[\w.-]+/)+(?:[\w.-]+\.(?:py|md|toml))?|[\w.-]+\.(?:py|md|toml))(?:::([\w.]+))?`")
_TOP_LEVEL = (
    "api/",
    "driver/",
    "controller/",
    "kubeletplugin/",
    "flexmig/",
    "deployments/",
    "docs/",
    "tests/",
    "benchmarks/",
    ".ci/",
)


def _citations() -> list[tuple[str, str | None]]:
    text = DOC.read_text(encoding="utf-8")
    out: list[tuple[str, str | None]] = []
    for m in _CITE.finditer(text):
        path, name = m.group(1), m.group(2)
        if "/" in path and not path.startswith(_TOP_LEVEL):
            continue
        out.append((path, name))
    return out


def _defines(module: ast.Module, dotted: str) -> bool:
    body: list[ast.stmt] = module.body
    for part in dotted.split("."):
        found = next(
            (
                node
                for node in body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and node.name == part
            ),
            None,
        )
        if found is None:
            return False
        body = found.body
    return True


def test_the_page_cites_code() -> None:
    cited = _citations()
    # The three questions of the page are answered by naming functions, not only files.
    assert sum(1 for _, name in cited if name) >= 30, cited


def _key(citation: tuple[str, str | None]) -> tuple[str, str]:
    return citation[0], citation[1] or ""


_CITED: list[tuple[str, str | None]] = sorted(set(_citations()), key=_key)


@pytest.mark.parametrize(("path", "name"), _CITED)
def test_cited_code_exists(path: str, name: str | None) -> None:
    target = ROOT / path
    assert target.exists(), f"docs/architecture.md cites {path}, which does not exist"
    if name is not None:
        assert target.suffix == ".py", f"{path}::{name}: only Python files have functions"
        module = ast.parse(target.read_text(encoding="utf-8"))
        assert _defines(module, name), (
            f"docs/architecture.md cites {path}::{name}, which {path} does not define"
        )
