"""The kubelet plugin's command-line flags, each with its environment-variable fallbacks and default.

`kubeletplugin/settings/config.py` validates what they hold; this module only declares them and reads the raw
value of one (precedence: flag > environment variable > default).
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from api.constants import DEFAULT_NODE_METRICS_PORT, DRIVER_NAME
from kubeletplugin.checkpoint.store import DEFAULT_BOOT_ID_PATH
from kubeletplugin.grpcserver.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR
from kubeletplugin.settings.nodeconfig import DEFAULT_DEVICE_SPLIT_COUNT, OperatingMode

DEFAULT_CDI_DIR = "/var/run/cdi"
# HAMi's host layout: the library its device plugin installs, and the directory beside it where the
# plugin keeps the ld.so.preload file and per-claim shared-region caches.
DEFAULT_HAMI_CORE_LIBRARY = "/usr/local/vgpu/libvgpu.so"
DEFAULT_HAMI_CORE_DIR = "/usr/local/vgpu"
DEFAULT_CHECKPOINT = f"{DEFAULT_PLUGINS_DIR}/{DRIVER_NAME}/checkpoint.json"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")


class UnenforcedShares(enum.StrEnum):
    """What a hami-core GPU publishes when HAMi-core cannot enforce its limits."""

    REFUSE = "refuse"
    PUBLISH = "publish"


class ConfigError(ValueError):
    """A setting is invalid; the message starts with the flag and its environment variable."""


@dataclass(frozen=True, slots=True)
class Flag:
    name: str  # without the leading dashes
    env: tuple[str, ...]  # environment variables, first found wins
    default: str
    help: str

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def label(self) -> str:
        return f"--{self.name} (env {' / '.join(self.env)})" if self.env else f"--{self.name}"


FLAGS: tuple[Flag, ...] = (
    Flag("node-name", ("FLEXMIG_NODE_NAME", "NODE_NAME"), "", "this node's name (required; the pool name)"),
    Flag("registry-dir", ("FLEXMIG_REGISTRY_DIR",), str(DEFAULT_REGISTRY_DIR), "kubelet plugin registry dir"),
    Flag("plugins-dir", ("FLEXMIG_PLUGINS_DIR",), str(DEFAULT_PLUGINS_DIR), "kubelet plugins dir (dra.sock)"),
    Flag("cdi-dir", ("FLEXMIG_CDI_DIR",), DEFAULT_CDI_DIR, "where per-claim CDI specs are written"),
    Flag("checkpoint-path", ("FLEXMIG_CHECKPOINT_PATH",), DEFAULT_CHECKPOINT, "prepared-claims checkpoint"),
    Flag("boot-id-path", ("FLEXMIG_BOOT_ID_PATH",), DEFAULT_BOOT_ID_PATH, "file holding the node boot ID"),
    Flag(
        "nvml",
        ("FLEXMIG_NVML",),
        "real",
        'NVML backend: "real", "sim:<state file>" or "sim-memory:<state file>"',
    ),
    Flag("kubeconfig", ("KUBECONFIG",), "", "kubeconfig file; empty = in-cluster service account"),
    Flag("device-config", ("FLEXMIG_DEVICE_CONFIG",), "", "YAML/JSON file with migProfileAllowlist"),
    Flag("node-config", ("FLEXMIG_NODE_CONFIG",), "", "YAML/JSON file with the HAMi `nodeconfig` list"),
    Flag(
        "operating-mode",
        ("FLEXMIG_OPERATING_MODE",),
        OperatingMode.AUTO.value,
        "mode of a node without a nodeconfig entry: auto (per GPU: mig when MIG-capable, else"
        " hami-core), mig, hami-core or mps",
    ),
    Flag(
        "unenforced-shares",
        ("FLEXMIG_UNENFORCED_SHARES",),
        UnenforcedShares.REFUSE.value,
        "hami-core GPUs when the HAMi-core library is missing: refuse (publish no shares) or publish"
        " (shares marked enforced=false, limits advisory only)",
    ),
    Flag(
        "device-split-count",
        ("FLEXMIG_DEVICE_SPLIT_COUNT",),
        str(DEFAULT_DEVICE_SPLIT_COUNT),
        "HAMi-core shares per GPU on a hami-core node; given, it wins over the device config's"
        " deviceSplitCount (nodeconfig `devicesplitcount` overrides both per node)",
    ),
    Flag(
        "hami-core-library",
        ("FLEXMIG_HAMI_CORE_LIBRARY",),
        DEFAULT_HAMI_CORE_LIBRARY,
        "host path of HAMi-core's libvgpu.so, mounted and preloaded into containers of shared GPUs",
    ),
    Flag(
        "hami-core-dir",
        ("FLEXMIG_HAMI_CORE_DIR",),
        DEFAULT_HAMI_CORE_DIR,
        "host directory for the ld.so.preload file, per-claim HAMi-core caches and the vgpulock dir",
    ),
    # CDI host layout (driver/cdi_host.py). The dev root, the driver root and the hook are host paths,
    # written into CDI specs; each `container-` twin is where the plugin itself sees the same files
    # (a containerised plugin mounts them elsewhere), empty meaning the host path.
    Flag("dev-root", ("FLEXMIG_DEV_ROOT",), "/", "host root under which /dev holds the GPU device nodes"),
    Flag(
        "container-dev-root",
        ("FLEXMIG_CONTAINER_DEV_ROOT",),
        "",
        "where the plugin sees --dev-root (device nodes are read and created there); empty = --dev-root",
    ),
    Flag(
        "driver-root",
        ("FLEXMIG_DRIVER_ROOT",),
        "/",
        "host root of the NVIDIA driver's libraries and binaries (the paths CDI specs mount)",
    ),
    Flag(
        "container-driver-root",
        ("FLEXMIG_CONTAINER_DRIVER_ROOT",),
        "",
        "where the plugin sees --driver-root (the driver's files are looked up there); empty = --driver-root",
    ),
    Flag("proc-root", ("FLEXMIG_PROC_ROOT",), "/proc", "host /proc (devices, driver/nvidia-caps/mig-minors)"),
    Flag(
        "nvidia-cdi-hook-path",
        ("FLEXMIG_NVIDIA_CDI_HOOK_PATH",),
        "/usr/bin/nvidia-cdi-hook",
        "host path of nvidia-cdi-hook (ldcache/symlink hooks in CDI specs); left out with a warning when absent",
    ),
    Flag(
        "container-nvidia-cdi-hook-path",
        ("FLEXMIG_CONTAINER_NVIDIA_CDI_HOOK_PATH",),
        "",
        "where the plugin sees --nvidia-cdi-hook-path (checked for being executable); empty = that path",
    ),
    Flag(
        "reconcile-interval",
        ("FLEXMIG_RECONCILE_INTERVAL",),
        "60",
        "seconds between periodic reconcile passes (claims gone from the API server, stale prepares,"
        " instances flexmig did not create); 1..86400",
    ),
    Flag(
        "idle-grace-period",
        ("FLEXMIG_IDLE_GRACE_PERIOD",),
        "0",
        "seconds a MIG GPU instance is kept idle after its claim ends, for reuse by a claim of the same"
        " profile and placement; 0 = off (destroy at unprepare); 0..3600",
    ),
    Flag(
        "idle-reuse-across-namespaces",
        ("FLEXMIG_IDLE_REUSE_ACROSS_NAMESPACES",),
        "false",
        "let a claim reuse an idle instance another namespace's claim left (GPU memory is not"
        " guaranteed scrubbed); true/false",
    ),
    Flag("metrics-address", ("FLEXMIG_METRICS_ADDRESS",), "0.0.0.0", "metrics/healthz bind address"),
    Flag(
        "metrics-port",
        ("FLEXMIG_METRICS_PORT",),
        str(DEFAULT_NODE_METRICS_PORT),
        "metrics/healthz port; 0 = ephemeral (the bound port is logged); -1 = disabled",
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    for flag in FLAGS:
        env = f" [env {', '.join(flag.env)}]" if flag.env else ""
        default = f" (default {flag.default!r})" if flag.default else ""
        parser.add_argument(f"--{flag.name}", dest=flag.dest, default=None, help=flag.help + env + default)


def raw_value(flag: Flag, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    value = getattr(args, flag.dest, None)
    if value is not None:
        return str(value)
    for name in flag.env:
        if env.get(name, "").strip():
            return env[name].strip()
    return flag.default
