"""resource.k8s.io/v1 ResourceSlice validation limits, and a checker for a pool of slice dicts.

The API server enforces these; checking them before publishing turns a rejected create (which would
leave the node's pool incomplete, so nothing on it is allocatable) into an error at build time that
names the slice and device. Values are from `staging/src/k8s.io/api/resource/v1/types.go` (1.35+ layout,
where counter sets live in slices of their own).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = 64  # also applies with taints or list attributes
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_COUNTER_SET = 32
MAX_COUNTER_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE = 32
MAX_ATTRIBUTE_STRING_LENGTH = 64
MAX_NAME_DNS_LABEL = 63
MAX_NAME_DNS_SUBDOMAIN = 253
MAX_QUALIFIED_ID_LENGTH = 32

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_dns_label(name: str) -> bool:
    return len(name) <= MAX_NAME_DNS_LABEL and _DNS_LABEL_RE.match(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= MAX_NAME_DNS_SUBDOMAIN and _DNS_SUBDOMAIN_RE.match(name) is not None


def is_qualified_name(name: str) -> bool:
    """Attribute/capacity key: C identifier <=32, optionally `<DNS subdomain <=63>/` in front."""
    domain, _, ident = name.rpartition("/")
    if domain and (len(domain) > 63 or not is_dns_subdomain(domain)):
        return False
    return len(ident) <= MAX_QUALIFIED_ID_LENGTH and _C_IDENTIFIER_RE.match(ident) is not None


def _check_device(where: str, dev: Mapping[str, Any], problems: list[str]) -> None:
    name = dev.get("name", "")
    if not is_dns_label(name):
        problems.append(f"{where}: device name {name!r} is not a DNS label")
    attrs: Mapping[str, Mapping[str, Any]] = dev.get("attributes", {})
    caps: Mapping[str, Any] = dev.get("capacity", {})
    if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        problems.append(f"{where}: {len(attrs)} attributes + {len(caps)} capacities exceed 32")
    for key in [*attrs, *caps]:
        if not is_qualified_name(key):
            problems.append(f"{where}: attribute/capacity name {key!r} is not a qualified name")
    for key, value in attrs.items():
        if len(value) != 1:
            problems.append(f"{where}: attribute {key!r} must set exactly one value type")
        s = value.get("string")
        if isinstance(s, str) and len(s) > MAX_ATTRIBUTE_STRING_LENGTH:
            problems.append(f"{where}: attribute {key!r} value longer than 64 characters")
    consumptions: Sequence[Mapping[str, Any]] = dev.get("consumesCounters", [])
    if len(consumptions) > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE:
        problems.append(f"{where}: {len(consumptions)} consumesCounters entries exceed 2")
    for c in consumptions:
        if len(c.get("counters", {})) > MAX_COUNTERS_PER_CONSUMPTION:
            problems.append(f"{where}: consumes more than 32 counters of {c.get('counterSet')!r}")


def validate_pool(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every limit violation in a node's pool (1.35+ layout). Empty list means publishable."""
    problems: list[str] = []
    counter_sets: dict[str, Mapping[str, Any]] = {}
    device_names: set[str] = set()
    if not slices:
        return problems
    pools = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"]) for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if len(pools) != 1 or counts != {len(slices)}:
        problems.append(f"slices disagree on pool/generation {pools} or resourceSliceCount {counts}")
    for s in slices:
        sname = s["metadata"]["name"]
        spec = s["spec"]
        if not is_dns_subdomain(sname):
            problems.append(f"slice {sname!r}: name is not a DNS subdomain")
        devices = spec.get("devices", [])
        sets = spec.get("sharedCounters", [])
        if devices and sets:
            problems.append(f"slice {sname}: has both devices and sharedCounters (rejected since 1.35)")
        if len(sets) > MAX_COUNTER_SETS_PER_SLICE:
            problems.append(f"slice {sname}: {len(sets)} counter sets exceed {MAX_COUNTER_SETS_PER_SLICE}")
        for cs in sets:
            if not is_dns_label(cs["name"]) or cs["name"] in counter_sets:
                problems.append(f"slice {sname}: counter set name {cs['name']!r} invalid or duplicated")
            if len(cs["counters"]) > MAX_COUNTERS_PER_COUNTER_SET:
                problems.append(f"slice {sname}: counter set {cs['name']} has more than 32 counters")
            for counter in cs["counters"]:
                if not is_dns_label(counter):
                    problems.append(f"slice {sname}: counter name {counter!r} is not a DNS label")
            counter_sets[cs["name"]] = cs["counters"]
        uses_counters = any(d.get("consumesCounters") for d in devices)
        limit = MAX_DEVICES_PER_SLICE_WITH_COUNTERS if uses_counters else MAX_DEVICES_PER_SLICE
        if len(devices) > limit:
            problems.append(f"slice {sname}: {len(devices)} devices exceed {limit}")
        for dev in devices:
            where = f"slice {sname} device {dev.get('name')!r}"
            if dev.get("name") in device_names:
                problems.append(f"{where}: name not unique in the pool")
            device_names.add(dev.get("name", ""))
            _check_device(where, dev, problems)
    # Consumption must name counters that exist in the pool (checked pool-wide, as the 1.35 API does).
    for s in slices:
        for dev in s["spec"].get("devices", []):
            for c in dev.get("consumesCounters", []):
                known = counter_sets.get(c["counterSet"])
                if known is None:
                    problems.append(f"device {dev['name']}: counter set {c['counterSet']!r} not in the pool")
                    continue
                for counter in c["counters"]:
                    if counter not in known:
                        problems.append(f"device {dev['name']}: counter {counter!r} not in {c['counterSet']}")
    return problems
