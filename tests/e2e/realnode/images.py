"""Container images without a registry: OCI image layout tars holding one static busybox.

`write_image_tar` writes an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/...`) with one
uncompressed layer (busybox and its applet links, plus the mount-point directories a runtime expects)
and the image name in the index's `io.containerd.image.name` annotation, which is what
`ctr images import` names the image after. The sandbox ("pause") image is the same layer with an
entrypoint that sleeps until it is told to stop.

flexmig's own image is not written here: `product_image()` builds it with the recipe users run,
deployments/image/build.sh, once per session (cached across sessions by the hash of its inputs).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TEST_IMAGE = "flexmig.test/busybox:e2e"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"  # containerd 2.4's default sandbox image
# nc: a pod on the pod network fetches a Service (test_realnode_chart.py); Debian's static busybox
# wget crashes (SIGSEGV) even for a numeric address.
APPLETS = ("sh", "sleep", "ls", "cat", "env", "echo", "stat", "test", "grep", "find", "mount", "true", "nc")
# Sleeps in the background so that SIGTERM (the runtime stopping the sandbox) ends it at once.
PAUSE_ENTRYPOINT = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def _layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "run", "var", "usr", "usr/bin"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buf.getvalue()


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_image_tar(busybox: Path, name: str, out: Path, entrypoint: Sequence[str] = ("/bin/sh",)) -> Path:
    """An OCI image layout tar at `out` for image `name`."""
    stage = out.with_suffix(".d")
    stage.mkdir(parents=True, exist_ok=True)
    layer = _layer(busybox)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(stage, layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "Env": ["PATH=/bin:/usr/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(stage, json.dumps(config).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(stage, json.dumps(manifest).encode()),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
        },
    }
    (stage / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (stage / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}))
    with tarfile.open(out, "w") as tar:
        for item in ("oci-layout", "index.json", "blobs"):
            tar.add(stage / item, arcname=item)
    return out


# --- flexmig's own image ---------------------------------------------------------------------------

IMAGE_BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "deployments" / "image" / "build.sh"


class ImageBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class ProductImage:
    tar: Path
    """An OCI image layout tar (`ctr -n k8s.io images import` it)."""
    name: str
    """Its name, the chart's default `image.repository:appVersion`."""


# The first build's outcome in this process (the image or the error): a failed build is not retried
# by every test that wants the image.
_product: dict[str, ProductImage | str] = {}


def image_name(tar: Path) -> str:
    """The name `ctr images import` gives the image in `tar`: the index's io.containerd.image.name."""
    with tarfile.open(tar) as t:
        member = t.extractfile("index.json")
        assert member is not None, f"{tar}: index.json is not a file"
        index = json.load(member)
    [manifest] = index["manifests"]
    return str(manifest["annotations"]["io.containerd.image.name"])


def product_image(timeout_s: float = 1800) -> ProductImage:
    """flexmig's image, built by deployments/image/build.sh (instant when its cache holds the inputs'
    image; a cold build takes minutes). `FLEXMIG_IMAGE_TAR` may name a prebuilt tar instead.

    Raises ImageBuildError with the build's error, the same error on every later call.
    """
    found = _product.get("image")
    if isinstance(found, ProductImage):
        return found
    if "error" in _product:
        raise ImageBuildError(str(_product["error"]))
    try:
        override = os.environ.get("FLEXMIG_IMAGE_TAR")
        if override:
            tar = Path(override)
        else:
            proc = subprocess.run(
                ["bash", str(IMAGE_BUILD_SCRIPT), "--cache-only"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            if proc.returncode != 0:
                raise ImageBuildError(
                    f"{IMAGE_BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{proc.stderr[-6000:]}"
                )
            lines = [line for line in proc.stdout.splitlines() if line.strip()]
            if not lines:
                raise ImageBuildError(f"{IMAGE_BUILD_SCRIPT} printed no path")
            tar = Path(lines[-1].strip())
        image = ProductImage(tar, image_name(tar))
    except (ImageBuildError, OSError, KeyError, ValueError, subprocess.SubprocessError) as exc:
        _product["error"] = str(exc)
        raise ImageBuildError(str(exc)) from exc
    _product["image"] = image
    return image
