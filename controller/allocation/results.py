"""The decision of one placed combination: every claim's results, config and holdings, on one node.

Kept apart from controller/allocation/decide.py (which finds the combination and its plan): the
published counters are checked once more over the chosen MIG and whole devices (kube-scheduler's rule,
a safety net), the memory stranded by mixed MIG/HAMi-core requests is summed for the caller's choice,
and each result carries the request's tolerations (upstream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from api.constants import DRIVER_NAME
from controller.allocation.decision import ClaimAllocation, ControllerReason, Decision
from controller.allocation.upstream import tolerated
from controller.allocation.wholeplan import Checker
from controller.claims.constraints import Plan, Slot
from controller.claims.resultconfig import allocation_config
from controller.shared.shares import AltKind, mig_stranded, share_result
from controller.state.ledger import Held, Ledger, ShareUse


def decision_of(
    ledger: Ledger,
    check: Checker,
    claims: Sequence[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
    slots: list[Slot],
    plan: Plan,
    mixed: set[int],
) -> Decision:
    devices = [check.device(s, plan) for s in slots]
    problem = ledger.counters_allow(
        d for s, d in zip(slots, devices, strict=True) if s.kind in (AltKind.MIG, AltKind.WHOLE)
    )
    if problem is not None:
        return Decision(reason=ControllerReason.COUNTERS_EXCEEDED, message=problem)
    node = plan.node
    assert node is not None
    stranded = isolated = 0
    for s in slots:
        if s.flat_index not in mixed:
            continue
        if s.kind is AltKind.MIG:
            isolated += 1
            stranded += mig_stranded(ledger.inventory, s.request, plan.mig[s.policy_name])
        elif s.kind is AltKind.SHARED:
            stranded += plan.shares[s.policy_name].stranded_mib
    allocations = []
    for ci, claim in enumerate(claims):
        mine = [(s, d) for s, d in zip(slots, devices, strict=True) if s.claim_index == ci]
        chosen = {s.alternative.result_name: s.alternative for s, _ in mine}
        results: list[dict[str, Any]] = []
        held: list[Held] = []
        for s, d in mine:
            if s.kind in (AltKind.MIG, AltKind.WHOLE):
                results.append(
                    tolerated(
                        {
                            "request": s.alternative.result_name,
                            "driver": DRIVER_NAME,
                            "pool": d.pool,
                            "device": d.name,
                        },
                        s.alternative,
                    )
                )
                held.append((d.pool, d.name))
                continue
            amount = plan.shares[s.policy_name].amount
            result = share_result(s.alternative.result_name, d, amount)
            results.append(tolerated(result, s.alternative))
            held.append(
                ShareUse(d.pool, d.name, result["shareID"], amount.memory_mib, amount.cores, amount.shares)
            )
        allocations.append(
            ClaimAllocation(
                claim, results, allocation_config(claim, classes, chosen), [d for _, d in mine], held
            )
        )
    return Decision(node=node, allocations=allocations, stranded_mib=stranded, isolated=isolated)
