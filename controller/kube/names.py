"""Kubernetes object names from objects flexmig did not write, checked before they reach a request
path, and path segments escaped so that no name can steer a request.

A pod author (or anyone who reaches the webhook port) chooses the names in a pod spec; joined into a
URL unchecked, `../../secrets/x` or `x?watch=true` would make the controller read other namespaces'
objects with its own rights. So names are validated as the API server itself validates them (and a
name it would refuse is refused here with the same rule), and every segment is percent-escaped anyway.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_SHOWN_MAX = 80  # a hostile name can be long; the message shows its start and its length

SUBDOMAIN_RULE = (
    f"must be a DNS-1123 subdomain: at most {DNS1123_SUBDOMAIN_MAX} characters of lowercase letters, "
    "digits, '-' and '.', starting and ending with a letter or digit"
)
LABEL_RULE = (
    f"must be a DNS-1123 label: at most {DNS1123_LABEL_MAX} characters of lowercase letters, digits "
    "and '-', starting and ending with a letter or digit"
)


def is_dns1123_subdomain(value: object) -> bool:
    """ResourceClaim, ResourceClaimTemplate, DeviceClass and most other object names."""
    return (
        isinstance(value, str)
        and len(value) <= DNS1123_SUBDOMAIN_MAX
        and _SUBDOMAIN_RE.fullmatch(value) is not None
    )


def is_dns1123_label(value: object) -> bool:
    """Namespace names."""
    return (
        isinstance(value, str) and len(value) <= DNS1123_LABEL_MAX and _LABEL_RE.fullmatch(value) is not None
    )


def shown(value: object) -> str:
    """The value for a message: JSON-quoted, cut after 80 characters (with its length)."""
    if not isinstance(value, str):
        return f"{json.dumps(value)[:_SHOWN_MAX]} (a {type(value).__name__}, not a string)"
    if len(value) <= _SHOWN_MAX:
        return json.dumps(value)
    return f'{json.dumps(value[:_SHOWN_MAX])[:-1]}..." ({len(value)} characters)'


def subdomain_problem(field: str, value: object) -> str | None:
    """None if `value` is a valid object name, else `<field>: "<value>" is not a valid name: <rule>`."""
    if is_dns1123_subdomain(value):
        return None
    return f"{field}: {shown(value)} is not a valid name: {SUBDOMAIN_RULE}"


def label_problem(field: str, value: object) -> str | None:
    """None if `value` is a valid namespace name, else the message naming the field and the rule."""
    if is_dns1123_label(value):
        return None
    return f"{field}: {shown(value)} is not a valid namespace name: {LABEL_RULE}"


def segment(value: str) -> str:
    """One path segment, every reserved character escaped (`/`, `?`, `#`, `%` included)."""
    return quote(str(value), safe="")


def namespaced_path(prefix: str, namespace: str, resource: str, name: str = "") -> str:
    """`<prefix>/namespaces/<namespace>/<resource>[/<name>]`, each taken segment escaped; raises
    ValueError for a name the API server would not accept (a bug: callers validate first)."""
    if not is_dns1123_label(namespace):
        raise ValueError(label_problem("namespace", namespace))
    if name and not is_dns1123_subdomain(name):
        raise ValueError(subdomain_problem("name", name))
    path = f"{prefix}/namespaces/{segment(namespace)}/{resource}"
    return f"{path}/{segment(name)}" if name else path
