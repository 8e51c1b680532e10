"""Pods written for NVIDIA's device plugin (MIG mixed strategy): `nvidia.com/mig-<profile>: N` becomes a
claim for N MIG instances of exactly that profile, or a denial naming the resource and the allowed profiles."""

from __future__ import annotations

from typing import Any

import pytest
from shim_helpers import container, legacy_keys_left, mutate, pod

from controller.claims.cel import CelDevice, CelEnvironment
from controller.shim import AdmissionDenied, ShimDefaults
from controller.shim.migprofile import ProfileShape, allowed_profiles, profile_of_resource, slug
from controller.shim.templates import profile_selector, shape_from_name, template_for, template_name
from driver.catalog.allowlist import DEFAULT_MIG_PROFILE_ALLOWLIST, parse_allowlist
from driver.catalog.models import KNOWN_MODELS

GATE = {"name": "gpu.flexmig.dev/allocation"}
DRV = "gpu.flexmig.dev"


def test_device_plugin_pod_becomes_an_exact_profile_claim() -> None:
    # As NVIDIA's mixed-strategy guide writes it; the API server hands "1" over as a quantity string.
    p = pod(container("cuda", {"nvidia.com/mig-3g.20gb": "1", "cpu": "1"}))
    result, out = mutate(p)
    assert result.gated
    [template] = result.templates
    assert template.name == "flexmig-profile-1x-3g20gb"
    c = out["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"cpu": "1"}, "claims": [{"name": "cuda-gpu"}]}
    assert legacy_keys_left(out) == []
    assert out["spec"]["resourceClaims"] == [
        {"name": "cuda-gpu", "resourceClaimTemplateName": "flexmig-profile-1x-3g20gb"}
    ]
    assert out["spec"]["schedulingGates"] == [GATE]
    spec = template.body["spec"]["spec"]
    assert spec == {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "mig.gpu.flexmig.dev",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "selectors": [
                            {"cel": {"expression": f'device.attributes["{DRV}"].profile == "3g.20gb"'}}
                        ],
                    },
                }
            ]
        }
    }
    assert template.body["metadata"]["labels"]["gpu.flexmig.dev/shim-template"] == "v1"


def test_two_profiles_in_one_container_get_one_claim_each() -> None:
    limits = {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1"}
    result, out = mutate(pod(container("app", limits)))
    assert sorted(t.name for t in result.templates) == [
        "flexmig-profile-1x-3g40gb",
        "flexmig-profile-2x-1g10gb",
    ]
    assert out["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "app-gpu"}, {"name": "app-gpu-2"}]
    }
    # Two instances of one profile may share a GPU, as with the device plugin: no distinct constraint.
    two = next(t for t in result.templates if t.name.startswith("flexmig-profile-2x"))
    assert "constraints" not in two.body["spec"]["spec"]["devices"]


def test_media_variant_in_the_device_plugins_spelling() -> None:
    allow = parse_allowlist([{"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb+me", "7g.40gb"]}])
    result, _ = mutate(pod(container("m", {"nvidia.com/mig-1g.5gb.me": "1"})), ShimDefaults(allowlist=allow))
    [template] = result.templates
    assert template.name == "flexmig-profile-1x-1g5gb-me"
    selector = template.body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
    assert selector["cel"]["expression"].endswith('== "1g.5gb+me"')


def test_zero_asks_for_nothing() -> None:
    result, _ = mutate(pod(container("idle", {"nvidia.com/mig-1g.10gb": "0"})))
    assert (result.patch, result.gated) == ([], False)


def _denial(p: dict[str, Any], defaults: ShimDefaults | None = None) -> str:
    with pytest.raises(AdmissionDenied) as exc:
        mutate(p, defaults)
    return exc.value.message


def test_unknown_profile_names_the_field_and_the_allowed_profiles() -> None:
    message = _denial(pod(container("c", {"nvidia.com/mig-1g.5gbx": "1"})))
    assert "container \"c\": nvidia.com/mig-1g.5gbx asks for MIG profile '1g.5gbx'" in message
    assert "no GPU model offers it" in message
    assert "1g.5gb (A100-40GB, A800-40GB)" in message and "7g.141gb (H200-141GB, H20-141GB)" in message


def test_profile_outside_the_allowlist_says_which_models_offer_it() -> None:
    # 4g.20gb exists on the A100-40GB but the default allowlist (HAMi's) leaves it out.
    message = _denial(pod(container("c", {"nvidia.com/mig-4g.20gb": "1"})))
    assert "migProfileAllowlist does not allow it on A100-40GB, A800-40GB" in message


def test_compute_instance_profiles_are_never_published() -> None:
    message = _denial(pod(container("c", {"nvidia.com/mig-1c.3g.20gb": "1"})))
    assert "'1c.3g.20gb'" in message and "no GPU model offers it" in message


@pytest.mark.parametrize(
    ("limits", "mode", "needle"),
    [
        (
            {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"},
            None,
            "nvidia.com/mig-1g.10gb cannot be combined",
        ),
        (
            {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/priority": "0"},
            None,
            "nvidia.com/priority cannot be combined",
        ),
        ({"nvidia.com/mig-1g.10gb": "1"}, "hami-core", "nvidia.com/vgpu-mode is hami-core"),
        ({"nvidia.com/mig-1g.10gb": "1.5"}, None, "nvidia.com/mig-1g.10gb='1.5' in limits is not allowed"),
        ({"nvidia.com/mig-1g.10gb": "33"}, None, "(allowed: a whole number of MIG instances, 0..32)"),
    ],
)
def test_denials(limits: dict[str, str], mode: str | None, needle: str) -> None:
    assert needle in _denial(pod(container("c", limits), mode=mode))


def test_node_name_is_refused_as_for_hami_pods() -> None:
    message = _denial(pod(container("c", {"nvidia.com/mig-1g.10gb": "1"}), nodeName="n1"))
    assert message.startswith("spec.nodeName is set and container(s) c ask for")


def test_every_profile_name_round_trips_through_its_template_name() -> None:
    for model in KNOWN_MODELS:
        for profile in model.profiles:
            shape = ProfileShape(count=3, profile=profile)
            name = template_name(shape)
            assert len(name) <= 63 and name == name.lower()
            assert shape_from_name(name) == shape
            assert template_for("ns", shape).name == name
            assert ProfileShape(1, profile_of_resource(shape.resource) or "").profile == profile


@pytest.mark.parametrize(
    "name",
    [
        "flexmig-profile-01x-1g10gb",
        "flexmig-profile-0x-1g10gb",
        "flexmig-profile-33x-1g10gb",
        "flexmig-profile-1x-1g010gb",
        "flexmig-profile-1x-1g10gb-xx",
        "flexmig-profile-1x-1c3g20gb",
        "flexmig-profile-1x-",
    ],
)
def test_names_the_shim_never_writes_stand_for_nothing(name: str) -> None:
    assert shape_from_name(name) is None


def test_slugs_are_distinct() -> None:
    names = {p for m in KNOWN_MODELS for p in m.profiles}
    assert len({slug(p) for p in names}) == len(names)


def _mig(profile: str) -> CelDevice:
    return CelDevice.from_slice_device(
        DRV,
        {
            "name": "gpu-0-mig-x-0-0",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
        },
    )


def test_selector_admits_exactly_that_profile_in_the_controllers_cel() -> None:
    selector = CelEnvironment().compile(profile_selector(ProfileShape(1, "1g.10gb+me")))
    verdicts = {p: selector.evaluate(_mig(p)) for p in ("1g.10gb+me", "1g.10gb", "1g.10gb+me.all")}
    assert verdicts == {"1g.10gb+me": True, "1g.10gb": False, "1g.10gb+me.all": False}


def test_allowed_profiles_follow_the_allowlist() -> None:
    allowed = allowed_profiles(DEFAULT_MIG_PROFILE_ALLOWLIST)
    assert allowed["1g.10gb"] == ("A100-80GB", "H100-80GB", "A800-80GB", "H800-80GB")
    assert "4g.20gb" not in allowed
    # HAMi's guide writes 7g.79gb for the A100-80GB; the node reads it as NVIDIA's 7g.80gb.
    rounded = allowed_profiles(parse_allowlist([{"models": ["A100-SXM4-80GB"], "profiles": ["7g.79gb"]}]))
    assert dict(rounded) == {"7g.80gb": ("A100-80GB",)}
    # A model flexmig does not know is taken at its word.
    unknown = allowed_profiles(parse_allowlist([{"models": ["NVIDIA Z100"], "profiles": ["2g.30gb"]}]))
    assert dict(unknown) == {"2g.30gb": ("NVIDIA Z100",)}
