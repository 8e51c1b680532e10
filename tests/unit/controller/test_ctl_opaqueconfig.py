"""Opaque configs for gpu.flexmig.dev in claims: decoded strictly, never silently ignored."""

from __future__ import annotations

from typing import Any

import pytest
from shared_helpers import CLASSES, claim, decider, hami_body, mig_body, percent_config

from api.constants import DRIVER_NAME
from api.opaqueconfig import SharedGpuRequest, decode_parameters
from controller.allocation.decide import ControllerReason
from controller.shim.legacy import Mode, Shape
from controller.shim.templates import claim_spec

KNOWN = "allowed: gpu.flexmig.dev/v1alpha1 SharedGpuRequest"


def _mixed() -> Any:
    """A hami-core node n (one 16000 MiB GPU) and a MIG node m (one A100-40GB)."""
    return decider({"n": [16000]}, mig={"m": ("A100-40GB", 1)})


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (percent_config(25, kind="SharedGPURequest"), ".opaque.parameters.kind: 'SharedGPURequest'"),
        (percent_config(25, apiVersion="gpu.flexmig.dev/v1"), ".opaque.parameters.apiVersion"),
        (
            {"requests": ["gpus"], "opaque": {"driver": DRIVER_NAME, "parameters": {"memoryPercentage": 25}}},
            ".opaque.parameters.kind: None",
        ),
    ],
)
def test_a_config_of_an_unknown_type_is_refused_not_ignored(config: dict[str, Any], field: str) -> None:
    decision = _mixed().decide([claim("c", hami_body(cores=0), config=[config])], CLASSES)
    # Ignoring it would hand the pod the whole GPU (the memory default) instead of its percentage.
    assert not decision.ok and decision.reason == ControllerReason.INVALID_REQUEST
    assert f"claim ns/c spec.devices.config[0]{field}" in decision.message, decision.message
    assert KNOWN in decision.message


def test_configs_of_other_drivers_are_not_ours_to_decode() -> None:
    other = {"opaque": {"driver": "gpu.example.com", "parameters": {"kind": "Anything", "x": 1}}}
    decision = _mixed().decide([claim("c", hami_body(cores=0), config=[other])], CLASSES)
    assert decision.ok, decision.message


def test_a_percent_config_naming_a_mig_only_request_is_refused() -> None:
    d = _mixed()
    decision = d.decide([claim("c", mig_body(4000), config=[percent_config(25)])], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST, decision.message
    assert "claim ns/c spec.devices.config[0]: SharedGpuRequest.memoryPercentage applies to gpus" in (
        decision.message
    )
    assert "hami-core.gpu.flexmig.dev" in decision.message
    # Naming only the MIG subrequest of a mixed request is the same mistake.
    alts = [{"name": "mig", **mig_body(4000)}, {"name": "hami-core", **hami_body(cores=0)}]
    sub = d.decide([claim("s", first_available=alts, config=[percent_config(25, "gpus/mig")])], CLASSES)
    assert sub.reason == ControllerReason.INVALID_REQUEST and "applies to gpus/mig" in sub.message
    # Naming the request (or its hami-core subrequest) is fine: one alternative is a share.
    for name in ("gpus", "gpus/hami-core"):
        ok = d.decide([claim(name, first_available=alts, config=[percent_config(25, name)])], CLASSES)
        assert ok.ok, ok.message


def test_a_percent_config_naming_no_request_must_reach_a_shared_one() -> None:
    d = _mixed()
    unnamed = percent_config(25)
    del unnamed["requests"]
    mig_only = d.decide([claim("c", mig_body(4000), config=[unnamed])], CLASSES)
    assert mig_only.reason == ControllerReason.INVALID_REQUEST
    assert "applies to every request of the claim" in mig_only.message
    shared = d.decide([claim("h", hami_body(cores=0), config=[unnamed])], CLASSES)
    assert shared.ok and shared.allocations[0].results[0]["consumedCapacity"]["memory"] == "4000Mi"


def test_a_percent_config_naming_a_missing_request_is_refused() -> None:
    decision = _mixed().decide([claim("c", hami_body(cores=0), config=[percent_config(25, "gpu")])], CLASSES)
    assert decision.reason == ControllerReason.INVALID_REQUEST
    assert "spec.devices.config[0].requests: 'gpu' names no request of the claim; allowed: gpus" in (
        decision.message
    )


def test_a_percent_config_waits_when_nothing_matches_yet() -> None:
    # No hami-core node yet: the share request is not invalid, it waits for a device (no match).
    d = decider({}, mig={"m": ("A100-40GB", 1)})
    decision = d.decide([claim("c", hami_body(cores=0), config=[percent_config(25)])], CLASSES)
    assert not decision.ok and decision.reason != ControllerReason.INVALID_REQUEST, decision.message


@pytest.mark.parametrize("mode", [Mode.HAMI_CORE, Mode.ANY])
def test_the_shims_percent_template_config_decodes_and_allocates(mode: Mode) -> None:
    shape = Shape(mode=mode, count=1, memory_mib=None, memory_percent=40, cores=10)
    spec = claim_spec(shape)
    (cfg,) = spec["devices"]["config"]
    assert cfg["opaque"]["driver"] == DRIVER_NAME
    assert decode_parameters("t", cfg["opaque"]["parameters"]) == SharedGpuRequest(40)
    body = {"metadata": {"name": "t", "namespace": "ns", "uid": "uid-t"}, "spec": spec}
    decision = decider({"n": [16000]}).decide([body], CLASSES)
    assert decision.ok, decision.message
    assert decision.allocations[0].results[0]["consumedCapacity"]["memory"] == "6400Mi"
