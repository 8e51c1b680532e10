"""HAMi-core on a node: the container edits that enforce a GPU share, and the host files behind them.

HAMi-core (`libvgpu.so`) is preloaded into every process of a container and enforces, per CUDA device
`k` the container sees, the limits it reads from the environment (names as HAMi's device plugin sets
them):

    CUDA_DEVICE_MEMORY_LIMIT_<k>=<MiB>m   memory the container may allocate on device k
    CUDA_DEVICE_SM_LIMIT_<k>=<percent>    SM share of device k (absent or 0: no limit)
    CUDA_DEVICE_MEMORY_SHARED_CACHE=...    the shared-region file all processes of the claim account in

`k` is the device's rank, in GPU index order, among the shared GPUs of the claim: NVML indexes follow
PCI bus order, and `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA enumerate the container's GPUs in that
same order, so limit k lands on CUDA device k. A claim-wide `CUDA_DEVICE_MEMORY_LIMIT` (the smallest
share) and `CUDA_DEVICE_SM_LIMIT` (the smallest non-zero SM share) are the fallbacks HAMi-core applies
to a device without its own variable, so a container that gets only some of a claim's devices (a
per-request claim reference) is never left unlimited: at worst it is held to the smaller share.

Host layout (all under one directory, `--hami-core-dir`, default HAMi's /usr/local/vgpu):
    <dir>/ld.so.preload           one line: the library's path inside the container
    <dir>/claims/<claim uid>/     the claim's shared-region cache, mounted read-write
    <dir>/vgpulock/               HAMi-core's cross-container lock dir, mounted at /tmp/vgpulock
The library itself is mounted read-only from its host path (`--hami-core-library`) to the path HAMi
uses, /usr/local/vgpu/libvgpu.so. Without the library nothing is mounted or preloaded, but the limit
variables are still set, so what the share should be stays visible in the container.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.atomicfile import write_atomically

CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_LOCK_DIR = "/tmp/vgpulock"
CONTAINER_CLAIMS_DIR = "/usr/local/vgpu/claims"
CACHE_FILE = "vgpu.cache"

ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"

_ELF_MAGIC = b"\x7fELF"
_RO = ["ro", "nosuid", "nodev", "bind"]
_RW = ["rw", "nosuid", "nodev", "bind"]


@dataclass(frozen=True, slots=True)
class HamiCorePaths:
    """Host paths (as the plugin sees them; the chart mounts them at the same paths)."""

    library: Path
    state_dir: Path

    @property
    def preload_file(self) -> Path:
        return self.state_dir / "ld.so.preload"

    @property
    def lock_dir(self) -> Path:
        return self.state_dir / "vgpulock"

    def claim_dir(self, claim_uid: str) -> Path:
        _check_uid(claim_uid)
        return self.state_dir / "claims" / claim_uid


@dataclass(frozen=True, slots=True)
class LibraryCheck:
    present: bool
    reason: str  # why it is (not) usable, for the log line and the prepare message


@dataclass(frozen=True, slots=True)
class ShareLimit:
    """One shared GPU of a claim: the limits its container edits carry."""

    gpu_index: int
    memory_mib: int
    cores: int  # 0 = no SM limit


def _check_uid(claim_uid: str) -> None:
    # Becomes a directory name: never a path separator or a dot-only name.
    if not claim_uid or "/" in claim_uid or claim_uid in (".", "..") or "\0" in claim_uid:
        raise ValueError(f"claim uid {claim_uid!r} cannot name a directory")


def check_library(path: Path) -> LibraryCheck:
    """Is HAMi-core's library usable at `path`? A file that is not an ELF object would make every
    process of the container print a preload error, so it counts as absent."""
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        return LibraryCheck(False, f"{path} does not exist")
    except IsADirectoryError:
        return LibraryCheck(False, f"{path} is a directory, not the HAMi-core library")
    except OSError as exc:
        return LibraryCheck(False, f"{path} cannot be read: {exc.strerror or exc}")
    if magic != _ELF_MAGIC:
        return LibraryCheck(False, f"{path} is not an ELF shared object")
    return LibraryCheck(True, f"{path} present")


def device_env(shares: Sequence[ShareLimit]) -> dict[int, tuple[str, ...]]:
    """Per GPU index, the limit variables of that device (k = rank in GPU index order)."""
    indexes = [s.gpu_index for s in shares]
    if len(set(indexes)) != len(indexes):
        raise ValueError(f"one limit per GPU expected, got GPU indexes {sorted(indexes)}")
    any_sm = any(s.cores > 0 for s in shares)
    out: dict[int, tuple[str, ...]] = {}
    for k, share in enumerate(sorted(shares, key=lambda s: s.gpu_index)):
        if share.memory_mib < 1 or not 0 <= share.cores <= 100:
            raise ValueError(f"invalid share for GPU {share.gpu_index}: {share}")
        env = [f"{ENV_MEMORY_LIMIT}_{k}={share.memory_mib}m"]
        if share.cores > 0:
            env.append(f"{ENV_SM_LIMIT}_{k}={share.cores}")
        elif any_sm:
            # Another device of the claim sets the claim-wide fallback; this one asked for no limit.
            env.append(f"{ENV_SM_LIMIT}_{k}=100")
        out[share.gpu_index] = tuple(env)
    return out


def claim_edits(
    paths: HamiCorePaths, claim_uid: str, shares: Sequence[ShareLimit], library_present: bool
) -> dict[str, Any]:
    """Spec-level CDI containerEdits for a claim's shared GPUs (applied once per container)."""
    if not shares:
        raise ValueError("a claim without shared GPUs needs no HAMi-core edits")
    cache_dir = f"{CONTAINER_CLAIMS_DIR}/{claim_uid}"
    env = [
        f"{ENV_SHARED_CACHE}={cache_dir}/{CACHE_FILE}",
        f"{ENV_DEVICE_ORDER}=PCI_BUS_ID",
        f"{ENV_MEMORY_LIMIT}={min(s.memory_mib for s in shares)}m",
    ]
    sm = [s.cores for s in shares if s.cores > 0]
    if sm:
        env.append(f"{ENV_SM_LIMIT}={min(sm)}")
    mounts: list[dict[str, Any]] = [
        {"hostPath": str(paths.claim_dir(claim_uid)), "containerPath": cache_dir, "options": _RW},
        {"hostPath": str(paths.lock_dir), "containerPath": CONTAINER_LOCK_DIR, "options": _RW},
    ]
    if library_present:
        mounts += [
            {"hostPath": str(paths.library), "containerPath": CONTAINER_LIBRARY, "options": _RO},
            {"hostPath": str(paths.preload_file), "containerPath": CONTAINER_PRELOAD, "options": _RO},
        ]
    return {"env": env, "mounts": mounts}


def preload_content() -> bytes:
    return (CONTAINER_LIBRARY + "\n").encode()


def write_preload_file(paths: HamiCorePaths) -> Path:
    """Write `<dir>/ld.so.preload` atomically unless it already holds exactly the right line."""
    target = paths.preload_file
    with contextlib.suppress(OSError):
        if target.read_bytes() == preload_content():
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # The file is fsynced, its directory is not: a rename lost to a power loss is redone the next time
    # the library check finds the file wrong (kubeletplugin/shared/hamicore.py).
    return write_atomically(target, preload_content(), durable=True, sync_dir=False, mode=0o644)


def prepare_claim_dirs(paths: HamiCorePaths, claim_uid: str) -> Path:
    """Create the claim's cache dir (fresh: a stale region would carry another allocation's usage) and
    the lock dir. World-writable, as HAMi makes them: containers may run as any user."""
    claim_dir = paths.claim_dir(claim_uid)
    shutil.rmtree(claim_dir, ignore_errors=True)
    for d in (claim_dir, paths.lock_dir):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o777)  # shared with unprivileged container processes by design
    return claim_dir


def remove_claim_dir(paths: HamiCorePaths, claim_uid: str) -> bool:
    """Remove the claim's cache dir; False when it was already gone (unprepare is idempotent)."""
    claim_dir = paths.claim_dir(claim_uid)
    if not claim_dir.exists():
        return False
    shutil.rmtree(claim_dir)
    return True
