"""The image build's inputs agree: Dockerfile, deployments/constraints.txt, pyproject.toml, chart.

No container engine here, so this checks what a build would use: the base pinned by digest, the
constraints file copied into the build and naming every direct dependency at pyproject's pin, the
OCI labels, and the version the image and the chart's default tag carry.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


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


def test_dockerfile_pins_base_uses_constraints_and_labels() -> None:
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.search(r"@sha256:[0-9a-f]{64}$", base.group(1)), (
        "the base image is not pinned by digest"
    )
    assert "COPY deployments/constraints.txt" in text and "PIP_CONSTRAINT=" in text
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "!deployments/constraints.txt" in ignore, ".dockerignore keeps the constraints out of the context"
    for key in ("title", "version", "revision", "created", "source", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in text, key
    version = re.search(r"^ARG VERSION=(\S+)$", text, re.M)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "deployments/helm/flexmig/Chart.yaml").read_text())["appVersion"]
    assert version and version.group(1) == project == chart
