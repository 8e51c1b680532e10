"""Node selector terms, as kube-scheduler and the API server read them (apimachinery labels and fields).

Two things select nodes with `nodeSelectorTerms`: a pod's required node affinity
(controller/allocation/nodefilter.py `PodRules`) and an allocated claim's `status.allocation.nodeSelector`
(`pinned_nodes` here: the node the pod's other claims fix). Terms are ORed, a term's requirements ANDed.
Parsing follows `nodeSelectorRequirementsAsSelector` / `nodeSelectorRequirementsAsFieldSelector`
(Kubernetes v1.37, component-helpers/scheduling/corev1): a term that does not parse matches no node and
is reported as a problem; an empty term selects nothing and is dropped. Label key/value syntax is not
re-validated: the API server rejects objects that break it. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
_INT64 = re.compile(r"[+-]?[0-9]+")  # Go's strconv.ParseInt(s, 10, 64) syntax (no spaces, no "_")


def parse_int64(text: str) -> int | None:
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


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
        have = parse_int64(labels[self.key]) if present else None
        want = parse_int64(self.values[0])
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
    if req.operator in ("Gt", "Lt") and (n != 1 or parse_int64(req.values[0]) is None):
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


def parse_terms(raw: Sequence[Any]) -> tuple[tuple[Term, ...], tuple[str, ...]]:
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
        terms, _ = parse_terms(selector.get("nodeSelectorTerms") or ())
        selectors.append(terms)
        parts.append(_describe(terms) if terms else "on no node")
    if not selectors:
        return None
    return ClaimPins(tuple(selectors), "; ".join(sorted(set(parts))))
