"""The chart's values and schema agree with the code they configure (no helm binary needed).

The e2e test (tests/e2e/test_helm_chart.py) renders the chart and runs the schema through helm;
this one catches drift between the chart and the Python side early: an enum in the schema that no
longer matches the CLI, a profile-name pattern that differs from the allowlist parser's, default
values the components would reject, or a values key the schema does not describe.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.catalog.allowlist import default_allowlist_data, parse_allowlist
from driver.catalog.naming import PROFILE_NAME_PATTERN
from flexmig.commands import controller as controller_cmd
from kubeletplugin.settings.config import LOG_FORMATS, LOG_LEVELS
from kubeletplugin.settings.nodeconfig import OperatingMode, parse_device_plugin_config

CHART = Path(__file__).resolve().parents[2] / "deployments" / "helm" / "flexmig"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return data


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return data


def prop(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for key in path.split("."):
        node = node["items"] if key == "[]" else node["properties"][key]
    return node


def test_every_value_is_described_by_the_schema(schema: dict[str, Any], values: dict[str, Any]) -> None:
    """Closed objects in the schema must list every key values.yaml sets (helm would reject it)."""

    def walk(value: Any, node: dict[str, Any], where: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            for key, sub in value.items():
                assert key in node["properties"] or node.get("additionalProperties", True) is not False, (
                    f"{where}.{key} is not in values.schema.json"
                )
                if key in node["properties"]:
                    walk(sub, node["properties"][key], f"{where}.{key}")

    walk(values, schema, "values")


def test_enums_match_the_cli(schema: dict[str, Any]) -> None:
    assert prop(schema, "logLevel")["enum"] == list(LOG_LEVELS)
    assert prop(schema, "logFormat")["enum"] == list(LOG_FORMATS)
    assert prop(schema, "allocationMode")["enum"] == list(controller_cmd.MODES)
    assert prop(schema, "controller.policy")["enum"] == list(controller_cmd.POLICIES)
    modes = sorted(m.value for m in OperatingMode)
    assert sorted(prop(schema, "nodeConfig.defaultOperatingMode")["enum"]) == modes
    assert sorted(prop(schema, "nodeConfig.nodeconfig.[].operatingmode")["enum"]) == modes


def test_burst_plan_budget_matches_the_cli_and_the_planner(
    schema: dict[str, Any], values: dict[str, Any]
) -> None:
    from driver.policy.burstplan import TIME_BUDGET_S

    budget = prop(schema, "controller.burstPlanBudgetSeconds")
    assert (budget["minimum"], budget["maximum"]) == (0, controller_cmd.MAX_BURST_BUDGET_S)
    assert (
        values["controller"]["burstPlanBudgetSeconds"] == controller_cmd.BURST_PLAN_BUDGET_S == TIME_BUDGET_S
    )


def test_write_concurrency_matches_the_cli_and_the_pool(
    schema: dict[str, Any], values: dict[str, Any]
) -> None:
    from controller.allocation.writepool import DEFAULT_WRITE_CONCURRENCY, MAX_WRITE_CONCURRENCY

    bounds = prop(schema, "controller.writeConcurrency")
    assert (bounds["minimum"], bounds["maximum"]) == (1, controller_cmd.MAX_WRITE_CONCURRENCY)
    assert controller_cmd.MAX_WRITE_CONCURRENCY == MAX_WRITE_CONCURRENCY
    assert values["controller"]["writeConcurrency"] == controller_cmd.DEFAULT_WRITE_CONCURRENCY
    assert controller_cmd.DEFAULT_WRITE_CONCURRENCY == DEFAULT_WRITE_CONCURRENCY


def test_profile_pattern_is_the_allowlist_parsers(schema: dict[str, Any]) -> None:
    pattern = prop(schema, "deviceConfig.migProfileAllowlist.[].profiles.[]")["pattern"]
    assert pattern == PROFILE_NAME_PATTERN
    for name in ("1g.10gb", "1g.24gb+me.all", "1c.2g.20gb", "7g.141gb"):
        assert re.search(pattern, name), name
    assert not re.search(pattern, "1g.10GB")


def test_defaults_load_with_the_components_parsers(values: dict[str, Any]) -> None:
    allowlist = values["deviceConfig"]["migProfileAllowlist"]
    assert allowlist == default_allowlist_data()
    parse_allowlist(allowlist)
    assert parse_device_plugin_config({"nodeconfig": values["nodeConfig"]["nodeconfig"]}) == {}
    OperatingMode(values["nodeConfig"]["defaultOperatingMode"])
    # No fixed NodePort by default: it would collide with HAMi's monitors (31992/31993) and with a
    # second release; the ports themselves stay HAMi's.
    for component, port in (("controller", 31993), ("kubeletPlugin", 31992)):
        metrics = values[component]["metrics"]
        assert (metrics["port"], metrics["service"]["type"], metrics["service"]["nodePort"]) == (
            port,
            "ClusterIP",
            None,
        )


def test_every_schema_property_has_a_description(schema: dict[str, Any]) -> None:
    """`helm show values` readers and IDEs see the schema's descriptions: none may be missing."""
    missing: list[str] = []

    def walk(node: dict[str, Any], where: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            path = f"{where}.{key}" if where else key
            if not str(sub.get("description", "")).strip():
                missing.append(path)
            walk(sub, path)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]")

    walk(schema, "")
    assert not missing, f"values without a description in values.schema.json: {missing}"


def _exposed_metric_names() -> set[str]:
    """Every series name the controller and the plugin can expose (families and their samples)."""
    from prometheus_client import CollectorRegistry

    from controller.runtime.metrics import ControllerMetrics
    from controller.webhook.review import ReviewMetrics
    from kubeletplugin.agent.metrics import NodeMetrics

    names: set[str] = set()
    registries = [
        ControllerMetrics().registry,
        NodeMetrics().registry,
        ReviewMetrics(CollectorRegistry()).registry,
    ]
    for registry in registries:
        for family in registry.collect():
            base = family.name
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
                family.type, ()
            )
            names.update({base, *(base + s for s in suffixes)})
    # Families that only show up once data exists (the leader's snapshot gauges).
    from controller.runtime import metrics as cm

    names.update(re.findall(r'"((?:flexmig|hami)_[a-z_]+)"', Path(cm.__file__).read_text()))
    return names


def test_grafana_dashboard_queries_only_metrics_flexmig_exposes() -> None:
    dashboard = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    used = {m for e in exprs for m in re.findall(r"\b((?:flexmig|hami)_[a-z_]+)", e)}
    unknown = used - _exposed_metric_names()
    assert not unknown, f"the dashboard queries metrics nothing exposes: {sorted(unknown)}"
    # HAMi's two MIG metrics and the build info are on it (the "flexmig's and HAMi's").
    assert {"hami_node_gpu_mig_instance_info", "hami_mig_device_info", "flexmig_build_info"} <= used
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] if "datasource" in p)


def test_new_operations_values_are_typed(schema: dict[str, Any], values: dict[str, Any]) -> None:
    assert values["preflight"]["allowCoexistence"] is False
    assert values["metrics"]["serviceMonitor"]["enabled"] is False
    assert values["tests"]["enabled"] is True
    assert prop(schema, "image.digest")["pattern"].startswith("^(sha256:")
    # The controller's defaults are the image's non-root user (Dockerfile: uid 65532).
    assert values["controller"]["podSecurityContext"]["runAsUser"] == 65532
    assert "65532" in (CHART.parents[2] / "Dockerfile").read_text()
