"""`flexmig controller`'s webhook flags: environment variables (the chart's) as defaults, flags win;
clear errors; the device config's shim defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.shim import ShimDefaults
from controller.webhook.templates import DEFAULT_GRACE_S
from driver.catalog.allowlist import MigProfileAllowlist
from flexmig.cli import build_parser
from flexmig.commands.controller import _validate
from flexmig.commands.controller_webhook import load_defaults, webhook_settings


def parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["controller", *argv])


def test_env_vars_fill_in_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXMIG_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("FLEXMIG_WEBHOOK_PATH", "/from-env")
    monkeypatch.setenv("FLEXMIG_WEBHOOK_CONFIGURATION", "flexmig.gpu.flexmig.dev")
    monkeypatch.setenv("FLEXMIG_WEBHOOK_SERVICE", "flexmig-webhook.ns.svc")
    args = parse(
        ["--webhook-path", "/from-flag", "--webhook-hosts", "127.0.0.1, ::1", "--lease-namespace", "ns"]
    )
    assert _validate(args) is None
    settings = webhook_settings(args)
    assert settings is not None
    assert (settings.port, settings.path, settings.configuration) == (
        9443,
        "/from-flag",
        "flexmig.gpu.flexmig.dev",
    )
    assert settings.hosts == ("flexmig-webhook.ns.svc", "127.0.0.1", "::1")
    assert (settings.cert_namespace, settings.cert_secret, settings.tls_dir) == (
        "ns",
        "flexmig-webhook-cert",
        None,
    )


def test_no_port_no_webhook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEXMIG_WEBHOOK_PORT", raising=False)
    args = parse([])
    assert _validate(args) is None and webhook_settings(args) is None
    assert args.webhook_template_grace == DEFAULT_GRACE_S


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--webhook-port", "70000"], "--webhook-port: 70000 is not a port"),
        (["--webhook-port", "9443", "--webhook-path", "mutate"], "must start with '/'"),
        (["--webhook-port", "9443"], "--webhook-service or --webhook-hosts"),
        (["--webhook-port", "9443", "--webhook-tls-dir", "/nonexistent/x"], "is not a directory"),
        (["--webhook-port", "9443", "--webhook-hosts", "h", "--webhook-template-grace", "10"], ">= 120"),
        (["--webhook-port", "9443", "--webhook-hosts", "h", "--webhook-template-grace", "nan"], "nan is not"),
        (["--webhook-port", "9443", "--webhook-hosts", "h", "--webhook-template-grace", "inf"], "inf is not"),
        (
            ["--webhook-port", "9443", "--webhook-hosts", "127.0.0.1,https://x:443"],
            "--webhook-hosts: 'https://x:443' is not an IP address or DNS name",
        ),
        (["--webhook-port", "9443", "--webhook-hosts", "x:443"], "--webhook-hosts: 'x:443'"),
        (["--webhook-port", "9443", "--webhook-service", "svc/path"], "--webhook-service: 'svc/path'"),
        (["--webhook-port", "9443", "--webhook-service=bad-.svc"], "--webhook-service: 'bad-.svc'"),
        (["--webhook-port", "9443", "--webhook-service", "a..svc"], "--webhook-service: 'a..svc'"),
    ],
)
def test_bad_flags_are_named(monkeypatch: pytest.MonkeyPatch, argv: list[str], problem: str) -> None:
    for var in ("FLEXMIG_WEBHOOK_SERVICE", "FLEXMIG_WEBHOOK_HOSTS", "FLEXMIG_WEBHOOK_TLS_DIR"):
        monkeypatch.delenv(var, raising=False)
    message = _validate(parse(argv))
    assert message is not None and problem in message


@pytest.mark.parametrize(
    "argv",
    [
        ["--webhook-service", "flexmig-webhook.flexmig-system.svc", "--webhook-hosts", "127.0.0.1, fd00::1"],
        ["--webhook-hosts", "localhost,Webhook.Example.COM"],
    ],
)
def test_good_hosts_pass(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    for var in ("FLEXMIG_WEBHOOK_SERVICE", "FLEXMIG_WEBHOOK_HOSTS", "FLEXMIG_WEBHOOK_TLS_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert _validate(parse(["--webhook-port", "9443", *argv])) is None


def test_device_config_defaults(tmp_path: Path) -> None:
    good = tmp_path / "device-config.yaml"
    good.write_text("nvidia:\n  defaultMemory: 4096\n  defaultCores: 20\n  migProfileAllowlist: []\n")
    assert load_defaults(str(good)) == ShimDefaults(
        default_memory_mib=4096, default_cores=20, default_gpu_num=1, allowlist=MigProfileAllowlist(())
    )
    assert load_defaults("") == ShimDefaults()
    bad = tmp_path / "bad.yaml"
    bad.write_text("nvidia:\n  defaultCores: 150\n")
    with pytest.raises(
        ValueError, match=r"--device-config .*bad.yaml: nvidia.defaultCores: 150 is out of range"
    ):
        load_defaults(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_defaults(str(tmp_path / "missing.yaml"))
