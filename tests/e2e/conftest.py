"""Fixtures for the e2e tests: a real control plane built from the Kubernetes Go modules.

The (possibly long, cold) build of the binaries happens once per session right after collection,
before any test runs, so it never counts against a single test's timeout. The session-scoped
`control_plane` fixture then starts etcd + kube-apiserver + kube-controller-manager + kube-scheduler
and stops them at the end; if any test failed, the control plane's logs are kept and their path is
printed.

Environment:
  FLEXMIG_K8S_BIN    use prebuilt binaries from this directory instead of running build.sh
  FLEXMIG_K8S_CACHE  where build.sh caches binaries (default ~/.cache/flexmig/k8s)
  FLEXMIG_E2E_KEEP   keep the control plane's temp dir and logs even when all tests pass
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import ControlPlane, ControlPlaneError, build_binaries
from .realnode.build import NodeBuildError, build_node_binaries

E2E_DIR = Path(__file__).resolve().parent

_build: dict[str, object] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs against a real Kubernetes control plane (tests/e2e)")


def _is_e2e(item: pytest.Item) -> bool:
    return E2E_DIR in Path(str(item.path)).resolve().parents


@pytest.hookimpl(tryfirst=True)  # before -m deselection, so `-m "not e2e"` sees the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_e2e(item):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection, so a deselected e2e suite builds nothing
def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    e2e_items = [item for item in session.items if _is_e2e(item)]
    if not e2e_items or config.option.collectonly or "bin_dir" in _build or "error" in _build:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    start = time.monotonic()
    if reporter is not None:
        reporter.write_line(
            "[e2e] building/locating control-plane binaries (tests/e2e/k8sbuild/build.sh) ..."
        )
    try:
        _build["bin_dir"] = build_binaries()
    except (ControlPlaneError, OSError, subprocess.SubprocessError) as exc:
        _build["error"] = str(exc)
    if reporter is not None:
        reporter.write_line(
            f"[e2e] binaries: {_build.get('bin_dir', 'BUILD FAILED')} ({time.monotonic() - start:.0f}s)"
        )
    # The real-node tests (kubelet, containerd, runc, CDI validator): built once, also before any test.
    if any(Path(str(item.path)).name.startswith("test_realnode") for item in e2e_items):
        start = time.monotonic()
        try:
            _build["node_bin_dir"] = build_node_binaries()
        except (NodeBuildError, OSError, subprocess.SubprocessError) as exc:
            _build["node_error"] = str(exc)
        if reporter is not None:
            where = _build.get("node_bin_dir", "BUILD FAILED")
            reporter.write_line(f"[e2e] node binaries: {where} ({time.monotonic() - start:.0f}s)")


@pytest.fixture(scope="session")
def node_bin_dir() -> Path:
    """kubelet, containerd, ctr, containerd-shim-runc-v2, runc, cdivalidate, busybox (k8sbuild/node)."""
    if "node_error" in _build:
        pytest.fail(f"building the node binaries failed:\n{_build['node_error']}", pytrace=False)
    if "node_bin_dir" not in _build:
        _build["node_bin_dir"] = build_node_binaries()
    bin_dir = _build["node_bin_dir"]
    assert isinstance(bin_dir, Path)
    return bin_dir


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    if "error" in _build:
        pytest.fail(f"building the control-plane binaries failed:\n{_build['error']}", pytrace=False)
    if "bin_dir" not in _build:  # e.g. the fixture is used outside tests/e2e
        _build["bin_dir"] = build_binaries()
    bin_dir = _build["bin_dir"]
    assert isinstance(bin_dir, Path)
    return bin_dir


@pytest.fixture(scope="module")
def helm_bin(k8s_bin_dir: Path) -> Path:
    """The built `helm`; the chart tests run it without a cluster (template, lint) and for dry runs."""
    return k8s_bin_dir / "helm"


@contextlib.contextmanager
def _uncaptured(config: pytest.Config) -> Iterator[None]:
    """Let a fixture's message reach the terminal even while pytest captures output."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, k8s_bin_dir: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(k8s_bin_dir)
    with _uncaptured(request.config):
        cp.start()  # on failure it stops itself, keeps its logs and prints where they are
        timings = ", ".join(f"{k} {v:.1f}s" for k, v in cp.start_seconds.items())
        print(f"\n[e2e] control plane at {cp.server} ready ({timings}); logs {cp.log_dir}")
    failed_before = request.session.testsfailed
    try:
        yield cp
    finally:
        with _uncaptured(request.config):
            cp.stop(failed=request.session.testsfailed > failed_before)
