"""Small rules of kube-scheduler's allocator the decision follows (controller/allocation/decide.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

from controller.claims.constraints import Problem
from controller.claims.fields import ALLOCATION_RESULTS_MAX
from controller.claims.requests import Alternative, ClaimRequest
from controller.shared.shares import AltKind
from controller.shim.templates import LABEL_SHIM_TEMPLATE, shape_from_name


def shim_claim(claim: Mapping[str, Any], shim_uids: Set[str] = frozenset()) -> bool:
    """A claim generated from a shim template: labelled by it (controller/shim/templates.py), or in
    `shim_uids` (`shim_generated`: templates written before they labelled their claims)."""
    if LABEL_SHIM_TEMPLATE in ((claim.get("metadata") or {}).get("labels") or {}):
        return True
    return str((claim.get("metadata") or {}).get("uid")) in shim_uids


def shim_generated(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """The uids of `pod`'s claims (by pod claim entry) made from a template with a shim name.

    Shim templates written before the shim labelled the claims they generate (the template spec is
    immutable, so they are never relabelled) make unlabelled claims; the pod entry's template name
    still says the shim wrote it: a shim name stands for the shim's fixed body (the webhook treats
    it so too, controller/webhook/flexmigclaims.py)."""
    out = set()
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        claim = claims.get(str(entry.get("name")))
        if claim is not None and shape_from_name(entry.get("resourceClaimTemplateName")) is not None:
            out.add(str((claim.get("metadata") or {}).get("uid")))
    return frozenset(out)


def tolerated(result: dict[str, Any], alt: Alternative) -> dict[str, Any]:
    """Upstream copies all of the request's tolerations into each of its results."""
    if alt.tolerations:
        result["tolerations"] = [dict(t) for t in alt.tolerations]
    return result


def explain(problem: Problem) -> str:
    """Shares of one claim never share a GPU: a matchAttribute that only one GPU can satisfy fails by
    that rule, not by the user's constraint, so say so."""
    shares = [s for s in problem.covered if s.kind is AltKind.SHARED]
    if not problem.attribute or len({s.claim_index for s in shares}) != 1 or len(shares) < 2:
        return problem.message
    n = len(shares)
    return (
        f"{problem.message}: the {n} shares of one claim go to {n} different GPUs (one share per GPU "
        f"per claim), so {n} GPUs of one node with one value of {problem.attribute} are needed; ask for "
        "one share with more capacity, or use a MIG or whole-GPU class"
    )


def result_limit(picked: Sequence[tuple[ClaimRequest, Alternative]]) -> str | None:
    """A claim holds at most 32 results (the API's AllocationResultsMaxSize), for the alternatives
    chosen together: checked for each claim as a whole before anything is written (the write would
    otherwise get a 422 and the pod no word of why)."""
    per_claim: dict[str, int] = {}
    for req, alt in picked:
        per_claim[req.claim] = per_claim.get(req.claim, 0) + alt.count
    for claim, total in per_claim.items():
        if total > ALLOCATION_RESULTS_MAX:
            return (
                f"claim {claim}: these alternatives need {total} results; a claim holds at most "
                f"{ALLOCATION_RESULTS_MAX} (AllocationResultsMaxSize): ask for fewer devices or split "
                "the requests over several claims"
            )
    return None


def one_node(message: str, nodes: Iterable[str], node_ok: Callable[[str], bool] | None) -> str:
    """ "No single node takes them all" misleads when only one node may take them: say that the
    requests fit one by one, but not together."""
    eligible = [n for n in nodes if node_ok is None or node_ok(n)]
    if len(eligible) != 1:
        return message
    return (
        f"each request fits on node {eligible[0]} alone, but not all of them together (not enough "
        "free room for every device of the pod at once)"
    )
