"""The faults of the matrix at flexmig's boundaries (issue 21): the API server's answers lost after it
applied a write, and a rolling update of the controller replicas (graceful stops, one after the other).

| kind | what happens |
|---|---|
| lost-responses | the proxies between the replicas and kube-apiserver (cutproxy.py) drop half the
  responses to large requests (claim writes) while pods are placed; at least one claim write must have
  had its outcome unknown |
| rolling-update | the leader is stopped gracefully (SIGTERM), the other must lead within a lease
  duration (it releases the Lease only once its writes are done), the stopped one comes back; then
  the same for the new leader |
| webhook-flood | 160 slow clients per replica hold (and refill) the webhook's connections while pods
  are created: every pod must still be admitted |
| hostile-specs | a traversal claim name (denied, naming the field), the opt-out label on a pod (ignored:
  still gated), a 1 MiB pod (answered) |
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from api.constants import ALLOCATION_GATE
from controller.kube.rest import request
from tests.e2e.plugin_harness import scrape

from .cluster import wait_for
from .workload import PodKind

if TYPE_CHECKING:
    from .faults import FaultContext

CUT_RATE = 0.5
MIN_CUT_REQUEST_BYTES = 2000
"""A claim PUT (token + the whole claim) is above this; a watch or a GET (token + headers) below."""
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
    c.set_cut_rate(CUT_RATE, MIN_CUT_REQUEST_BYTES)
    try:
        while time.monotonic() < deadline and _unknown_writes(ctx) <= before:
            for _ in range(3):  # on any node: the burst node may be full
                ctx.churn.create(ctx.rng.choice((PodKind.HAMI, PodKind.CLAIM)))
            wait_for(lambda: _unknown_writes(ctx) > before, 8)
    finally:
        c.set_cut_rate(0.0, 0)
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


FLOOD_PER_REPLICA = 160
"""More slow connections than the webhook's cap (controller/webhook/server.py LIMITS, 128) per replica."""
FLOOD_S = 12.0


class _SlowFlood:
    """Connections to the replicas' webhook ports that never finish a TLS handshake: one byte of a
    ClientHello every 0.3 s. A connection the server closes is opened again, so the pressure stays."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.opened = 0
        self.socks: list[tuple[int, socket.socket | None]] = [
            (p, None) for p in ports for _ in range(FLOOD_PER_REPLICA)
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-flood", daemon=True)

    def __enter__(self) -> _SlowFlood:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for _port, sock in self.socks:
            if sock is not None:
                sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, (port, sock) in enumerate(self.socks):
                try:
                    if sock is None:
                        sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                        self.opened += 1
                    sock.send(b"\x16")
                except OSError:
                    if sock is not None:
                        sock.close()
                    sock = None
                self.socks[i] = (port, sock)
            self._stop.wait(0.3)


def webhook_flood(ctx: FaultContext) -> tuple[bool, str]:
    """Slow clients hold and refill every webhook connection while pods are created: each pod must
    still be answered (admitted), none refused for want of an answer."""
    c = ctx.cluster
    ports = [r.webhook_port for r in c.replicas.values() if r.alive()]
    admitted = refused = 0
    with _SlowFlood(ports) as flood:
        time.sleep(2)  # the flood holds its connections before the first pod
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            before = ctx.churn.stats.refused
            name = ctx.churn.create(ctx.rng.choice((PodKind.HAMI, PodKind.CLAIM, PodKind.TEMPLATE)))
            refused += ctx.churn.stats.refused - before
            admitted += name is not None
            time.sleep(1.0)
    detail = f"{flood.opened} slow connections opened on {len(ports)} replicas; {admitted} pods admitted, {refused} refused"
    return admitted >= 3 and refused == 0 and flood.opened >= FLOOD_PER_REPLICA, detail


def _create(ctx: FaultContext, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """POST a pod; (the stored pod, "") or (None, what the API server said)."""
    try:
        return request(ctx.cluster.api, "POST", f"/api/v1/namespaces/{ctx.churn.ns}/pods", body), ""
    except ApiException as exc:
        return None, str(exc.body or exc.reason)[:300]


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == ALLOCATION_GATE for g in pod["spec"].get("schedulingGates") or [])


def hostile_specs(ctx: FaultContext) -> tuple[bool, str]:
    """Pod specs an untrusted author may write: a traversal claim name (denied naming the field), the
    old opt-out label on the pod itself (ignored: still rewritten and gated), a pod near the API
    server's size limit (answered, not a webhook failure)."""
    churn, results, ok = ctx.churn, [], True
    traversal = churn.hami_pod(f"hostile-path-{ctx.rng.randrange(10**6)}", 1, 4000, None)
    traversal["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "../../../api/v1/namespaces/kube-system/secrets/x"}
    ]
    pod, said = _create(ctx, traversal)
    named = "resourceClaimTemplateName" in said and "not a valid name" in said
    ok &= pod is None and named
    results.append(f"traversal {'denied naming the field' if named else f'NOT denied as expected: {said!r}'}")
    optout = churn.hami_pod(f"hostile-optout-{ctx.rng.randrange(10**6)}", 1, 4000, "mig")
    optout["metadata"]["labels"]["gpu.flexmig.dev/webhook"] = "disabled"
    pod, said = _create(ctx, optout)
    still_shimmed = pod is not None and _gated(pod)
    ok &= still_shimmed
    results.append(f"opt-out label {'ignored (gated)' if still_shimmed else f'BYPASSED the shim: {said!r}'}")
    big = churn.hami_pod(f"hostile-big-{ctx.rng.randrange(10**6)}", 1, 4000, "mig")
    big["metadata"]["annotations"] = {"example.com/blob": "x" * (1024 * 1024)}
    pod, said = _create(ctx, big)
    answered = pod is not None or ("failed calling webhook" not in said and "deadline" not in said)
    ok &= answered
    results.append(f"1 MiB pod {'answered' if answered else f'not answered: {said!r}'}")
    for made in (optout, big):
        with contextlib.suppress(ApiException):
            request(
                ctx.cluster.api, "DELETE", f"/api/v1/namespaces/{churn.ns}/pods/{made['metadata']['name']}"
            )
    return ok, "; ".join(results)
