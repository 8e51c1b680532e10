"""Suite-wide fixtures."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    # A command run in-process (e.g. `flexmig status` from a test) configures structlog for the whole
    # process; without this, a later test's `structlog.testing.capture_logs()` depends on test order.
    # A service command (`flexmig controller`) also routes stdlib records (urllib3's retries) to
    # stderr and installs exception hooks: undone too, or a later test's stderr depends on order.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hooks = (sys.excepthook, threading.excepthook)
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    sys.excepthook, threading.excepthook = hooks
