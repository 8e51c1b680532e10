"""`flexmig controller`'s webhook flags. Each has an environment variable (the chart's names); a flag
given on the command line wins over its variable, the variable over the built-in default."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import yaml

from controller.shim import ShimConfigError, ShimDefaults, parse_shim_defaults
from controller.shim.defaults import EXTENDED_RESOURCE_NAME
from driver import hamiconfig

if TYPE_CHECKING:  # the webhook imports kubernetes; `flexmig --help` must not pay for it
    from controller.webhook import WebhookSettings

TEMPLATE_GRACE_S = 600.0
"""Default of --webhook-template-grace (controller.webhook.templates.DEFAULT_GRACE_S)."""

ENV = {
    "webhook_port": "FLEXMIG_WEBHOOK_PORT",
    "webhook_address": "FLEXMIG_WEBHOOK_ADDRESS",
    "webhook_path": "FLEXMIG_WEBHOOK_PATH",
    "webhook_configuration": "FLEXMIG_WEBHOOK_CONFIGURATION",
    "webhook_service": "FLEXMIG_WEBHOOK_SERVICE",
    "webhook_hosts": "FLEXMIG_WEBHOOK_HOSTS",
    "webhook_tls_dir": "FLEXMIG_WEBHOOK_TLS_DIR",
    "webhook_cert_secret": "FLEXMIG_WEBHOOK_CERT_SECRET",
    "device_config": "FLEXMIG_DEVICE_CONFIG",
    "mapped_resources": "FLEXMIG_MAPPED_RESOURCES",
}


def _env(dest: str, default: str) -> str:
    return os.environ.get(ENV[dest], default)


def add_webhook_flags(p: Any) -> None:
    g = p.add_argument_group("webhook (HAMi compatibility shim and allocation gate)")
    g.add_argument(
        "--webhook-port",
        type=int,
        default=_env("webhook_port", "0"),
        help="HTTPS port of the pod webhook; 0 (default) does not serve it [$FLEXMIG_WEBHOOK_PORT]",
    )
    g.add_argument(
        "--webhook-address", default=_env("webhook_address", "0.0.0.0"), help="[$FLEXMIG_WEBHOOK_ADDRESS]"
    )
    g.add_argument(
        "--webhook-path", default=_env("webhook_path", "/mutate-pods"), help="[$FLEXMIG_WEBHOOK_PATH]"
    )
    g.add_argument(
        "--webhook-configuration",
        default=_env("webhook_configuration", ""),
        help="MutatingWebhookConfiguration to patch the self-generated CA into; empty: none "
        "[$FLEXMIG_WEBHOOK_CONFIGURATION]",
    )
    g.add_argument(
        "--webhook-service",
        default=_env("webhook_service", ""),
        help="DNS name the API server calls, e.g. flexmig-webhook.flexmig-system.svc (a SAN of the "
        "self-generated certificate) [$FLEXMIG_WEBHOOK_SERVICE]",
    )
    g.add_argument(
        "--webhook-hosts",
        default=_env("webhook_hosts", ""),
        help="extra SANs, comma-separated DNS names or IPs, e.g. 127.0.0.1 [$FLEXMIG_WEBHOOK_HOSTS]",
    )
    g.add_argument(
        "--webhook-tls-dir",
        default=_env("webhook_tls_dir", ""),
        help="directory with a provided tls.crt/tls.key (reloaded on change); empty: self-generate "
        "[$FLEXMIG_WEBHOOK_TLS_DIR]",
    )
    g.add_argument(
        "--webhook-cert-secret",
        default=_env("webhook_cert_secret", "flexmig-webhook-cert"),
        help="Secret (in --lease-namespace) holding the self-generated CA and certificate, shared by "
        "replicas [$FLEXMIG_WEBHOOK_CERT_SECRET]",
    )
    g.add_argument(
        "--webhook-template-grace",
        type=float,
        default=TEMPLATE_GRACE_S,
        help="seconds a shim ResourceClaimTemplate must be unused before it is deleted",
    )
    g.add_argument(
        "--mapped-resources",
        default=_env("mapped_resources", ""),
        help="comma-separated extended resource names that flexmig DeviceClasses map (KEP-5004 "
        "extendedResourceName); the shim leaves count-only pods of nvidia.com/gpu to the mapping when "
        "it is one of them [$FLEXMIG_MAPPED_RESOURCES]",
    )
    g.add_argument(
        "--device-config",
        default=_env("device_config", ""),
        help="HAMi device config YAML ({nvidia: {defaultMemory, defaultCores, defaultGPUNum, ...}}) "
        "with the shim's defaults; empty: HAMi's defaults [$FLEXMIG_DEVICE_CONFIG]",
    )


def mapped_resources(value: str) -> frozenset[str]:
    """`--mapped-resources`; ValueError names the flag and what a name must look like."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if not EXTENDED_RESOURCE_NAME.match(name) or name.startswith(("kubernetes.io/", "requests.")):
            raise ValueError(
                f"--mapped-resources: {name!r} is not an extended resource name (allowed: comma-separated "
                "<domain>/<name>, e.g. nvidia.com/gpu,gpu.flexmig.dev/mig)"
            )
    return frozenset(names)


def validate_webhook_flags(args: argparse.Namespace) -> str | None:
    if not 0 <= args.webhook_port <= 65535:
        return f"--webhook-port: {args.webhook_port} is not a port (0..65535, 0 disables)"
    if not args.webhook_path.startswith("/"):
        return f"--webhook-path: {args.webhook_path!r} must start with '/'"
    if not math.isfinite(args.webhook_template_grace) or args.webhook_template_grace < 120:
        return f"--webhook-template-grace: {args.webhook_template_grace} is not a number of seconds >= 120"
    for flag, given in (("--webhook-service", [args.webhook_service]), ("--webhook-hosts", _split(args))):
        for host in given:
            if host.strip() and not is_host(host.strip()):
                return (
                    f"{flag}: {host.strip()!r} is not an IP address or DNS "
                    "name (allowed: e.g. 127.0.0.1, fd00::1, flexmig-webhook.flexmig-system.svc; "
                    "no scheme, port or path)"
                )
    if args.webhook_port and not args.webhook_tls_dir and not hosts(args):
        return (
            "--webhook-service or --webhook-hosts: a self-generated certificate needs at least one "
            "host name or IP address (or give --webhook-tls-dir)"
        )
    if args.webhook_tls_dir and not Path(args.webhook_tls_dir).is_dir():
        return f"--webhook-tls-dir: {args.webhook_tls_dir} is not a directory"
    return None


_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", re.IGNORECASE)


def is_host(host: str) -> bool:
    """An IP address or an RFC 1123 DNS name: what a certificate SAN can hold and TLS can match."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return len(host) <= 253 and all(_DNS_LABEL.match(label) for label in host.split("."))


def _split(args: argparse.Namespace) -> list[str]:
    return [str(h) for h in args.webhook_hosts.split(",")]


def hosts(args: argparse.Namespace) -> tuple[str, ...]:
    given = [args.webhook_service, *_split(args)]
    return tuple(dict.fromkeys(h.strip() for h in given if h.strip()))


def load_defaults(path: str) -> ShimDefaults:
    """The shim's defaults from a device config file; ValueError names the file and the key."""
    if not path:
        return ShimDefaults()
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--device-config: cannot read {path}: {exc}") from exc
    try:
        # HAMi's device-config.yaml as written, or the ConfigMap / its data map.
        doc = hamiconfig.device_config_document(doc, path)
        defaults = parse_shim_defaults(doc)
    except (ShimConfigError, hamiconfig.DeviceConfigError) as exc:
        raise ValueError(f"--device-config {path}: {exc}") from exc
    unused = hamiconfig.unused_keys(doc)
    if unused:
        structlog.get_logger(__name__).warning(hamiconfig.unused_keys_message(unused), file=path)
    return defaults


def webhook_settings(args: argparse.Namespace) -> WebhookSettings | None:
    if not args.webhook_port:
        return None
    from controller.webhook import WebhookSettings

    return WebhookSettings(
        port=args.webhook_port,
        address=args.webhook_address,
        path=args.webhook_path,
        configuration=args.webhook_configuration,
        hosts=hosts(args),
        tls_dir=Path(args.webhook_tls_dir) if args.webhook_tls_dir else None,
        cert_namespace=args.lease_namespace,
        cert_secret=args.webhook_cert_secret,
        template_grace_s=args.webhook_template_grace,
    )
