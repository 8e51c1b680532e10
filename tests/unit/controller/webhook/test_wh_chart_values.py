"""The chart's webhook-related values agree with the code (no helm needed; the e2e tests render it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from controller.shim import ShimDefaults, parse_shim_defaults
from controller.shim.legacy import MAX_GPUMEM_MIB, MAX_GPUS

CHART = Path(__file__).resolve().parents[4] / "deployments" / "helm" / "flexmig"


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    return values, schema


def test_device_config_defaults_are_hamis_and_bounded_like_the_shim() -> None:
    values, schema = load()
    device = values["deviceConfig"]
    doc = {"nvidia": {k: device[k] for k in ("defaultMemory", "defaultCores", "defaultGPUNum")}}
    assert parse_shim_defaults(doc) == ShimDefaults()
    props = schema["properties"]["deviceConfig"]["properties"]
    assert (
        props["defaultMemory"]["maximum"],
        props["defaultCores"]["maximum"],
        props["defaultGPUNum"]["maximum"],
    ) == (
        MAX_GPUMEM_MIB,
        100,
        MAX_GPUS,
    )


def test_webhook_defaults_and_url_pattern() -> None:
    values, schema = load()
    assert values["webhook"]["enabled"] is True and values["webhook"]["url"] == ""
    pattern = schema["properties"]["webhook"]["properties"]["url"]["pattern"]
    for good in ("", "https://127.0.0.1:9443/mutate-pods", "https://webhook.example.com/"):
        assert re.search(pattern, good), good
    # A URL without a path: the controller would serve a path the API server does not call.
    for bad in ("http://127.0.0.1/mutate-pods", "https://", "127.0.0.1:9443", "https://webhook.example.com"):
        assert not re.search(pattern, bad), bad
