"""The faults of the matrix at flexmig's boundaries (issue 21): the API server's answers lost after it
applied a write, and a rolling update of the controller replicas (graceful stops, one after the other).

| kind | what happens |
|---|---|
| lost-responses | the proxies between the replicas and kube-apiserver (cutproxy.py) drop a quarter of the
  responses while bursts are placed; at least one claim write must have had its outcome unknown |
| rolling-update | the leader is stopped gracefully (SIGTERM), the other must lead within a lease
  duration (it releases the Lease only once its writes are done), the stopped one comes back; then
  the same for the new leader |
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.plugin_harness import scrape

from .cluster import wait_for

if TYPE_CHECKING:
    from .faults import FaultContext

CUT_RATE = 0.25
LOST_RESPONSES_MAX_S = 60.0


def _unknown_writes(ctx: FaultContext) -> float:
    """Claim writes of unknown outcome so far, over the replicas alive now."""
    total = 0.0
    for rep in ctx.cluster.replicas.values():
        if not rep.alive():
            continue
        try:
            text = scrape(rep.metrics_port, timeout_s=3)
        except OSError:
            continue
        total += sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "flexmig_claim_writes_unknown_outcome_total"
        )
    return total


def lost_responses(ctx: FaultContext) -> tuple[bool, str]:
    c = ctx.cluster
    before = _unknown_writes(ctx)
    cuts_before = c.response_cuts()
    deadline = time.monotonic() + LOST_RESPONSES_MAX_S
    c.set_cut_rate(CUT_RATE)
    try:
        while time.monotonic() < deadline and _unknown_writes(ctx) <= before:
            ctx.churn.burst(ctx.rng.randint(4, 6))
            wait_for(lambda: _unknown_writes(ctx) > before, 8)
    finally:
        c.set_cut_rate(0.0)
    unknown = _unknown_writes(ctx) - before
    return (
        unknown > 0,
        f"{c.response_cuts() - cuts_before} responses cut, {unknown:.0f} claim writes of unknown outcome",
    )


def rolling_update(ctx: FaultContext) -> tuple[bool, str]:
    c = ctx.cluster
    steps = []
    for _ in range(2):
        leader = c.leader()
        if leader is None:
            return False, f"no single leader to stop (leading: {c.leaders()}); {steps}"
        ctx.churn.burst(ctx.rng.randint(4, 8))
        other = next(n for n in c.replicas if n != leader)
        t0 = time.monotonic()
        code = c.stop_replica(leader)
        took = wait_for(lambda o=other: c.leader() == o, ctx.takeover_s)
        took_s = time.monotonic() - t0
        c.start_replica(leader)
        steps.append(
            f"{leader} stopped (exit {code}), {other} led after {took_s:.1f}s" if took else "no takeover"
        )
        # Released, not expired: the standby leads well before the 15 s lease could run out.
        if not took or took_s >= 14.0:
            return False, "; ".join(steps)
    return True, "; ".join(steps)
