"""The image recipe's inputs agree: deployments/image/build.sh, the Dockerfile,
deployments/constraints.txt, pyproject.toml and the chart.

Fast checks of what a build would use (tests/e2e/test_realnode_image.py builds and runs the image):
the constraints naming every direct dependency at pyproject's pin, the Dockerfile doing what
build.sh does (same packages, install script, user, environment, entrypoint, no unverified digest),
the image's name being the chart's default, and the cache key changing with every input.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "deployments" / "image" / "build.sh"
# What build.sh hashes into its cache key (besides its settings), relative to the repository.
INPUTS = (
    "deployments/image/build.sh",
    "deployments/image/install.sh",
    "deployments/image/packages.txt",
    "deployments/constraints.txt",
    "pyproject.toml",
    "README.md",
    "api",
    "driver",
    "controller",
    "kubeletplugin",
    "flexmig",
)


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "deployments" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_constraints_pin_pyprojects_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = _constraints()
    for raw in project["project"]["dependencies"] + project["build-system"]["requires"]:
        req = Requirement(raw)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins, f"{req.name} (pyproject.toml) is missing from deployments/constraints.txt"
        assert not req.specifier or req.specifier.contains(pins[key]), (
            f"{req.name}: constraints.txt pins {pins[key]}, pyproject.toml says {req.specifier}"
        )


def _version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^(\w+)\s+(.*)$", text, re.M)]


def _build_sh_list(name: str) -> list[str]:
    """The quoted items of build.sh's bash array `name=( ... )`, comments skipped."""
    text = BUILD_SH.read_text()
    body = re.search(rf"^{name}=\(\n(.*?)^\)$", text, re.M | re.S)
    assert body, f"build.sh has no array {name}"
    items = re.findall(r'^\s*"([^"]*)"$', body.group(1), re.M)
    assert items, f"build.sh's array {name} is empty"
    return items


def test_dockerfile_does_what_build_sh_does() -> None:
    instructions = _dockerfile_instructions()
    text = (REPO / "Dockerfile").read_text()
    assert "@sha256:" not in text.split("FROM", 1)[1], "a digest in the Dockerfile must have been verified"
    base = [args for op, args in instructions if op == "ARG" and args.startswith("BASE=")]
    assert base == ["BASE=docker.io/library/debian:bookworm-slim"], base
    assert "SUITE=bookworm" in BUILD_SH.read_text()
    runs = " ".join(args for op, args in instructions if op == "RUN")
    # The same Debian packages (the file itself), install script and constraints.
    assert runs.count("source=deployments/image/packages.txt") == 2
    assert "apt-get install -y --no-install-recommends $(sed -e 's/#.*//' /tmp/packages.txt)" in runs
    assert "source=deployments/image/install.sh" in runs and "sh /tmp/install.sh /wheels" in runs
    assert "PIP_CONSTRAINT=/src/deployments/constraints.txt" in text
    assert 'PIP_CONSTRAINT="$repo/deployments/constraints.txt"' in BUILD_SH.read_text()
    # Both install from the wheels only, through install.sh.
    assert "--no-index" in (REPO / "deployments/image/install.sh").read_text()
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for path in (
        "deployments/constraints.txt",
        "deployments/image/packages.txt",
        "deployments/image/install.sh",
    ):
        assert f"!{path}" in ignore, f".dockerignore keeps {path} out of the build context"
    # The same configuration.
    env = " ".join(args for op, args in instructions if op == "ENV" and "PATH=" in args)
    for item in _build_sh_list("env"):
        assert item in env.split(), f"Dockerfile ENV lacks {item} (build.sh sets it)"
    build_sh = BUILD_SH.read_text()
    assert ("USER", "65532:65532") in instructions and "--config.user 65532:65532" in build_sh
    assert ("ENTRYPOINT", '["flexmig"]') in instructions and "--config.entrypoint flexmig" in build_sh
    assert ("CMD", '["--help"]') in instructions and "--config.cmd --help" in build_sh
    for label in _build_sh_list("labels"):
        key = label.split("=", 1)[0]
        assert f"{key}=" in text, f"Dockerfile lacks the label {key}"
    version = re.search(r"^ARG VERSION=(\S+)$", text, re.M)
    assert version and version.group(1) == _version()


def test_image_name_is_the_charts_default() -> None:
    values = yaml.safe_load((REPO / "deployments/helm/flexmig/values.yaml").read_text())["image"]
    chart = yaml.safe_load((REPO / "deployments/helm/flexmig/Chart.yaml").read_text())
    assert values["tag"] == "" and chart["appVersion"] == _version()
    default = re.search(r'^IMAGE="\$\{IMAGE:-([^}]*)\}"$', BUILD_SH.read_text(), re.M)
    assert default, "build.sh sets no default IMAGE"
    assert default.group(1) == f"{values['repository']}:$version"


def test_packages_txt_names_what_the_extension_modules_need() -> None:
    lines = (REPO / "deployments/image/packages.txt").read_text().splitlines()
    packages = {line.split("#", 1)[0].strip() for line in lines} - {""}
    assert packages == {"python3", "python3-venv", "libstdc++6"}


def _key(root: Path, **env: str) -> str:
    proc = subprocess.run(
        ["bash", str(root / "deployments/image/build.sh"), "--print-key"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **env},
    )
    return proc.stdout.strip()


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the build's inputs (and a file that is not one)."""
    root = tmp_path / "repo"
    for rel in INPUTS:
        src, dst = REPO / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("x = 1\n")
    return root


def test_cache_key_changes_with_every_input(tree: Path) -> None:
    base = _key(tree)
    assert re.fullmatch(r"[0-9a-f]{16}", base)
    assert _key(tree) == base
    # Neither tests nor bytecode go into the image.
    (tree / "tests" / "test_x.py").write_text("x = 2\n")
    (tree / "flexmig" / "__pycache__").mkdir(exist_ok=True)
    (tree / "flexmig" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"junk")
    assert _key(tree) == base
    seen = {base}
    for rel in INPUTS:
        path = tree / rel
        target = path if path.is_file() else sorted(path.rglob("*.py"))[0]
        original = target.read_bytes()
        target.write_bytes(original + b"\n# changed\n")
        changed = _key(tree)
        assert changed not in seen, f"changing {target.relative_to(tree)} did not change the key"
        seen.add(changed)
        target.write_bytes(original)
    assert _key(tree) == base
    (tree / "kubeletplugin" / "new_module.py").write_text("")  # a new source file
    assert _key(tree) not in seen
    (tree / "kubeletplugin" / "new_module.py").unlink()
    for setting in ({"IMAGE": "r.example/f:1"}, {"REVISION": "abc"}, {"SOURCE_DATE_EPOCH": "1"}):
        assert _key(tree, **setting) not in seen, setting
