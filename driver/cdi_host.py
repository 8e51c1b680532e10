"""What a CDI spec needs from the host: device numbers and the NVIDIA driver's user-space files.

A container runtime creates a CDI device node inside the container from the spec's `type`, `major` and
`minor`; only when those are missing does it stat the host node (containerd: "failed to stat CDI host
device ..."). So every node we write carries all three, taken from the host node when it exists and
otherwise from the numbers the driver registers:

- `/dev/nvidia<N>` and `/dev/nvidiactl`: the NVIDIA frontend's fixed major 195, minors N and 255;
- `/dev/nvidia-uvm` / `-uvm-tools`: the `nvidia-uvm` major from `/proc/devices`, minors 0 and 1;
- `/dev/nvidia-caps/nvidia-cap<N>`: the `nvidia-caps` major from `/proc/devices`, minor N from
  `/proc/driver/nvidia-caps/mig-minors` (the plugin creates these nodes itself, as the driver's
  nvidia-modprobe does; see kubeletplugin/prepare/devnodes.py).

Host paths are resolved under a dev root (where `/dev` is) and a driver root (where the driver's
libraries and binaries are, e.g. `/run/nvidia/driver` with a containerised driver); container paths are
the same paths without the root. Each root has two views: the host's, written into specs (the runtime
reads them on the host), and the plugin's own, where files are looked up. They differ when the plugin
runs in a container that mounts the host's driver root elsewhere (the chart mounts it at
`/driver-root`); for a plugin running on the host they are the same. Everything here reads the host
and writes nothing.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

NVIDIA_FRONTEND_MAJOR = 195  # registered by nvidia.ko for /dev/nvidia<N> and /dev/nvidiactl
NVIDIACTL_MINOR = 255
UVM_DRIVER = "nvidia-uvm"
CAPS_DRIVER = "nvidia-caps"
DEFAULT_DEVICE_MODE = 0o666  # what nvidia-modprobe gives the frontend and UVM nodes
CAPS_DEVICE_MODE = 0o444  # MIG capability nodes: access is granted by being able to open them
DEFAULT_CDI_HOOK = "/usr/bin/nvidia-cdi-hook"

# The driver's user-space files a CUDA container needs ("compute" and "utility" in NVIDIA's terms).
REQUIRED_LIBRARIES = ("libcuda", "libnvidia-ml")
OPTIONAL_LIBRARIES = (
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libcudadebugger",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-opencl",
    "libnvidia-pkcs11-openssl3",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Searched in order (container paths); directories named by <driver root>/etc/ld.so.conf(.d) come first.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib",
    "/lib",
)
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin")
_GPU_NODE_RE = re.compile(r"^/dev/nvidia(\d+)$")
_CAP_NODE_RE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d+)$")
_PROC_DEVICE_RE = re.compile(r"^\s*(\d+)\s+(\S+)\s*$")
_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")


def under(root: Path, container_path: str) -> Path:
    """The host path of `container_path` under `root` ("/" leaves it unchanged)."""
    return root / PurePosixPath(container_path).relative_to("/")


# --- device nodes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """One character device node, complete enough that a runtime never needs the host node."""

    path: str  # inside the container
    host_path: str
    major: int
    minor: int
    file_mode: int = DEFAULT_DEVICE_MODE

    def entry(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hostPath": self.host_path,
            "type": "c",
            "major": self.major,
            "minor": self.minor,
            "fileMode": self.file_mode,
        }


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character-device majors by driver name from `/proc/devices` (its block section is ignored)."""
    majors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            section = line.strip()
            continue
        m = _PROC_DEVICE_RE.match(line)
        if m and section.startswith("Character"):
            majors.setdefault(m.group(2), int(m.group(1)))
    return majors


def read_char_majors(proc_root: Path) -> dict[str, int]:
    try:
        return parse_proc_devices((proc_root / "devices").read_text(encoding="ascii"))
    except FileNotFoundError:
        return {}


@dataclass(frozen=True, slots=True)
class DeviceTable:
    """Resolves container device paths to complete nodes on this host.

    `char_majors` is `/proc/devices` parsed; `strict` (a real GPU) makes a MIG device whose capability
    nodes cannot be described an error instead of a spec without them (the simulator has no nvidia-caps).
    `dev_root` is the host's view (spec host paths); `local_dev_root` is where the plugin itself sees
    that root (stat, mknod), None meaning the same path.
    """

    dev_root: Path = Path("/")
    char_majors: Mapping[str, int] = field(default_factory=dict)
    strict: bool = False
    local_dev_root: Path | None = None

    @property
    def caps_major(self) -> int | None:
        return self.char_majors.get(CAPS_DRIVER)

    def host_path(self, path: str) -> Path:
        """Where the runtime finds the node on the host: what the spec says."""
        return under(self.dev_root, path)

    def local_path(self, path: str) -> Path:
        """Where the plugin finds the same node (the two differ inside a container)."""
        return under(self.local_dev_root or self.dev_root, path)

    def node(self, path: str) -> DeviceNode | None:
        """The node at `path`, or None when nothing says what it is (its driver is not loaded).

        An existing host node wins (its numbers are what the driver really uses); a host path that exists
        but is no character device is an error, since a runtime bind-mounting it would fail.
        """
        host = self.host_path(path)
        local = self.local_path(path)
        try:
            st = os.stat(local)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISCHR(st.st_mode):
                raise ValueError(f"{local} exists but is not a character device")
            return DeviceNode(
                path, str(host), os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)
            )
        numbers = self._registered(path)
        if numbers is None:
            return None
        major, minor, mode = numbers
        return DeviceNode(path, str(host), major, minor, mode)

    def _registered(self, path: str) -> tuple[int, int, int] | None:
        if path == "/dev/nvidiactl":
            return NVIDIA_FRONTEND_MAJOR, NVIDIACTL_MINOR, DEFAULT_DEVICE_MODE
        if m := _GPU_NODE_RE.match(path):
            return NVIDIA_FRONTEND_MAJOR, int(m.group(1)), DEFAULT_DEVICE_MODE
        uvm = self.char_majors.get(UVM_DRIVER)
        if path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") and uvm is not None:
            return uvm, 0 if path == "/dev/nvidia-uvm" else 1, DEFAULT_DEVICE_MODE
        if (m := _CAP_NODE_RE.match(path)) and self.caps_major is not None:
            return self.caps_major, int(m.group(1)), CAPS_DEVICE_MODE
        return None


# --- driver files ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverFiles:
    """The driver's files to mount read-only, and the hook that makes the libraries loadable."""

    mounts: tuple[tuple[str, str], ...] = ()  # (host path, container path)
    library_dirs: tuple[str, ...] = ()  # container directories holding the mounted libraries
    dev_links: tuple[tuple[str, str], ...] = ()  # (target, link): libcuda.so -> libcuda.so.1
    hook: str | None = None  # nvidia-cdi-hook's host path, None when it is not installed
    missing_required: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def mount_entries(self) -> list[dict[str, Any]]:
        return [
            {"hostPath": host, "containerPath": ctr, "options": list(_MOUNT_OPTIONS)}
            for host, ctr in self.mounts
        ]

    def hook_entries(self) -> list[dict[str, Any]]:
        """createContainer hooks, as the NVIDIA Container Toolkit's CDI specs use `nvidia-cdi-hook`."""
        if self.hook is None or not self.mounts:
            return []
        hooks: list[dict[str, Any]] = []
        if self.dev_links:
            args = ["nvidia-cdi-hook", "create-symlinks"]
            for target, link in self.dev_links:
                args += ["--link", f"{target}::{link}"]
            hooks.append({"hookName": "createContainer", "path": self.hook, "args": args})
        if self.library_dirs:
            args = ["nvidia-cdi-hook", "update-ldcache"]
            for d in self.library_dirs:
                args += ["--folder", d]
            hooks.append({"hookName": "createContainer", "path": self.hook, "args": args})
        return hooks


def _ld_conf_dirs(driver_root: Path) -> list[str]:
    """Library directories named by the driver root's ld.so.conf and ld.so.conf.d/*.conf."""
    dirs: list[str] = []
    conf_files = [under(driver_root, "/etc/ld.so.conf")]
    conf_d = under(driver_root, "/etc/ld.so.conf.d")
    if conf_d.is_dir():
        conf_files += sorted(conf_d.glob("*.conf"))
    for conf in conf_files:
        try:
            lines = conf.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            item = line.split("#", 1)[0].strip()
            if item.startswith("/") and item not in dirs:
                dirs.append(item)
    return dirs


def _version_key(name: str, stem: str) -> tuple[int, ...]:
    tail = name[len(stem) + len(".so.") :]
    return tuple(int(p) for p in tail.split(".") if p.isdigit())


def _find_library(driver_root: Path, dirs: list[str], stem: str) -> tuple[str, list[str]] | None:
    """(container dir, [versioned file, soname link if any]) of library `stem`, first dir that has it.

    `driver_root` is where the plugin sees the driver's files. The versioned file
    (`libcuda.so.550.54.15`) is the real one; the soname link (`libcuda.so.1`) is mounted as well (a
    bind mount follows the link) so the library loads even without the ldcache hook.
    """
    pattern = re.compile(rf"^{re.escape(stem)}\.so\.\d+(\.\d+)+$")
    for d in dirs:
        host_dir = under(driver_root, d)
        try:
            names = sorted(n for n in os.listdir(host_dir) if pattern.match(n))
        except OSError:
            continue
        files = [n for n in names if (host_dir / n).is_file()]
        if not files:
            continue
        real = max(files, key=lambda n: _version_key(n, stem))
        found = [real]
        # The soname link (libcuda.so.1; the soname is in the ELF, not derivable from the file name) is
        # whichever `<stem>.so.<N>` link in the directory points at the real file.
        link_re = re.compile(rf"^{re.escape(stem)}\.so\.\d+$")
        # An absolute target names the file as the driver root itself sees it (`d/real`), or as the
        # plugin does.
        targets = (real, f"{d.rstrip('/')}/{real}", str(host_dir / real))
        for n in sorted(os.listdir(host_dir)):
            if link_re.match(n) and (host_dir / n).is_symlink() and os.readlink(host_dir / n) in targets:
                found.append(n)
                break
        return d, found
    return None


def discover_driver_files(
    driver_root: Path,
    hook_path: str = DEFAULT_CDI_HOOK,
    *,
    local_driver_root: Path | None = None,
    local_hook_path: str | None = None,
) -> DriverFiles:
    """Find the driver's libraries and binaries (like the host's ldcache would).

    Files are looked up under `local_driver_root` (where the plugin sees the driver root; default
    `driver_root`) and the hook at `local_hook_path` (default `hook_path`); what the spec carries are
    the host paths: the same files under `driver_root`, the hook at `hook_path`.
    """
    local = local_driver_root or driver_root
    dirs = [*_ld_conf_dirs(local), *(d for d in LIBRARY_DIRS)]
    dirs = list(dict.fromkeys(dirs))
    mounts: list[tuple[str, str]] = []
    lib_dirs: list[str] = []
    links: list[tuple[str, str]] = []
    missing: list[str] = []
    for stem in (*REQUIRED_LIBRARIES, *OPTIONAL_LIBRARIES):
        found = _find_library(local, dirs, stem)
        if found is None:
            if stem in REQUIRED_LIBRARIES:
                missing.append(stem)
            continue
        d, names = found
        for n in names:
            ctr = f"{d.rstrip('/')}/{n}"
            mounts.append((str(under(driver_root, ctr)), ctr))
        if d not in lib_dirs:
            lib_dirs.append(d)
        soname = names[-1]
        links.append((soname, f"{d.rstrip('/')}/{stem}.so"))
    for name in BINARIES:
        for d in BINARY_DIRS:
            if under(local, f"{d}/{name}").is_file():
                mounts.append((str(under(driver_root, f"{d}/{name}")), f"{d}/{name}"))
                break
    seen_at = f"driver root {driver_root}" + (f" (seen at {local})" if local != driver_root else "")
    warnings: list[str] = []
    if missing:
        warnings.append(
            f"no {', '.join(missing)} under {seen_at} (searched {', '.join(dirs)}): a CUDA container"
            " gets no driver libraries; set --driver-root to where the driver is installed on the host"
            " and --container-driver-root to where this plugin sees it"
        )
    check = hook_path if local_hook_path is None else local_hook_path
    hook: str | None = hook_path
    if not hook_path or not check or not os.access(check, os.X_OK):
        hook = None
        at = repr(hook_path) + (f" (seen at {check!r})" if check != hook_path else "")
        warnings.append(
            f"nvidia-cdi-hook not found at {at}: CDI specs carry no ldcache/symlink hook, so"
            " containers rely on the mounted soname links (install the NVIDIA Container Toolkit or set"
            " --nvidia-cdi-hook-path and --container-nvidia-cdi-hook-path)"
        )
    return DriverFiles(tuple(mounts), tuple(lib_dirs), tuple(links), hook, tuple(missing), tuple(warnings))
