"""The kubelet plugin's settings: command-line flags, each with an environment-variable fallback.

Everything is validated before the plugin touches anything (no directory created, no socket bound, no
NVML call), and every problem names the flag, its environment variable and what would be accepted, so
`flexmig kubeletplugin` can exit 2 with one readable line.

Precedence: flag > environment variable > default. Files (device config, node config) are read and
parsed here too, so a typo in a ConfigMap fails the pod at start instead of at the first prepare.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from api.constants import DEFAULT_NODE_METRICS_PORT, DRIVER_NAME
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist, parse_allowlist
from kubeletplugin.checkpoint import DEFAULT_BOOT_ID_PATH
from kubeletplugin.grpcserver.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, MAX_SOCKET_PATH
from kubeletplugin.nodeconfig import (
    DEFAULT_DEVICE_SPLIT_COUNT,
    NodeConfig,
    NodeConfigError,
    OperatingMode,
    check_split_count,
    node_config_for,
)

DEFAULT_CDI_DIR = "/var/run/cdi"
# HAMi's host layout: the library its device plugin installs, and the directory beside it where the
# plugin keeps the ld.so.preload file and per-claim shared-region caches.
DEFAULT_HAMI_CORE_LIBRARY = "/usr/local/vgpu/libvgpu.so"
DEFAULT_HAMI_CORE_DIR = "/usr/local/vgpu"
DEFAULT_CHECKPOINT = f"{DEFAULT_PLUGINS_DIR}/{DRIVER_NAME}/checkpoint.json"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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
    Flag("nvml", ("FLEXMIG_NVML",), "real", 'NVML backend: "real" or "sim:<state file>"'),
    Flag("kubeconfig", ("KUBECONFIG",), "", "kubeconfig file; empty = in-cluster service account"),
    Flag("device-config", ("FLEXMIG_DEVICE_CONFIG",), "", "YAML/JSON file with migProfileAllowlist"),
    Flag("node-config", ("FLEXMIG_NODE_CONFIG",), "", "YAML/JSON file with the HAMi `nodeconfig` list"),
    Flag(
        "operating-mode",
        ("FLEXMIG_OPERATING_MODE",),
        OperatingMode.HAMI_CORE.value,
        "mode of a node without a nodeconfig entry: mig, hami-core or mps (HAMi's default is hami-core)",
    ),
    Flag(
        "device-split-count",
        ("FLEXMIG_DEVICE_SPLIT_COUNT",),
        str(DEFAULT_DEVICE_SPLIT_COUNT),
        "HAMi-core shares per GPU on a hami-core node (nodeconfig `devicesplitcount` overrides it per node)",
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
    Flag("metrics-address", ("FLEXMIG_METRICS_ADDRESS",), "0.0.0.0", "metrics/healthz bind address"),
    Flag(
        "metrics-port",
        ("FLEXMIG_METRICS_PORT",),
        str(DEFAULT_NODE_METRICS_PORT),
        "metrics/healthz port; 0 = ephemeral (the bound port is logged); -1 = disabled",
    ),
)


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node_name: str
    registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    checkpoint_path: Path
    boot_id_path: Path
    nvml_spec: str
    kubeconfig: Path | None
    allowlist: MigProfileAllowlist
    node_config: NodeConfig
    metrics_address: str
    metrics_port: int | None  # None: no metrics server
    hami_core_library: Path = Path(DEFAULT_HAMI_CORE_LIBRARY)
    hami_core_dir: Path = Path(DEFAULT_HAMI_CORE_DIR)

    @property
    def is_simulated(self) -> bool:
        return self.nvml_spec.startswith("sim:")


def add_flags(parser: argparse.ArgumentParser) -> None:
    for flag in FLAGS:
        env = f" [env {', '.join(flag.env)}]" if flag.env else ""
        default = f" (default {flag.default!r})" if flag.default else ""
        parser.add_argument(f"--{flag.name}", dest=flag.dest, default=None, help=flag.help + env + default)


def _raw(flag: Flag, args: argparse.Namespace, env: Mapping[str, str]) -> str:
    value = getattr(args, flag.dest, None)
    if value is not None:
        return str(value)
    for name in flag.env:
        if env.get(name, "").strip():
            return env[name].strip()
    return flag.default


def _abs_dir(flag: Flag, value: str) -> Path:
    if not value or not os.path.isabs(value):
        raise ConfigError(f"{flag.label()}: {value!r} must be an absolute path")
    return Path(value)


def _load_document(flag: Flag, value: str) -> Any:
    try:
        text = Path(value).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{flag.label()}: cannot read {value!r}: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)  # YAML is a superset of JSON, so HAMi's config.json loads too
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag.label()}: {value!r} is neither valid YAML nor JSON: {exc}") from exc


def _allowlist(flag: Flag, value: str) -> MigProfileAllowlist:
    if not value:
        return DEFAULT_MIG_PROFILE_ALLOWLIST
    doc = _load_document(flag, value)
    # Accept the HAMi ConfigMap shape ({nvidia: {migProfileAllowlist: [...]}}) and the bare key.
    if isinstance(doc, dict) and isinstance(doc.get("nvidia"), dict):
        doc = doc["nvidia"]
    if not isinstance(doc, dict) or "migProfileAllowlist" not in doc:
        raise ConfigError(f"{flag.label()}: {value!r} has no top-level 'migProfileAllowlist' list")
    try:
        return parse_allowlist(doc["migProfileAllowlist"])
    except ValueError as exc:
        raise ConfigError(f"{flag.label()}: {value!r}: {exc}") from exc


def _split_count(flag: Flag, value: str) -> int:
    try:
        return check_split_count(int(value))
    except ValueError:
        raise ConfigError(f"{flag.label()}: {value!r}; allowed: an integer >= 1") from None


def _node_config(
    flag: Flag, value: str, node_name: str, default_mode: OperatingMode, split_count: int
) -> NodeConfig:
    if not value:
        return NodeConfig(name=node_name, operating_mode=default_mode, device_split_count=split_count)
    doc = _load_document(flag, value)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{flag.label()}: {value!r} must hold an object with a 'nodeconfig' list")
    try:
        return node_config_for(doc, node_name, default_mode, split_count)
    except NodeConfigError as exc:
        raise ConfigError(f"{flag.label()}: {value!r}: {exc}") from exc


def _check_nvml(flag: Flag, value: str) -> str:
    if value == "real":
        return value
    if value.startswith("sim:") and value[4:].strip():
        path = value[4:].strip()
        if not Path(path).is_file():
            raise ConfigError(f"{flag.label()}: simulator state file {path!r} does not exist")
        return f"sim:{path}"
    raise ConfigError(
        f'{flag.label()}: {value!r} is not an NVML backend; allowed: "real", "sim:<state file>"'
    )


def _metrics_port(flag: Flag, value: str) -> int | None:
    try:
        port = int(value)
    except ValueError:
        raise ConfigError(
            f"{flag.label()}: {value!r} is not an integer; allowed: -1 (off), 0..65535"
        ) from None
    if port == -1:
        return None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag.label()}: {port} is out of range; allowed: -1 (off), 0..65535")
    return port


def load_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    """Validate every setting; raises ConfigError naming the first bad one. Reads files, writes nothing."""
    environ = os.environ if env is None else env
    by_name = {f.name: f for f in FLAGS}
    raw = {f.name: _raw(f, args, environ) for f in FLAGS}

    node = raw["node-name"]
    if not node:
        raise ConfigError(f"{by_name['node-name'].label()}: required (the Node object's name)")
    if len(node) > 253 or not _DNS_SUBDOMAIN_RE.match(node):
        raise ConfigError(
            f"{by_name['node-name'].label()}: {node!r} is not a valid node name (DNS subdomain)"
        )

    dirs = {
        n: _abs_dir(by_name[n], raw[n]) for n in ("registry-dir", "plugins-dir", "cdi-dir", "hami-core-dir")
    }
    # The library may be missing (reported at start and as a metric), but its path must be absolute:
    # it is a host path written into CDI specs.
    files = {
        n: _abs_dir(by_name[n], raw[n]) for n in ("checkpoint-path", "boot-id-path", "hami-core-library")
    }
    sockets = (
        ("registry-dir", dirs["registry-dir"] / f"{DRIVER_NAME}-reg.sock"),
        ("plugins-dir", dirs["plugins-dir"] / DRIVER_NAME / "dra.sock"),
    )
    for name, sock in sockets:
        if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
            raise ConfigError(
                f"{by_name[name].label()}: socket path {str(sock)!r} is longer than {MAX_SOCKET_PATH} bytes"
            )
    if not files["boot-id-path"].is_file():
        raise ConfigError(f"{by_name['boot-id-path'].label()}: {str(files['boot-id-path'])!r} does not exist")

    mode_raw = raw["operating-mode"]
    try:
        default_mode = OperatingMode(mode_raw)
    except ValueError:
        allowed = ", ".join(m.value for m in OperatingMode)
        raise ConfigError(f"{by_name['operating-mode'].label()}: {mode_raw!r}; allowed: {allowed}") from None

    kubeconfig = raw["kubeconfig"]
    if kubeconfig and not Path(kubeconfig).is_file():
        raise ConfigError(f"{by_name['kubeconfig'].label()}: {kubeconfig!r} does not exist")
    if not raw["metrics-address"]:
        raise ConfigError(f"{by_name['metrics-address'].label()}: must not be empty (e.g. 0.0.0.0)")

    return PluginConfig(
        node_name=node,
        registry_dir=dirs["registry-dir"],
        plugins_dir=dirs["plugins-dir"],
        cdi_dir=dirs["cdi-dir"],
        checkpoint_path=files["checkpoint-path"],
        boot_id_path=files["boot-id-path"],
        nvml_spec=_check_nvml(by_name["nvml"], raw["nvml"]),
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        allowlist=_allowlist(by_name["device-config"], raw["device-config"]),
        node_config=_node_config(
            by_name["node-config"],
            raw["node-config"],
            node,
            default_mode,
            _split_count(by_name["device-split-count"], raw["device-split-count"]),
        ),
        metrics_address=raw["metrics-address"],
        metrics_port=_metrics_port(by_name["metrics-port"], raw["metrics-port"]),
        hami_core_library=files["hami-core-library"],
        hami_core_dir=dirs["hami-core-dir"],
    )
