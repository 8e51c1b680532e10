"""Create the MIG capability device nodes a prepared instance needs, as NVIDIA's driver tooling does.

On a real node `/dev/nvidia-caps/nvidia-cap<N>` often does not exist until someone creates it
(nvidia-modprobe does it for the processes it serves; nothing does it for a container runtime). A CDI
spec naming a missing node still works when it carries type/major/minor, but runtimes that bind-mount
device nodes (user namespaces, rootless) need the host node, and the toolkit's own tools expect it. So
after creating an instance the plugin makes sure its GI and CI access nodes exist under the dev root:
character devices with the `nvidia-caps` major from /proc/devices, the minor from the mig-minors table,
mode 0444 (access to a MIG capability is being able to open its node read-only).

Idempotent: a correct node is left alone; a wrong one (another major after a driver reload, a regular
file) is replaced atomically (mknod to a temporary name, then rename), so a concurrent reader never sees
the path missing.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable
from pathlib import Path

import structlog

from driver.atomicfile import replace_with
from driver.cdi import cap_path
from driver.cdi_host import CAPS_DEVICE_MODE, DeviceTable

log = structlog.get_logger(__name__)


def _is_node(path: Path, rdev: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev


def ensure_caps_nodes(table: DeviceTable, minors: Iterable[int]) -> list[Path]:
    """Make `<dev root>/dev/nvidia-caps/nvidia-cap<minor>` exist for every minor; the paths created.

    Nothing is done when nvidia-caps is not registered (no major to use: the simulator without a
    stand-in /proc). Raises OSError when a node cannot be created (not root, read-only /dev).
    """
    major = table.caps_major
    if major is None:
        return []
    created: list[Path] = []
    for minor in sorted(set(minors)):
        path = table.local_path(cap_path(minor))  # where this process sees the host's /dev
        rdev = os.makedev(major, minor)
        if _is_node(path, rdev):
            continue
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        replaced = path.exists() or path.is_symlink()
        # mknod's mode is filtered by the umask, hence `mode`. No directory fsync: /dev does not outlive
        # a reboot anyway.
        make = functools.partial(os.mknod, mode=stat.S_IFCHR | CAPS_DEVICE_MODE, device=rdev)
        replace_with(path, make, mode=CAPS_DEVICE_MODE)
        log.info("created MIG capability node", path=str(path), major=major, minor=minor, replaced=replaced)
        created.append(path)
    return created
