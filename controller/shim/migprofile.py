"""Pods written for NVIDIA's device plugin with the MIG "mixed" strategy: a container asks for
`nvidia.com/mig-<profile>: N` (e.g. `nvidia.com/mig-3g.20gb: 1`) and gets N MIG instances of exactly
that profile. The shim turns each such resource into a claim for N devices of class
`mig.gpu.flexmig.dev` whose published `profile` attribute equals the profile, so the pod runs unchanged.

The profile must be one that some GPU model flexmig may create offers: a name no allowed model has
(a typo, a profile of a GPU the cluster's allowlist excludes, a compute-instance profile such as
`1c.3g.20gb`, which flexmig never publishes) would leave the pod pending forever, so it is denied,
naming the resource and the allowed profiles.

Resource names cannot hold "+", so the device plugin writes a profile's variant with a dot:
`1g.10gb+me` is `nvidia.com/mig-1g.10gb.me`, `+me.all` is `.me.all`, `+gfx` is `.gfx`; `-me` stays.
Both spellings are read. Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from controller.shim.legacy import MAX_GPUS, AdmissionDenied, Mode
from controller.shim.legacy import _value as quantity_value
from driver.catalog.allowlist import MigProfileAllowlist
from driver.catalog.models import KNOWN_MODELS, resolve_model
from driver.catalog.naming import rounded_name_match

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_VENDOR_PREFIX = "nvidia.com/"
# Device-plugin spelling -> NVIDIA's; ".me.all" before ".me", which it ends with.
_DOTTED_VARIANTS = ((".me.all", "+me.all"), (".me", "+me"), (".gfx", "+gfx"))
# A GPU-instance profile (flexmig publishes no compute-instance profiles): <G>g.<GB>gb[variant].
_GI_PROFILE = re.compile(r"(?P<g>[1-9][0-9]*)g\.(?P<gb>[1-9][0-9]*)gb(?P<variant>\+me|\+me\.all|\+gfx|-me)?")
# Variant -> its part of a template name (a DNS label holds neither "+" nor "."), and back.
_SLUG_BY_VARIANT = {"": "", "+me": "-me", "+me.all": "-meall", "+gfx": "-gfx", "-me": "-nome"}
_VARIANT_BY_SLUG = {slug: variant for variant, slug in _SLUG_BY_VARIANT.items()}


@dataclass(frozen=True)
class ProfileShape:
    """One `nvidia.com/mig-<profile>: count` resource: `count` MIG instances of exactly `profile`."""

    count: int
    profile: str

    def __post_init__(self) -> None:
        # Invariants the template builder relies on; violations are bugs here, not user input.
        if not 1 <= self.count <= MAX_GPUS:
            raise ValueError(f"count {self.count} outside 1..{MAX_GPUS}")
        if _GI_PROFILE.fullmatch(self.profile) is None:
            raise ValueError(f"{self.profile!r} is not a GPU-instance profile name")

    @property
    def resource(self) -> str:
        """The resource name the device plugin advertises for this profile."""
        name = self.profile
        for dotted, plus in _DOTTED_VARIANTS:
            name = name.replace(plus, dotted)
        return MIG_RESOURCE_PREFIX + name


def profile_of_resource(key: str) -> str | None:
    """NVIDIA's profile name a `nvidia.com/mig-...` resource asks for; None for any other resource."""
    if not key.startswith(MIG_RESOURCE_PREFIX):
        return None
    name = key[len(MIG_RESOURCE_PREFIX) :]
    for dotted, plus in _DOTTED_VARIANTS:
        if name.endswith(dotted):
            return name[: -len(dotted)] + plus
    return name


def slug(profile: str) -> str:
    """`3g.20gb` -> `3g20gb`, `1g.10gb+me` -> `1g10gb-me`: a profile as part of a DNS label."""
    m = _GI_PROFILE.fullmatch(profile)
    if m is None:
        raise ValueError(f"{profile!r} is not a GPU-instance profile name")
    return f"{m['g']}g{m['gb']}gb{_SLUG_BY_VARIANT[m['variant'] or '']}"


_SLUG = re.compile(r"(?P<g>[0-9]+)g(?P<gb>[0-9]+)gb(?P<variant>-me|-meall|-gfx|-nome)?")


def profile_from_slug(text: str) -> str | None:
    """The profile `slug` wrote `text` for, or None."""
    m = _SLUG.fullmatch(text)
    if m is None:
        return None
    profile = f"{m['g']}g.{m['gb']}gb{_VARIANT_BY_SLUG[m['variant'] or '']}"
    return profile if _GI_PROFILE.fullmatch(profile) and slug(profile) == text else None


@functools.lru_cache(maxsize=8)  # one allowlist per webhook; every review asks again
def allowed_profiles(allowlist: MigProfileAllowlist) -> Mapping[str, tuple[str, ...]]:
    """Profile -> the models that may offer it under the allowlist (the node publishes a profile only
    when its GPU's model offers it and its allowlist entry names it). A model the catalog does not
    know is taken at its word: its listed profiles count, under the name the allowlist gives it."""
    found: dict[str, list[str]] = {}
    for entry in allowlist.entries:
        for name in entry.models:
            model = resolve_model(name)
            for listed in entry.profiles:
                # A rounded name ("7g.79gb") is read by the node as the GPU's own name ("7g.80gb").
                profile = listed if model is None else rounded_name_match(listed, model.profiles)
                label = name if model is None else model.key
                if profile is not None and label not in found.setdefault(profile, []):
                    found[profile].append(label)
    return MappingProxyType({p: tuple(found[p]) for p in sorted(found, key=_profile_order)})


def _profile_order(profile: str) -> tuple[int, int, str]:
    m = _GI_PROFILE.fullmatch(profile)
    return (int(m["g"]), int(m["gb"]), profile) if m else (0, 0, profile)


def has_profile_resources(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any(
        str(key).startswith(MIG_RESOURCE_PREFIX)
        for part in ("limits", "requests")
        for key in resources.get(part) or {}
    )


def _count(who: str, key: str, where: str, raw: Any, errors: list[str]) -> int | None:
    value = quantity_value(raw)
    if value is None or value.denominator != 1 or not 0 <= value <= MAX_GPUS:
        errors.append(
            f"{who}: {key}={raw!r} in {where} is not allowed (allowed: a whole number of MIG instances, "
            f"0..{MAX_GPUS})"
        )
        return None
    return int(value)


def _unknown_profile(who: str, key: str, profile: str, allowed: Mapping[str, tuple[str, ...]]) -> str:
    listed = ", ".join(f"{p} ({', '.join(models)})" for p, models in allowed.items()) or "none"
    offering = [m.key for m in KNOWN_MODELS if profile in m.profiles]
    why = (
        f"the device config's migProfileAllowlist does not allow it on {', '.join(offering)}, the "
        "models that offer it"
        if offering
        else "no GPU model offers it"
    )
    return (
        f"{who}: {key} asks for MIG profile {profile!r}, and {why} (allowed: nvidia.com/mig-<profile>, "
        f"a variant's '+' written as '.', with one of the allowed profiles: {listed})"
    )


def container_profile_shapes(
    container: Mapping[str, Any], mode: Mode, allowed: Mapping[str, tuple[str, ...]], kind: str = "container"
) -> list[ProfileShape]:
    """One shape per `nvidia.com/mig-<profile>` resource of the container ([] when each is 0);
    raises AdmissionDenied listing every problem."""
    who = f'{kind} "{container.get("name", "?")}"'
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    errors: list[str] = []
    if mode is Mode.HAMI_CORE:
        errors.append(
            f"{who}: nvidia.com/mig-* resources ask for MIG instances, but the pod's annotation "
            "nvidia.com/vgpu-mode is hami-core (allowed: mig, or no annotation)"
        )
    others = sorted(
        {str(k) for k in (*limits, *requests) if str(k).startswith(_VENDOR_PREFIX)}
        - {str(k) for k in (*limits, *requests) if str(k).startswith(MIG_RESOURCE_PREFIX)}
    )
    if others:
        errors.append(
            f"{who}: {', '.join(others)} cannot be combined with nvidia.com/mig-* resources under "
            "flexmig (allowed: only nvidia.com/mig-<profile> resources in such a container)"
        )
    shapes: list[ProfileShape] = []
    for key in sorted({str(k) for k in (*limits, *requests) if str(k).startswith(MIG_RESOURCE_PREFIX)}):
        in_limits = _count(who, key, "limits", limits[key], errors) if key in limits else None
        same = key in limits and key in requests and str(limits[key]) == str(requests[key])
        in_requests = (
            _count(who, key, "requests", requests[key], errors) if key in requests and not same else None
        )
        if in_limits is not None and in_requests is not None and in_limits != in_requests:
            errors.append(
                f"{who}: {key} differs between limits ({limits[key]!r}) and requests "
                f"({requests[key]!r}); give it in limits only, or the same value in both"
            )
            continue
        count = in_limits if in_limits is not None else in_requests
        profile = profile_of_resource(key) or ""
        if profile not in allowed:
            errors.append(_unknown_profile(who, key, profile, allowed))
            continue
        if count:  # 0 asks for nothing, as with nvidia.com/gpu: 0
            shapes.append(ProfileShape(count=count, profile=profile))
    if errors:
        raise AdmissionDenied("; ".join(errors))
    return shapes


__all__ = [
    "MIG_RESOURCE_PREFIX",
    "ProfileShape",
    "allowed_profiles",
    "container_profile_shapes",
    "has_profile_resources",
    "profile_from_slug",
    "profile_of_resource",
    "slug",
]
