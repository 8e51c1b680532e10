"""Does a pod's own claim use flexmig devices? (The shim gates such pods so the controller allocates them.)

A pod claim names a ResourceClaim or a ResourceClaimTemplate; this reads it and checks every
deviceClassName it asks for (`exactly` and each `firstAvailable` alternative) against the flexmig
DeviceClasses: classes named `gpu.flexmig.dev` or `*.gpu.flexmig.dev` (the chart's), and any class
whose CEL selectors test `device.driver == "gpu.flexmig.dev"` or read
`device.attributes["gpu.flexmig.dev"]` (an admin's own class, e.g. one pinning a MIG profile). The class list is cached for `ttl_s`; claims and templates are read on each admission
(their specs are immutable, but a name can be deleted and reused).

Answers: True/False; None when the referenced object does not exist (yet), which the shim denies
(retryably) since it cannot tell whose devices the pod will get; a missing template whose name is a
shim template's is True (its body is fixed by its name, and the controller creates it). An API error
other than 404 raises, so the webhook fails closed instead of letting a flexmig pod through ungated.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.constants import DRIVER_NAME
from controller.kube.names import namespaced_path
from controller.kube.rest import request
from controller.shim.templates import shape_from_name

RESOURCE_API = "/apis/resource.k8s.io/v1"
DEFAULT_TTL_S = 30.0
API_TIMEOUT_S = 4.0
"""Per read while an admission waits: well inside the webhook's timeout, so the pod is denied with our
message rather than the API server's "context deadline exceeded"."""


def is_flexmig_class_name(name: str) -> bool:
    return name == DRIVER_NAME or name.endswith("." + DRIVER_NAME)


_DRIVER = re.escape(DRIVER_NAME)
_NOT_AFTER_NAME = r"(?<![\w.])"  # `device` itself, not `mydevice` or `x.device`
_SELECTS_DRIVER = re.compile(
    rf"{_NOT_AFTER_NAME}device\.driver\s*==\s*(['\"]){_DRIVER}\1"
    rf"|(['\"]){_DRIVER}\2\s*==\s*{_NOT_AFTER_NAME}device\.driver(?![\w.])"
    rf"|{_NOT_AFTER_NAME}device\.attributes\s*\[\s*(['\"]){_DRIVER}\3\s*\]"
)
"""`device.driver == "gpu.flexmig.dev"` (either quote style and side, any spacing) or
`device.attributes["gpu.flexmig.dev"]`: a comparison with `!=`, or a longer name containing the
driver's (`x.gpu.flexmig.dev.example`), does not select flexmig devices."""


def is_flexmig_class(device_class: Mapping[str, Any]) -> bool:
    name = str((device_class.get("metadata") or {}).get("name") or "")
    if is_flexmig_class_name(name):
        return True
    for selector in (device_class.get("spec") or {}).get("selectors") or ():
        expression = ((selector or {}).get("cel") or {}).get("expression") or ""
        if _SELECTS_DRIVER.search(str(expression)):
            return True
    return False


def requested_classes(claim_spec: Mapping[str, Any]) -> set[str]:
    """Every deviceClassName a ResourceClaimSpec can be allocated from."""
    names: set[str] = set()
    for req in (claim_spec.get("devices") or {}).get("requests") or ():
        exactly = req.get("exactly") or {}
        if exactly.get("deviceClassName"):
            names.add(str(exactly["deviceClassName"]))
        for alternative in req.get("firstAvailable") or ():
            if alternative.get("deviceClassName"):
                names.add(str(alternative["deviceClassName"]))
    return names


class FlexmigClaims:
    def __init__(
        self, api: Any, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._classes: frozenset[str] = frozenset()
        self._loaded_at: float | None = None

    def flexmig_classes(self) -> frozenset[str]:
        """Names of the DeviceClasses that select flexmig devices (refreshed every ttl_s)."""
        now = self.clock()
        with self._lock:
            if self._loaded_at is not None and now - self._loaded_at < self.ttl_s:
                return self._classes
        listed = request(self.api, "GET", f"{RESOURCE_API}/deviceclasses", timeout_s=API_TIMEOUT_S)
        classes = frozenset(str(c["metadata"]["name"]) for c in _items(listed) if is_flexmig_class(c))
        with self._lock:
            self._classes, self._loaded_at = classes, now
        return classes

    def _spec_of(self, namespace: str, entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
        # The shim validated the names (mutate._flexmig_claims); namespaced_path checks them again
        # and escapes them, so no name from a pod spec can leave the pod's namespace.
        if entry.get("resourceClaimName"):
            path = namespaced_path(RESOURCE_API, namespace, "resourceclaims", entry["resourceClaimName"])
            nested = False
        elif entry.get("resourceClaimTemplateName"):
            name = entry["resourceClaimTemplateName"]
            path = namespaced_path(RESOURCE_API, namespace, "resourceclaimtemplates", name)
            nested = True
        else:
            return {}  # names neither: API validation rejects the pod after the webhook
        try:
            obj = request(self.api, "GET", path, timeout_s=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        spec = obj.get("spec") or {}
        return (spec.get("spec") or {}) if nested else spec

    def uses_flexmig(self, namespace: str, entry: Mapping[str, Any]) -> bool | None:
        spec = self._spec_of(namespace, entry)
        if spec is None:
            # A shim template name (say, from a pod spec copied out of the cluster) stands for one
            # fixed flexmig body, which the controller creates once the pod exists.
            if not entry.get("resourceClaimName") and shape_from_name(entry.get("resourceClaimTemplateName")):
                return True
            return None
        wanted = requested_classes(spec)
        if any(is_flexmig_class_name(n) for n in wanted):
            return True  # no list needed for the chart's classes
        return bool(wanted & self.flexmig_classes())

    def checker(self, namespace: str) -> Callable[[Mapping[str, Any]], bool | None]:
        """The `claim_uses_flexmig` the shim takes, for pods of `namespace`."""
        return lambda entry: self.uses_flexmig(namespace, entry)


def _items(listed: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return listed.get("items") or ()
