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
toleration operator tolerates nothing); `PodRules.problems` names them so the caller can say so. Label
key/value syntax is not re-validated: the API server rejects pods that break it.

Objects are the camelCase JSON dicts the watch cache holds. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # kube-scheduler's DoNotScheduleTaintsFilterFunc
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
TOLERATION_OPERATORS = ("Equal", "Exists")  # "" means Equal; Lt/Gt need an alpha gate (off by default)
_INT64 = re.compile(r"[+-]?[0-9]+")  # Go's strconv.ParseInt(s, 10, 64) syntax (no spaces, no "_")
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


def _parse_int64(text: str) -> int | None:
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


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
            limit, actual = _parse_int64(self.value), _parse_int64(taint.value)
            if limit is None or actual is None:
                return False
            return actual < limit if self.operator == "Lt" else actual > limit
        return False


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions (on labels) or matchFields (on metadata.name) entry."""

    key: str
    operator: str
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """apimachinery labels.Requirement.Matches; only called once `problem` is None."""
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        # Gt / Lt: a label that is absent or not an integer matches neither.
        have = _parse_int64(labels[self.key]) if present else None
        want = _parse_int64(self.values[0])
        if have is None or want is None:
            return False
        return have > want if self.operator == "Gt" else have < want


def _label_problem(req: Requirement, where: str) -> str | None:
    """What kube-scheduler's parser (nodeSelectorRequirementsAsSelector) refuses, or None."""
    if req.operator not in LABEL_OPERATORS:
        return f"{where}.operator {req.operator!r} is not supported (allowed: {', '.join(LABEL_OPERATORS)})"
    n = len(req.values)
    if req.operator in ("In", "NotIn") and n == 0:
        return f"{where}.values must not be empty for {req.operator}"
    if req.operator in ("Exists", "DoesNotExist") and n:
        return f"{where}.values must be empty for {req.operator}"
    if req.operator in ("Gt", "Lt") and (n != 1 or _parse_int64(req.values[0]) is None):
        return f"{where}.values must be exactly one integer for {req.operator}, got {list(req.values)}"
    return None


def _field_problem(req: Requirement, where: str) -> str | None:
    """What nodeSelectorRequirementsAsFieldSelector refuses, or None."""
    if req.operator not in FIELD_OPERATORS:
        return f"{where}.operator {req.operator!r} is not supported (allowed: {', '.join(FIELD_OPERATORS)})"
    if len(req.values) != 1:
        return f"{where}.values must have exactly one element for {req.operator}, got {list(req.values)}"
    return None


@dataclass(frozen=True, slots=True)
class Term:
    """One nodeSelectorTerm: its expressions and fields are ANDed; a term that did not parse is None."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        # Field selectors see only metadata.name; another key reads as "" (fields.Set.Get).
        node_fields = {"metadata.name": name}
        return all(r.matches(labels) for r in self.expressions) and all(
            (node_fields.get(r.key, "") == r.values[0]) == (r.operator == "In") for r in self.fields
        )


def _requirements(items: object) -> tuple[Requirement, ...]:
    if not isinstance(items, Sequence):
        return ()
    return tuple(
        Requirement(
            str(i.get("key") or ""), str(i.get("operator") or ""), tuple(map(str, i.get("values") or ()))
        )
        for i in items
        if isinstance(i, Mapping)
    )


def _parse_terms(raw: Sequence[Any]) -> tuple[tuple[Term, ...], tuple[str, ...]]:
    """Terms that parse (empty ones select nothing and are dropped, as in NewLazyErrorNodeSelector)."""
    terms: list[Term] = []
    problems: list[str] = []
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    for i, term in enumerate(raw):
        if not isinstance(term, Mapping):
            continue
        expressions = _requirements(term.get("matchExpressions"))
        fields = _requirements(term.get("matchFields"))
        found: list[str] = []
        for kind, reqs, check in (
            ("matchExpressions", expressions, _label_problem),
            ("matchFields", fields, _field_problem),
        ):
            found += [
                p for j, r in enumerate(reqs) if (p := check(r, f"{base}[{i}].{kind}[{j}]")) is not None
            ]
        if found:
            problems.extend(found)  # this term matches no node; the others still may
        elif expressions or fields:
            terms.append(Term(expressions, fields))
    return tuple(terms), tuple(problems)


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
            terms, term_problems = _parse_terms(required.get("nodeSelectorTerms") or ())
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


@dataclass(frozen=True, slots=True)
class ClaimPins:
    """The node selectors of the pod's already-allocated claims: a node must match every one of them
    (each selector's terms ORed, as kube-scheduler evaluates an allocation's nodeSelector)."""

    selectors: tuple[tuple[Term, ...], ...]
    description: str  # for messages, e.g. "on gpu-node-3"

    def allows(self, labels: Mapping[str, str], name: str) -> bool:
        return all(any(t.matches(labels, name) for t in terms) for terms in self.selectors)


def _describe(terms: Sequence[Term]) -> str:
    names = sorted(
        {
            v
            for t in terms
            for r in t.fields
            if r.key == "metadata.name" and r.operator == "In"
            for v in r.values
        }
    )
    if names and all(not t.expressions for t in terms):
        return "on " + ", ".join(names)
    return "on nodes their selectors choose"


def pinned_nodes(allocated_claims: Iterable[Mapping[str, Any]]) -> ClaimPins | None:
    """What the pod's already-allocated claims leave of the cluster; None when none restricts it.

    A selector that does not parse selects no node (the pod cannot use that claim anywhere)."""
    selectors: list[tuple[Term, ...]] = []
    parts: list[str] = []
    for claim in allocated_claims:
        selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        if not selector:
            continue  # allocated without a node selector: available on every node
        terms, _ = _parse_terms(selector.get("nodeSelectorTerms") or ())
        selectors.append(terms)
        parts.append(_describe(terms) if terms else "on no node")
    if not selectors:
        return None
    return ClaimPins(tuple(selectors), "; ".join(sorted(set(parts))))


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
