"""Build (or find cached) the real-node binaries: tests/e2e/k8sbuild/node/build.sh.

`FLEXMIG_NODE_BIN` may point at a directory with them instead (kubelet, containerd, ctr,
containerd-shim-runc-v2, runc, cdivalidate, busybox).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

NODE_BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "k8sbuild" / "node" / "build.sh"


class NodeBuildError(RuntimeError):
    pass


def build_node_binaries(timeout_s: float = 3 * 3600) -> Path:
    override = os.environ.get("FLEXMIG_NODE_BIN")
    if override:
        return Path(override)
    proc = subprocess.run(
        ["bash", str(NODE_BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if proc.returncode != 0:
        raise NodeBuildError(
            f"{NODE_BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{proc.stderr[-6000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise NodeBuildError(f"{NODE_BUILD_SCRIPT} printed no bin directory")
    return Path(lines[-1].strip())
