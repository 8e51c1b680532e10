"""What build of flexmig is running: one answer for `flexmig --version`, every component's
`flexmig_build_info` metric and the `version` field of every log line.

The version is the installed distribution's (pyproject.toml); the revision comes from the image
(`FLEXMIG_REVISION`, set by the Dockerfile's build argument of the same name), "unknown" elsewhere.
"""

from __future__ import annotations

import functools
import os
import platform
from importlib import metadata

DISTRIBUTION = "flexmig"

HAMI_METRIC_ZONE = "vGPU"
"""HAMi's collectors add the constant label zone="vGPU" to hami_* metrics; flexmig's carry it too, so
HAMi's dashboards and alerts that select on it keep working."""


@functools.cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def revision() -> str:
    return os.environ.get("FLEXMIG_REVISION", "").strip() or "unknown"


def build_labels() -> dict[str, str]:
    """Labels of `flexmig_build_info` (value 1)."""
    return {"version": version(), "revision": revision(), "python_version": platform.python_version()}
