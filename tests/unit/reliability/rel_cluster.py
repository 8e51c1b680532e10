"""A controller deciding pods against simulated nodes, its API writes kept in memory and recorded.

What a user of a refused pod sees is exactly what this records: the pod's `gpu.flexmig.dev/allocation`
condition, its Warning events, the `flexmig_gated_pods{reason}` gauge; and what must not happen (a
claim written, a finalizer added, the gate removed) shows up in `writes`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctl_helpers import node_slices
from shared_helpers import CLASSES, shared_slice
from shim_helpers import apply_patch  # the strict RFC 6902 applier of the shim tests

from api.constants import ALLOCATION_GATE
from controller.allocation.loop import Controller
from controller.kube.store import Event
from controller.kube.watchcache import WatchCache
from controller.kube.writer import Writer
from controller.shim import ShimDefaults, mutate_pod
from controller.shim.templates import TemplateSpec

Obj = dict[str, Any]
RESOURCES = ("resourceslices", "resourceclaims", "deviceclasses", "pods", "nodes")


@dataclass
class Surfaced:
    """What the user sees about one pod after a controller step."""

    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (status, reason, message)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


class RecordingWriter(Writer):
    """The controller's writes, applied to objects in memory; every call is recorded."""

    def __init__(self) -> None:
        super().__init__(api_client=None)
        self.writes: list[tuple[str, str]] = []  # (what, object key) of every write to a claim or pod
        self.seen: dict[str, Surfaced] = {}

    def _key(self, obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace')}/{meta['name']}"

    def protect_claim(self, claim: Mapping[str, Any], pod_uid: str) -> Obj:
        self.writes.append(("protect", self._key(claim)))
        return copy.deepcopy(dict(claim))

    def write_allocation(
        self,
        claim: Mapping[str, Any],
        allocation: Mapping[str, Any] | None,
        reserve_for: Mapping[str, Any] | None = None,
    ) -> Obj:
        self.writes.append(("allocate" if allocation else "deallocate", self._key(claim)))
        body = copy.deepcopy(dict(claim))
        body.setdefault("status", {})["allocation"] = allocation
        return body

    def unprotect_claim(self, claim: Mapping[str, Any]) -> Obj | None:
        self.writes.append(("unprotect", self._key(claim)))
        return copy.deepcopy(dict(claim))

    def release_pod(self, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> Obj:
        self.writes.append(("release", self._key(pod)))
        body = copy.deepcopy(dict(pod))
        body["spec"]["schedulingGates"] = []
        return body

    def set_condition(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> None:
        self.seen.setdefault(self._key(pod), Surfaced()).conditions.append((status, reason, message))

    def event(self, obj: Mapping[str, Any], kind: str, event_type: str, reason: str, message: str) -> None:
        self.seen.setdefault(self._key(obj), Surfaced()).events.append((event_type, reason, message))


def gated_pod(name: str, claims: Sequence[str], ns: str = "ns") -> Obj:
    """A pod gated for flexmig that uses existing claims by name."""
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"pod-{name}"},
        "spec": {
            "schedulingGates": [{"name": ALLOCATION_GATE}],
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [{"name": "main", "resources": {"claims": [{"name": c} for c in claims]}}],
        },
    }


class Cluster:
    """Simulated nodes (MIG: `mig={node: (model, gpus)}`; hami-core: `hami={node: [MiB per GPU]}`) and a
    leading controller over them."""

    def __init__(
        self, mig: Mapping[str, tuple[str, int]] | None = None, hami: Mapping[str, list[int]] | None = None
    ) -> None:
        mig = dict(mig or {})
        hami = dict(hami or {})
        self.writer = RecordingWriter()
        self.controller = Controller(
            WatchCache({r: (lambda **_: None) for r in RESOURCES}), self.writer, catch_up=False
        )
        slices = [s for node, (model, n) in mig.items() for s in node_slices(node, model, n)]
        slices += [shared_slice(node, mems) for node, mems in hami.items()]
        nodes = tuple({"metadata": {"name": n}, "spec": {}} for n in [*mig, *hami])
        self.claims: dict[str, Obj] = {}
        self.controller.apply(
            [
                Event("nodes", "REPLACE", items=nodes),
                Event("deviceclasses", "REPLACE", items=tuple(CLASSES.values())),
                Event("resourceslices", "REPLACE", items=tuple(slices)),
                Event("resourceclaims", "REPLACE", items=()),
                Event("pods", "REPLACE", items=()),
            ]
        )

    def add_claim(self, claim: Obj) -> None:
        self.claims[f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"] = claim
        self.controller.apply([Event("resourceclaims", "ADDED", obj=claim)])

    def add_pod(self, pod: Obj) -> None:
        self.controller.apply([Event("pods", "ADDED", obj=pod)])

    def submit(self, name: str, *claims: Obj) -> None:
        """Claims and a gated pod using them, then one controller step."""
        for c in claims:
            self.add_claim(c)
        self.add_pod(gated_pod(name, [c["metadata"]["name"] for c in claims]))
        self.controller.step()

    def submit_legacy(self, pod: Obj, ns: str = "ns") -> list[TemplateSpec]:
        """A legacy pod as the webhook admits it; its claims made from the templates (as the API server's
        resourceclaim controller does), then one controller step. Returns the templates."""
        result = mutate_pod(pod, ns, ShimDefaults(), lambda _entry: False)
        admitted = copy.deepcopy(pod)
        admitted["metadata"].setdefault("namespace", ns)
        admitted["metadata"].setdefault("uid", f"pod-{pod['metadata']['name']}")
        admitted = apply_patch(admitted, result.patch)
        templates = {t.name: t for t in result.templates}
        statuses = []
        for entry in admitted["spec"].get("resourceClaims") or []:
            name = f"{admitted['metadata']['name']}-{entry['name']}"
            template = templates[entry["resourceClaimTemplateName"]]
            self.add_claim(
                {
                    "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
                    "spec": copy.deepcopy(template.body["spec"]["spec"]),
                }
            )
            statuses.append({"name": entry["name"], "resourceClaimName": name})
        admitted["status"] = {"resourceClaimStatuses": statuses}
        self.add_pod(admitted)
        self.controller.step()
        return list(result.templates)

    def surfaced(self, pod: str, ns: str = "ns") -> Surfaced:
        return self.writer.seen.get(f"{ns}/{pod}", Surfaced())

    def gated(self, reason: str) -> float:
        value = self.controller.metrics.registry.get_sample_value("flexmig_gated_pods", {"reason": reason})
        return value or 0.0

    def assert_refused(self, pod: str, reason: str, *fragments: str) -> str:
        """The pod is told `reason` with a message holding every fragment (condition and one Warning
        event), the gauge counts it, and nothing was written to any claim or pod."""
        seen = self.surfaced(pod)
        assert len(seen.conditions) == 1, seen
        status, got_reason, message = seen.conditions[0]
        assert (status, got_reason) == ("False", reason), seen
        for fragment in fragments:
            assert fragment in message, (fragment, message)
        assert seen.events == [("Warning", "FailedAllocation", f"{reason}: {message}")]
        assert self.gated(reason) >= 1
        assert self.writer.writes == [], self.writer.writes
        # None of the refused pod's claims counts as used (an earlier pod's allocation stays assumed until
        # the watch shows it, which this in-memory writer never delivers).
        assert not {c["metadata"]["uid"] for c in self.claims.values()} & set(self.controller.ledger.assumed)
        key = f"ns/{pod}"
        assert key in self.controller.pending and self.controller.pending[key].reason == reason
        for claim_key, claim in self.claims.items():
            cached = self.controller.cache["resourceclaims"][claim_key]
            assert not (cached.get("status") or {}).get("allocation"), claim_key
            assert cached == claim
        return message
