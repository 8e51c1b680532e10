"""flexmig's own image (deployments/image/build.sh) in the REAL containerd + kubelet the suite builds.

The image the chart pulls by default (`ghcr.io/flexmig/flexmig:<appVersion>`) is built with the recipe
users run (or taken from its cache, keyed by the hash of its inputs), imported with `ctr images
import` (no registry), and run by a real kubelet with the controller's restrictions: the image's own
user (no runAsUser; `runAsNonRoot` makes the kubelet check that it is not root), read-only root
filesystem, no privilege escalation, no capabilities. The containers print `flexmig --version`
(through the image's entrypoint), import the compiled dependencies, and try to write to `/`.

The file is named test_realnode_* so that tests/e2e/conftest.py builds the node binaries before any
test runs. A cold image build takes minutes, hence the longer timeout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.kube.rest import request

from .cluster import ControlPlane, wait_until
from .k8sobjects import create_namespace
from .realnode.images import ProductImage, product_image
from .realnode.node import TOLERATE_ALL, NodeBinaries, RealNode

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]

NON_ROOT = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
# Every extension module the components load, and the import path of each component's entry point.
IMPORTS = (
    "import grpc, numpy, highspy, kubernetes, cryptography, yaml, cel, pynvml, prometheus_client; "
    "import flexmig.cli, controller, kubeletplugin, driver, api.gen.dra_v1.api_pb2; "
    "import sys; print('IMPORTS-OK', sys.flags.dont_write_bytecode, sys.version.split()[0]); "
    # The .pyc flags (PEP 552) of our code and of the standard library: 1, hash-based and unchecked,
    # so nothing is recompiled at start whatever the file times.
    "import importlib.util, os; "
    "print('PYC', *(open(importlib.util.cache_from_source(m.__file__), 'rb').read(8)[4] "
    "for m in (flexmig.cli, os, grpc)))"
)
# What the chart's init container runs (/bin/sh, ln), the user, and a write to the root filesystem.
SHELL_PROBE = (
    "echo UID=$(id -u) GID=$(id -g); "
    "if touch /probe 2>/dev/null; then echo ROOTFS=writable; else echo ROOTFS=read-only; fi; "
    "ln -sf /nonexistent /tmp/link && echo LN-OK"
)


@pytest.fixture(scope="module")
def image() -> ProductImage:
    return product_image()


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, node_bin_dir: Path, image: ProductImage) -> Iterator[RealNode]:
    if os.geteuid() != 0:
        raise AssertionError("the real-node tests need root (containerd, runc, kubelet): run pytest as root")
    # Short: containerd's unix socket paths live under it.
    root = Path(tempfile.mkdtemp(prefix="fmimg-", dir="/tmp"))
    real = RealNode(
        control_plane,
        NodeBinaries(node_bin_dir),
        f"image-{uuid.uuid4().hex[:6]}",
        root / "n",
        root / "cdi",
        labels={},
    )
    try:
        real.start()
        real.ctr("images", "import", str(image.tar), timeout_s=300)
    except BaseException:
        real.stop()
        raise
    yield real
    real.stop()
    real.cleanup()
    shutil.rmtree(root, ignore_errors=True)


def container(name: str, image: ProductImage, **run: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": image.name,
        "imagePullPolicy": "Never",  # no registry: only the imported image may be used
        "securityContext": NON_ROOT,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        **run,
    }


def test_image_is_imported_under_the_charts_default_name(node: RealNode, image: ProductImage) -> None:
    values = yaml.safe_load((REPO / "deployments/helm/flexmig/values.yaml").read_text())["image"]
    chart = yaml.safe_load((REPO / "deployments/helm/flexmig/Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert image.name == f"{values['repository']}:{values['tag'] or chart['appVersion']}"
    assert chart["appVersion"] == version
    assert image.name in node.ctr("images", "list", "-q").stdout.split()


def test_image_runs_non_root_on_a_read_only_root_filesystem(
    control_plane: ControlPlane, node: RealNode, image: ProductImage
) -> None:
    api = control_plane.api_client()
    ns = f"image-{uuid.uuid4().hex[:6]}"
    try:
        create_namespace(api, ns)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "flexmig-image"},
            "spec": {
                "nodeName": node.name,  # straight to the real node, no scheduling needed
                "hostNetwork": True,  # no CNI on the test node
                "tolerations": TOLERATE_ALL,
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "tmp", "emptyDir": {}}],
                "containers": [
                    container("version", image, args=["--version"]),  # the image's ENTRYPOINT
                    container("imports", image, command=["python", "-c", IMPORTS]),
                    container("shell", image, command=["/bin/sh", "-c", SHELL_PROBE]),
                ],
            },
        }
        request(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod)
        found: list[dict[str, Any]] = []

        def done() -> bool:
            found[:] = [request(api, "GET", f"/api/v1/namespaces/{ns}/pods/flexmig-image")]
            return found[0].get("status", {}).get("phase") in ("Succeeded", "Failed")

        wait_until(done, 180, "the image's pod to finish")
        [got] = found
        logs = {c: node.container_log(got, c) for c in ("version", "imports", "shell")}
        statuses = {s["name"]: s for s in got["status"]["containerStatuses"]}
        assert got["status"]["phase"] == "Succeeded", (got["status"], logs)
        for name, status in statuses.items():
            assert status["state"]["terminated"]["exitCode"] == 0, (name, status, logs)
            assert status["image"] == image.name, status
        version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        assert logs["version"].startswith(f"flexmig {version} (revision "), logs
        assert "gpu.flexmig.dev" in logs["version"]
        # The bytecode is built in; the interpreter is the image's Debian python3.
        assert "IMPORTS-OK 1 3.11." in logs["imports"], logs
        assert "PYC 1 1 1" in logs["imports"], logs
        assert "UID=65532 GID=65532" in logs["shell"], logs
        assert "ROOTFS=read-only" in logs["shell"] and "LN-OK" in logs["shell"], logs
    finally:
        try:
            request(api, "DELETE", f"/api/v1/namespaces/{ns}")
        finally:
            api.close()
