"""The soak runs on the real control plane like tests/e2e, so `-m "not e2e"` deselects it too."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs against a real Kubernetes control plane")
