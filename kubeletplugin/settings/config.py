"""The kubelet plugin's settings, validated from its flags (`kubeletplugin/settings/flags.py`).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from api.constants import DRIVER_NAME
from driver import hamiconfig
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, MigProfileAllowlist, parse_allowlist
from kubeletplugin.grpcserver.server import MAX_SOCKET_PATH
from kubeletplugin.settings.flags import (  # re-exported: callers take flags and settings from one place
    DEFAULT_HAMI_CORE_DIR,
    DEFAULT_HAMI_CORE_LIBRARY,
    FLAGS,
    LOG_FORMATS,
    LOG_LEVELS,
    ConfigError,
    Flag,
    UnenforcedShares,
    add_flags,
    raw_value,
)
from kubeletplugin.settings.idlepolicy import IdlePolicy, idle_policy
from kubeletplugin.settings.nodeconfig import (
    NodeConfig,
    NodeConfigError,
    OperatingMode,
    check_scaling,
    check_split_count,
    node_config_for,
    unused_entry_keys,
)

_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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
    reconcile_interval_s: float = 60.0
    idle: IdlePolicy = field(default_factory=IdlePolicy)  # off unless --idle-grace-period
    hami_core_library: Path = Path(DEFAULT_HAMI_CORE_LIBRARY)
    hami_core_dir: Path = Path(DEFAULT_HAMI_CORE_DIR)
    unenforced_shares: UnenforcedShares = UnenforcedShares.REFUSE
    unused_device_keys: tuple[str, ...] = ()  # device config and nodeconfig keys with no effect
    # Host paths (written into CDI specs) and where the plugin sees them (equal for a host process).
    dev_root: Path = Path("/")
    driver_root: Path = Path("/")
    proc_root: Path = Path("/proc")
    nvidia_cdi_hook: str = "/usr/bin/nvidia-cdi-hook"
    container_dev_root: Path = Path("/")
    container_driver_root: Path = Path("/")
    container_nvidia_cdi_hook: str = "/usr/bin/nvidia-cdi-hook"

    @property
    def is_simulated(self) -> bool:
        return self.nvml_spec.startswith(("sim:", "sim-memory:"))


def _abs_dir(flag: Flag, value: str) -> Path:
    if not value or not os.path.isabs(value):
        raise ConfigError(f"{flag.label()}: {value!r} must be an absolute path")
    return Path(value)


def _seen_root(flag: Flag, value: str, host_flag: Flag, host: Path) -> Path:
    """Where the plugin sees a host root: the flag's directory, or the host path when not given.

    It must exist: a root the plugin cannot read would yield CDI specs without device nodes or driver
    files, noticed only when a CUDA container fails.
    """
    if not value:
        if not host.is_dir():
            raise ConfigError(
                f"{host_flag.label()}: {str(host)!r} is not a directory here; allowed: the host path of an"
                f" existing directory, or give {flag.label()} as the directory where this process sees it"
            )
        return host
    if not os.path.isabs(value):
        raise ConfigError(
            f"{flag.label()}: {value!r} must be an absolute path (where this process sees"
            f" {host_flag.label()}), or empty for {host_flag.label()} itself"
        )
    if not Path(value).is_dir():
        raise ConfigError(
            f"{flag.label()}: {value!r} is not a directory; allowed: an existing directory where this"
            f" process sees {host_flag.label()} {str(host)!r} (e.g. a read-only mount of it)"
        )
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


@dataclass(frozen=True, slots=True)
class DeviceSettings:
    """What the plugin takes from HAMi's device config (`nvidia:` of device-config.yaml)."""

    allowlist: MigProfileAllowlist = DEFAULT_MIG_PROFILE_ALLOWLIST
    split_count: int | None = None  # nvidia.deviceSplitCount; None: not given
    scaling: tuple[float, float] = (1.0, 1.0)  # nvidia.deviceMemoryScaling, deviceCoreScaling (applied)
    unused_keys: tuple[str, ...] = ()  # keys flexmig does not use, for the one start-up warning


def _device_settings(flag: Flag, value: str) -> DeviceSettings:
    if not value:
        return DeviceSettings()
    raw = _load_document(flag, value)
    try:
        # HAMi's device-config.yaml as written ({nvidia: {...}, <other vendors>: ...}), the ConfigMap
        # or its data map, or flexmig's bare {migProfileAllowlist: [...]}.
        doc = hamiconfig.device_config_document(raw, repr(value))
        section = hamiconfig.nvidia_section(doc, repr(value)) if "nvidia" in doc else doc
    except hamiconfig.DeviceConfigError as exc:
        raise ConfigError(f"{flag.label()}: {exc}") from None
    # Checked first: v2.9's shapes would otherwise fail with a field error that hides the real cause.
    hint = hamiconfig.other_version_hint(section)
    if hint is not None:
        raise ConfigError(f"{flag.label()}: {value!r}: {hamiconfig.other_version_message(hint, value)}")
    if "migProfileAllowlist" not in section:
        raise ConfigError(
            f"{flag.label()}: {value!r} has no 'nvidia.migProfileAllowlist' list; allowed: HAMi v2.10's "
            "device config (nvidia.migProfileAllowlist: [{models: [...], profiles: [...]}])"
        )
    try:
        allowlist = parse_allowlist(section["migProfileAllowlist"])
    except ValueError as exc:
        raise ConfigError(f"{flag.label()}: {value!r}: nvidia.migProfileAllowlist: {exc}") from exc
    split: int | None = None
    if section.get("deviceSplitCount") is not None:
        try:
            split = check_split_count(section["deviceSplitCount"])
        except ValueError as exc:
            raise ConfigError(f"{flag.label()}: {value!r}: nvidia.deviceSplitCount: {exc}") from None
    scaling = [1.0, 1.0]
    for i, key in enumerate(("deviceMemoryScaling", "deviceCoreScaling")):
        if section.get(key) is not None:
            try:
                scaling[i] = check_scaling(section[key])
            except ValueError as exc:
                raise ConfigError(f"{flag.label()}: {value!r}: nvidia.{key}: {exc}") from None
    unused = hamiconfig.unused_keys(doc) if "nvidia" in doc else []
    return DeviceSettings(allowlist, split, (scaling[0], scaling[1]), tuple(unused))


def _split_count(flag: Flag, value: str) -> int:
    try:
        return check_split_count(int(value))
    except ValueError:
        raise ConfigError(f"{flag.label()}: {value!r}; allowed: an integer >= 1") from None


def _node_config(
    flag: Flag,
    value: str,
    node_name: str,
    default_mode: OperatingMode,
    split_count: int,
    scaling: tuple[float, float] = (1.0, 1.0),
) -> tuple[NodeConfig, list[str]]:
    """This node's settings and the HAMi keys of the file that have no effect."""
    if not value:
        return NodeConfig(
            name=node_name,
            operating_mode=default_mode,
            device_split_count=split_count,
            memory_scaling=scaling[0],
            core_scaling=scaling[1],
        ), []
    doc = _load_document(flag, value)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{flag.label()}: {value!r} must hold an object with a 'nodeconfig' list")
    try:
        return node_config_for(doc, node_name, default_mode, split_count, scaling), unused_entry_keys(doc)
    except NodeConfigError as exc:
        raise ConfigError(f"{flag.label()}: {value!r}: {exc}") from exc


def _check_nvml(flag: Flag, value: str) -> str:
    if value == "real":
        return value
    # sim-memory: the same simulator, loaded once and written back on changes (driver/nvml/backend.py).
    for prefix in ("sim:", "sim-memory:"):
        if value.startswith(prefix) and value[len(prefix) :].strip():
            path = value[len(prefix) :].strip()
            if not Path(path).is_file():
                raise ConfigError(f"{flag.label()}: simulator state file {path!r} does not exist")
            return f"{prefix}{path}"
    raise ConfigError(
        f"{flag.label()}: {value!r} is not an NVML backend; allowed: "
        '"real", "sim:<state file>", "sim-memory:<state file>"'
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


def _reconcile_interval(flag: Flag, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 86400:  # NaN fails too
        raise ConfigError(f"{flag.label()}: {value!r}; allowed: a number of seconds in 1..86400")
    return seconds


def load_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> PluginConfig:
    """Validate every setting; raises ConfigError naming the first bad one. Reads files, writes nothing."""
    environ = os.environ if env is None else env
    by_name = {f.name: f for f in FLAGS}
    raw = {f.name: raw_value(f, args, environ) for f in FLAGS}

    node = raw["node-name"]
    if not node:
        raise ConfigError(f"{by_name['node-name'].label()}: required (the Node object's name)")
    if len(node) > 253 or not _DNS_SUBDOMAIN_RE.match(node):
        raise ConfigError(
            f"{by_name['node-name'].label()}: {node!r} is not a valid node name (DNS subdomain)"
        )

    dirs = {
        n: _abs_dir(by_name[n], raw[n])
        for n in (
            "registry-dir",
            "plugins-dir",
            "cdi-dir",
            "hami-core-dir",
            "dev-root",
            "driver-root",
            "proc-root",
        )
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

    try:
        unenforced = UnenforcedShares(raw["unenforced-shares"])
    except ValueError:
        allowed = ", ".join(m.value for m in UnenforcedShares)
        raise ConfigError(
            f"{by_name['unenforced-shares'].label()}: {raw['unenforced-shares']!r}; allowed: {allowed}"
        ) from None

    device = _device_settings(by_name["device-config"], raw["device-config"])
    # --device-split-count (flag or env) > the device config's deviceSplitCount > HAMi's default 10.
    split_flag = by_name["device-split-count"]
    split_given = getattr(args, split_flag.dest, None) is not None or any(
        environ.get(e, "").strip() for e in split_flag.env
    )
    split_count = _split_count(split_flag, raw["device-split-count"])
    if not split_given and device.split_count is not None:
        split_count = device.split_count

    node_config, unused_node_keys = _node_config(
        by_name["node-config"], raw["node-config"], node, default_mode, split_count, device.scaling
    )

    hook = str(_abs_dir(by_name["nvidia-cdi-hook-path"], raw["nvidia-cdi-hook-path"]))
    container_hook = raw["container-nvidia-cdi-hook-path"]
    if container_hook and not os.path.isabs(container_hook):
        raise ConfigError(
            f"{by_name['container-nvidia-cdi-hook-path'].label()}: {container_hook!r} must be an absolute"
            " path (where this process sees --nvidia-cdi-hook-path), or empty for that path itself"
        )
    seen = {
        n: _seen_root(by_name[f"container-{n}"], raw[f"container-{n}"], by_name[n], dirs[n])
        for n in ("dev-root", "driver-root")
    }

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
        allowlist=device.allowlist,
        node_config=node_config,
        unused_device_keys=(*device.unused_keys, *unused_node_keys),
        metrics_address=raw["metrics-address"],
        metrics_port=_metrics_port(by_name["metrics-port"], raw["metrics-port"]),
        reconcile_interval_s=_reconcile_interval(by_name["reconcile-interval"], raw["reconcile-interval"]),
        idle=idle_policy(
            by_name["idle-grace-period"],
            raw["idle-grace-period"],
            by_name["idle-reuse-across-namespaces"],
            raw["idle-reuse-across-namespaces"],
        ),
        hami_core_library=files["hami-core-library"],
        hami_core_dir=dirs["hami-core-dir"],
        unenforced_shares=unenforced,
        dev_root=dirs["dev-root"],
        driver_root=dirs["driver-root"],
        proc_root=dirs["proc-root"],
        nvidia_cdi_hook=hook,
        container_dev_root=seen["dev-root"],
        container_driver_root=seen["driver-root"],
        container_nvidia_cdi_hook=container_hook or hook,
    )


__all__ = [
    "FLAGS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "ConfigError",
    "PluginConfig",
    "UnenforcedShares",
    "add_flags",
    "load_config",
]
