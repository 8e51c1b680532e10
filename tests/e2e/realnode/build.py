"""Build (or find cached) the real-node binaries: tests/e2e/k8sbuild/node/build.sh.

`FLEXMIG_NODE_BIN` may point at a directory with them instead (kubelet, containerd, ctr,
containerd-shim-runc-v2, runc, cdivalidate, busybox).

crictl (for debugging a real-node test) is cached apart from that set, in its own directory, so that
it never invalidates the set's cache: `crictl_binary()` finds or builds it (`build.sh crictl`).
`FLEXMIG_CRICTL` may name a crictl binary instead; a `crictl` inside `FLEXMIG_NODE_BIN` is used too.

The pod network's binaries (CNI plugins bridge, host-local, loopback and kube-proxy) are a third set in
its own cache directory (`build.sh net`); `net_binaries()` finds or builds it. `FLEXMIG_NET_BIN` may
point at a directory with them instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

NET_BINARIES = ("bridge", "host-local", "loopback", "kube-proxy")
NODE_BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "k8sbuild" / "node" / "build.sh"

# The outcome of the first crictl lookup in this process (a path or the error): a failed build is
# not retried by every test that wants crictl for a failure dump.
_crictl: dict[str, Path | str] = {}


class NodeBuildError(RuntimeError):
    pass


def _run_build(args: list[str], timeout_s: float) -> Path:
    """Runs build.sh with `args` and returns the path its last stdout line names."""
    proc = subprocess.run(
        ["bash", str(NODE_BUILD_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    what = " ".join([str(NODE_BUILD_SCRIPT), *args])
    if proc.returncode != 0:
        raise NodeBuildError(f"{what} failed with exit code {proc.returncode}:\n{proc.stderr[-6000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise NodeBuildError(f"{what} printed no path")
    return Path(lines[-1].strip())


def build_node_binaries(timeout_s: float = 3 * 3600) -> Path:
    override = os.environ.get("FLEXMIG_NODE_BIN")
    if override:
        return Path(override)
    return _run_build([], timeout_s)


def net_binaries(timeout_s: float = 3600) -> Path:
    """The directory with bridge, host-local, loopback and kube-proxy (k8sbuild/node/build.sh net)."""
    override = os.environ.get("FLEXMIG_NET_BIN")
    path = Path(override) if override else _run_build(["net"], timeout_s)
    missing = [b for b in NET_BINARIES if not os.access(path / b, os.X_OK)]
    if missing:
        raise NodeBuildError(f"{path} lacks {missing}: run {NODE_BUILD_SCRIPT} net")
    return path


def crictl_binary(timeout_s: float = 3600) -> Path:
    """The crictl binary (sigs.k8s.io/cri-tools, version in k8sbuild/node/versions.env).

    Instant when cached (build_node_binaries() has built it already unless its build failed); raises
    NodeBuildError with the build's error otherwise, the same error on every later call.
    """
    if "path" in _crictl:
        return Path(_crictl["path"])
    if "error" in _crictl:
        raise NodeBuildError(str(_crictl["error"]))
    override = os.environ.get("FLEXMIG_CRICTL")
    node_bin = os.environ.get("FLEXMIG_NODE_BIN")
    try:
        if override:
            path = Path(override)
        elif node_bin and (Path(node_bin) / "crictl").is_file():
            path = Path(node_bin) / "crictl"
        else:
            path = _run_build(["crictl"], timeout_s)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise NodeBuildError(f"crictl: {path} is not an executable file")
    except (NodeBuildError, OSError, subprocess.SubprocessError) as exc:
        _crictl["error"] = str(exc)
        raise NodeBuildError(str(exc)) from exc
    _crictl["path"] = path
    return path
