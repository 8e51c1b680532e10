"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    # A command run in-process (e.g. `flexmig status` from a test) configures structlog for the whole
    # process; without this, a later test's `structlog.testing.capture_logs()` depends on test order.
    yield
    structlog.reset_defaults()
