"""May this pod go to this node? kube-scheduler's node filters, for what Node and Pod objects show.

The controller must only allocate claims on a node kube-scheduler will bind the pod to: otherwise the
pod fails to schedule and kube-scheduler's PostFilter may clear our allocation. This module mirrors, in
the order kube-scheduler runs them, the filter plugins whose verdict depends only on the Node and the
Pod (Kubernetes v1.37; component-helpers/scheduling/corev1 and apimachinery/pkg/labels):

- NodeUnschedulable: `spec.unschedulable` unless the pod tolerates `node.kubernetes.io/unschedulable:NoSchedule`;
- NodeName: a pod that names a node goes there only;
- TaintToleration: every NoSchedule/NoExecute taint tolerated (PreferNoSchedule only scores);
- NodeAffinity: `spec.nodeSelector` and `requiredDuringSchedulingIgnoredDuringExecution`.

Filters that need other pods or node resources (ports, cpu/memory fit, volumes, inter-pod affinity,
topology spread) and the scheduler profile's `addedAffinity` are not visible here and are not checked.
Malformed rules behave as in kube-scheduler (a term that does not parse matches no node; an unknown
toleration operator tolerates nothing); `PodRules.problems` names them so the caller can say so. Node
selector terms (node affinity, and the node selectors of the pod's already-allocated claims) are parsed
and matched in controller/allocation/nodeselector.py.

Objects are the camelCase JSON dicts the watch cache holds. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controller.allocation.nodeselector import ClaimPins, Term, parse_int64, parse_terms, pinned_nodes

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # kube-scheduler's DoNotScheduleTaintsFilterFunc
TOLERATION_OPERATORS = ("Equal", "Exists")  # "" means Equal; Lt/Gt need an alpha gate (off by default)
_DECIMAL = re.compile(r"0|-?[1-9][0-9]*")  # apimachinery content.IsDecimalInteger (taint comparisons)
NAMES_SHOWN = 3


class FilterPlugin(StrEnum):
    """Why a node is excluded: kube-scheduler's plugin names, plus the controller's own two."""

    NODE_UNKNOWN = "NodeUnknown"  # no Node object (yet) for a pool's node
    NODE_UNSCHEDULABLE = "NodeUnschedulable"
    NODE_NAME = "NodeName"
    TAINT_TOLERATION = "TaintToleration"
    NODE_AFFINITY = "NodeAffinity"
    ALLOCATED_CLAIMS = "AllocatedClaims"  # another of the pod's claims is allocated on a different node


# kube-scheduler's wording, so that our message reads like its FitError.
REASONS = {
    FilterPlugin.NODE_UNKNOWN: "node(s) had no Node object",
    FilterPlugin.NODE_UNSCHEDULABLE: "node(s) were unschedulable",
    FilterPlugin.NODE_NAME: "node(s) didn't match the requested node name",
    FilterPlugin.TAINT_TOLERATION: "node(s) had untolerated taint(s)",
    FilterPlugin.NODE_AFFINITY: "node(s) didn't match Pod's node affinity/selector",
    FilterPlugin.ALLOCATED_CLAIMS: "node(s) were not the node the pod's allocated claims are on",
}


@dataclass(frozen=True, slots=True)
class Exclusion:
    plugin: FilterPlugin
    detail: str = ""  # e.g. the untolerated taint; shown next to the node's name


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Taint:
        return cls(str(obj.get("key") or ""), str(obj.get("value") or ""), str(obj.get("effect") or ""))

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = ""  # "" means Equal
    value: str = ""
    effect: str = ""  # "" matches every effect

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Toleration:
        return cls(
            str(obj.get("key") or ""),
            str(obj.get("operator") or ""),
            str(obj.get("value") or ""),
            str(obj.get("effect") or ""),
        )

    def tolerates(self, taint: Taint, comparison_operators: bool = False) -> bool:
        """k8s.io/api/core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        if self.operator == "Exists":
            return True
        if self.operator in ("Lt", "Gt") and comparison_operators:
            if not (_DECIMAL.fullmatch(self.value) and _DECIMAL.fullmatch(taint.value)):
                return False
            limit, actual = parse_int64(self.value), parse_int64(taint.value)
            if limit is None or actual is None:
                return False
            return actual < limit if self.operator == "Lt" else actual > limit
        return False


@dataclass(frozen=True, slots=True)
class PodRules:
    """A pod's placement rules, parsed once and checked against many nodes."""

    node_name: str = ""
    node_selector: Mapping[str, str] | None = None
    tolerations: tuple[Toleration, ...] = ()
    required_terms: tuple[Term, ...] | None = None  # None: no required node affinity
    problems: tuple[str, ...] = ()
    comparison_operators: bool = False  # kube-scheduler's TaintTolerationComparisonOperators gate

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], comparison_operators: bool = False) -> PodRules:
        spec = pod.get("spec") or {}
        tolerations = tuple(
            Toleration.from_obj(t) for t in spec.get("tolerations") or () if isinstance(t, Mapping)
        )
        allowed = TOLERATION_OPERATORS + (("Lt", "Gt") if comparison_operators else ())
        problems = [
            f"spec.tolerations[{i}].operator {t.operator!r} is not supported (allowed: {', '.join(allowed)}); "
            "it tolerates no taint"
            for i, t in enumerate(tolerations)
            if t.operator and t.operator not in allowed
        ]
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        terms: tuple[Term, ...] | None = None
        if isinstance(required, Mapping):
            terms, term_problems = parse_terms(required.get("nodeSelectorTerms") or ())
            problems.extend(term_problems)
        selector = spec.get("nodeSelector") or None
        return cls(
            node_name=str(spec.get("nodeName") or ""),
            node_selector={str(k): str(v) for k, v in selector.items()} if selector else None,
            tolerations=tolerations,
            required_terms=terms,
            problems=tuple(problems),
            comparison_operators=comparison_operators,
        )

    def tolerated(self, taint: Taint) -> bool:
        return any(t.tolerates(taint, self.comparison_operators) for t in self.tolerations)

    def check(self, node: Mapping[str, Any]) -> Exclusion | None:
        """The first filter (in kube-scheduler's order) that rejects `node`, or None if all pass."""
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        name = str(meta.get("name") or "")
        if spec.get("unschedulable") and not self.tolerated(Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule")):
            return Exclusion(FilterPlugin.NODE_UNSCHEDULABLE)
        if self.node_name and self.node_name != name:
            return Exclusion(FilterPlugin.NODE_NAME, f"the pod names node {self.node_name}")
        for raw in spec.get("taints") or ():
            taint = Taint.from_obj(raw)
            if taint.effect in FILTERED_EFFECTS and not self.tolerated(taint):
                return Exclusion(FilterPlugin.TAINT_TOLERATION, str(taint))
        labels: Mapping[str, str] = meta.get("labels") or {}
        if self.node_selector and any(labels.get(k) != v for k, v in self.node_selector.items()):
            return Exclusion(FilterPlugin.NODE_AFFINITY, "spec.nodeSelector")
        if self.required_terms is not None and not any(t.matches(labels, name) for t in self.required_terms):
            return Exclusion(FilterPlugin.NODE_AFFINITY, "required node affinity")
        return None


def schedulable_view(node: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What this module reads of a node (a change to anything else cannot change a verdict): its labels, taints and unschedulable flag."""
    if node is None:
        return None
    spec = node.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return (sorted(labels.items()), repr(spec.get("taints") or []), bool(spec.get("unschedulable")))


class NodeFilter:
    """The `node_ok` the Decider asks per node; remembers why each node it refused was excluded."""

    def __init__(
        self, rules: PodRules, nodes: Mapping[str, Mapping[str, Any]], pinned: ClaimPins | None = None
    ) -> None:
        self.rules = rules
        self.nodes = nodes
        self.pinned = pinned
        self.excluded: dict[str, Exclusion] = {}
        self._verdicts: dict[str, bool] = {}

    def exclusion(self, node: str) -> Exclusion | None:
        obj = self.nodes.get(node)
        if obj is None:
            return Exclusion(FilterPlugin.NODE_UNKNOWN)
        found = self.rules.check(obj)
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if found is None and self.pinned is not None and not self.pinned.allows(labels, node):
            found = Exclusion(FilterPlugin.ALLOCATED_CLAIMS, self.pinned.description)
        return found

    def __call__(self, node: str) -> bool:
        ok = self._verdicts.get(node)
        if ok is None:
            found = self.exclusion(node)
            ok = self._verdicts[node] = found is None
            if found is not None:
                self.excluded[node] = found
        return ok

    def summary(self) -> str:
        """kube-scheduler-like text about the nodes refused so far ("" when none), e.g.
        `1 node(s) had untolerated taint(s) (gpu-b: dedicated=gpu:NoSchedule)`."""
        by_plugin: dict[FilterPlugin, list[str]] = {}
        for node in sorted(self.excluded):
            found = self.excluded[node]
            by_plugin.setdefault(found.plugin, []).append(f"{node}: {found.detail}" if found.detail else node)
        parts = []
        for plugin in FilterPlugin:  # declaration order: stable text, so the pod condition is not rewritten
            shown = by_plugin.get(plugin)
            if not shown:
                continue
            more = f", +{len(shown) - NAMES_SHOWN} more" if len(shown) > NAMES_SHOWN else ""
            parts.append(f"{len(shown)} {REASONS[plugin]} ({'; '.join(shown[:NAMES_SHOWN])}{more})")
        if self.rules.problems:
            parts.append(
                "unsupported pod rules (they match no node, as in kube-scheduler): "
                + "; ".join(self.rules.problems)
            )
        return ", ".join(parts)


__all__ = [
    "REASONS",
    "ClaimPins",
    "Exclusion",
    "FilterPlugin",
    "NodeFilter",
    "PodRules",
    "Taint",
    "Toleration",
    "pinned_nodes",
    "schedulable_view",
]
