"""The chart's webhook flags rendered with the real `helm`: with `webhook.url` set, the controller
serves the path the API server calls (the URL's), not `webhook.path`."""

from __future__ import annotations

from pathlib import Path

import pytest

from .chart_render import CHART, KUBE_VERSION, one, render, run_helm
from .test_helm_chart import container, parse_cli


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("https://127.0.0.1:9443/mutate-pods", "/mutate-pods"),
        ("https://webhook.example.com/hooks/flexmig", "/hooks/flexmig"),
        ("https://[fd00::1]:9443/", "/"),
    ],
)
def test_url_path_is_served_whatever_webhook_path_says(
    helm_bin: Path, tmp_path: Path, url: str, path: str
) -> None:
    docs = render(helm_bin, tmp_path, "--set", f"webhook.url={url}", "--set", "webhook.path=/elsewhere")
    args = parse_cli(container(one(docs, "Deployment"), "controller")["args"], {})
    assert args.webhook_path == path
    assert one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["url"] == url


def test_service_uses_webhook_path(helm_bin: Path, tmp_path: Path) -> None:
    docs = render(helm_bin, tmp_path, "--set", "webhook.path=/elsewhere")
    args = parse_cli(container(one(docs, "Deployment"), "controller")["args"], {})
    assert args.webhook_path == "/elsewhere"
    service = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]
    assert service["path"] == "/elsewhere"


@pytest.mark.parametrize(
    ("skip_schema", "message"),
    [(False, "at '/webhook/url'"), (True, 'webhook.url "https://webhook.example.com:9443" has no path')],
)
def test_url_without_a_path_is_refused(
    helm_bin: Path, tmp_path: Path, skip_schema: bool, message: str
) -> None:
    # The schema refuses it; the template refuses it too, for a render that skips the schema.
    proc = run_helm(
        helm_bin,
        tmp_path,
        "template",
        "flexmig",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "webhook.url=https://webhook.example.com:9443",
        *(["--skip-schema-validation"] if skip_schema else []),
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
