"""Bad ResourceClaims through the controller's decision path: the pod is told what is wrong (its
allocation condition and a Warning event name the claim, the field and what is allowed), the
`flexmig_gated_pods{reason}` gauge counts it, and nothing is written: no claim allocated, no
finalizer, the gate stays. Rows C1-C10 of docs/reliability.md."""

from __future__ import annotations

from typing import Any

from ctl_helpers import claim
from rel_cluster import Cluster
from shared_helpers import MIG, hami_body, mig_body, percent_config

from api.constants import DRIVER_NAME

PROFILE = f'device.attributes["{DRIVER_NAME}"].profile'


def _mig_claim(name: str, selector: str | None = None, **exactly: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": MIG, "count": 1, **exactly}
    if selector is not None:
        body["selectors"] = [{"cel": {"expression": selector}}]
    return claim(name, exactly=body)


def _a100() -> Cluster:
    return Cluster(mig={"n1": ("A100-40GB", 1)})


def test_c1_a_selector_matching_nothing_names_the_claim_and_request() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", f'{PROFILE} == "9g.99gb"'))
    c.assert_refused(
        "p", "NoMatchingDevice", "claim ns/a request gpu", f"class {MIG}", "no published MIG", "selectors"
    )


def test_c2_an_expression_that_does_not_compile_names_claim_request_and_expression() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", "device.attributes["))
    c.assert_refused(
        "p",
        "InvalidRequest",
        "claim ns/a spec.devices.requests[gpu]",
        "'device.attributes['",
        "does not compile",
    )


def test_c3_an_unknown_variable_is_refused_at_compile_time() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", "request.size > 1"))
    c.assert_refused(
        "p",
        "InvalidRequest",
        "claim ns/a spec.devices.requests[gpu]",
        "unknown variable(s) ['request']",
        "'device'",
    )


def test_c4_a_runtime_error_missing_attribute_is_shown_not_swallowed() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", f'device.attributes["{DRIVER_NAME}"].noSuchAttribute == "x"'))
    c.assert_refused(
        "p", "NoMatchingDevice", "claim ns/a request gpu", "CEL runtime error", "noSuchAttribute"
    )


def test_c5_a_runtime_type_error_is_shown() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", f"{PROFILE} > 3"))
    c.assert_refused("p", "NoMatchingDevice", "CEL runtime error", f"{PROFILE} > 3", "No such overload")


def test_c6_an_expression_that_is_not_a_bool_is_shown() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", PROFILE))
    c.assert_refused("p", "NoMatchingDevice", f"{PROFILE!r} returned '", "not a bool")


def test_c7_unknown_opaque_config_fields_are_refused_with_the_allowed_fields() -> None:
    c = Cluster(hami={"h1": [40960]})
    c.submit(
        "p", claim("a", exactly=hami_body(cores=0), config=[percent_config(25, request="gpu", colour="red")])
    )
    c.assert_refused(
        "p",
        "InvalidRequest",
        "claim ns/a spec.devices.config[0].opaque.parameters",
        "unknown field(s) colour",
        "allowed: apiVersion, kind, memoryPercentage",
    )


def test_c8_an_opaque_config_of_an_unknown_kind_is_refused_with_the_known_types() -> None:
    c = Cluster(hami={"h1": [40960]})
    c.submit(
        "p", claim("a", exactly=hami_body(cores=0), config=[percent_config(25, request="gpu", kind="Gpu")])
    )
    c.assert_refused(
        "p", "InvalidRequest", "spec.devices.config[0].opaque.parameters.kind: 'Gpu'", "SharedGpuRequest"
    )


def test_c9_count_1000_is_refused_with_the_allowed_range() -> None:
    c = _a100()
    c.submit("p", _mig_claim("a", count=1000))
    c.assert_refused(
        "p", "InvalidRequest", "claim ns/a spec.devices.requests ask for 1000 devices", "at most 32"
    )


def test_c10_allocation_mode_all_on_a_busy_node_is_refused_and_touches_no_allocation() -> None:
    c = _a100()
    c.submit("busy", _mig_claim("held", f'{PROFILE} == "3g.20gb"'))
    assert c.writer.writes == [("protect", "ns/held"), ("allocate", "ns/held"), ("release", "ns/busy")]
    held = c.controller.cache["resourceclaims"]["ns/held"]["status"]["allocation"]
    owners_before = dict(c.controller.ledger.owners)
    c.writer.writes.clear()
    del c.claims["ns/held"]  # allocated on purpose; the refused pod's claim must stay as submitted
    c.submit("p", _mig_claim("all", allocationMode="All"))
    c.assert_refused(
        "p",
        "InvalidRequest",
        "claim ns/all spec.devices.requests[gpu].allocationMode All",
        "use allocationMode ExactCount",
    )
    assert c.controller.cache["resourceclaims"]["ns/held"]["status"]["allocation"] == held
    assert dict(c.controller.ledger.owners) == owners_before


def test_c11_a_device_class_that_does_not_exist_is_named() -> None:
    c = _a100()
    c.submit("p", claim("a", exactly={"deviceClassName": "gpu.example.com", "count": 1}))
    c.assert_refused(
        "p", "InvalidRequest", "exactly.deviceClassName: DeviceClass 'gpu.example.com' does not exist"
    )


def test_c12_capacity_asked_of_mig_devices_is_a_filter() -> None:
    # As upstream for devices without allowMultipleAllocations: the device must hold the request.
    c = _a100()
    body = mig_body(4000) | {"capacity": {"requests": {"memory": "99Gi"}}}
    c.submit("p", claim("a", exactly=body))
    c.assert_refused("p", "NoMatchingDevice", "claim ns/a request gpu", "no published MIG")


def test_c13_a_share_larger_than_any_gpu_names_the_size() -> None:
    c = Cluster(hami={"h1": [40960]})
    c.submit("p", claim("a", exactly=hami_body(memory=100000, cores=0)))
    c.assert_refused(
        "p",
        "NoMatchingDevice",
        "claim ns/a spec.devices.requests[gpu].capacity.requests.memory: 100000Mi exceeds the 40960Mi of gpu-0-shared",
    )
