"""Moving movable pods to make room (controller/allocation/moves.py): a pod that fits nowhere gets a
whole GPU by moving a pod that opted in to another node; its destination is reserved before the
eviction, and its replacement (same controller owner, same claim templates) is placed there."""

from __future__ import annotations

import copy
import datetime as dt
import time
from typing import Any

from ctl_helpers import claim, mem
from fake_apiserver import Harness
from test_ctl_preempt import Evictions, events, waiting

from api.constants import ALLOCATION_GATE, ANNOTATION_EXPECTED_DURATION, ANNOTATION_MOVABLE, DRIVER_NAME
from controller.allocation.moves import Moves, MoveSettings
from controller.allocation.preempt import Preemption

NODES = {"n1": ("A100-40GB", 1), "n2": ("A100-40GB", 1)}
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}


def now_iso(ago_s: float = 0.0) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def harness(**settings: Any) -> tuple[Harness, Moves]:
    h = Harness(NODES)
    moves = Moves(MoveSettings(**{"enabled": True, **settings}))
    h.ctl.preemption = Preemption(moves=moves)
    return h, moves


def running(
    h: Harness,
    name: str,
    node: str,
    annotations: dict[str, str] | None = None,
    start: int = 0,
    age_s: float = 60,
) -> None:
    """A ReplicaSet's pod running on slice `start` of `node`'s GPU, its claim made from a template."""
    body = claim(f"c-{name}", mem(1))
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER_NAME,
                        "pool": node,
                        "device": f"gpu-0-mig-1g5gb-19-{start}",
                    }
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{name}"}],
    }
    h.add_claim(body)
    h.api.put_object(
        "pods",
        {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": f"pod-{name}",
                "ownerReferences": [OWNER],
                "annotations": annotations or {},
            },
            "spec": {
                "nodeName": node,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
                "containers": [{"name": "main"}],
            },
            "status": {
                "phase": "Running",
                "startTime": now_iso(age_s),
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"c-{name}"}],
            },
        },
    )


def replacement(h: Harness, name: str) -> None:
    """What the ReplicaSet creates after the eviction: a gated pod with a fresh claim from the template."""
    h.add_claim(claim(f"c-{name}", mem(1)))
    h.api.put_object(
        "pods",
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}", "ownerReferences": [OWNER]},
            "spec": {
                "schedulingGates": [{"name": ALLOCATION_GATE}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
                "containers": [{"name": "main"}],
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"c-{name}"}]},
        },
    )


def device(h: Harness, claim_name: str) -> tuple[str, str]:
    (result,) = h.api.objects["resourceclaims"][f"ns/{claim_name}"]["status"]["allocation"]["devices"][
        "results"
    ]
    return str(result["pool"]), str(result["device"])


def movable_setup(h: Harness, mover: dict[str, str] | None = None) -> None:
    """n1's GPU holds the movable pod, n2's a pod that did not opt in; a whole-GPU pod then waits."""
    running(h, "mover", "n1", {ANNOTATION_MOVABLE: "true"} if mover is None else mover)
    running(h, "stay", "n2")
    waiting(h, "big", 25000, 0)  # only a 7g.40gb: a whole GPU
    h.deliver()


def holders(h: Harness, prefix: str) -> list[str]:
    return [u for u in h.ctl.ledger.claims if u.startswith(prefix)]


def test_a_big_pod_gets_a_gpu_by_moving_a_movable_pod_whose_replacement_takes_the_reserved_room() -> None:
    h, moves = harness()
    ev = Evictions(h)
    reserved_at_eviction: list[list[str]] = []
    send = ev.send

    def watched(api: Any, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        if path.endswith("/eviction"):
            reserved_at_eviction.append(holders(h, "moving/") + holders(h, "making-room/"))
        return send(api, method, path, body, **kw)

    h.writer._send = watched
    movable_setup(h)
    h.cycle()
    assert ev.sent == ["mover"] and h.gated("big")
    # Both reservations were in the ledger before the eviction went out.
    assert reserved_at_eviction == [["moving/pod-mover", "making-room/pod-big"]]
    assert h.ctl.ledger.conflicts == {}  # the reservations never contradict the placement rules
    (dest,) = moves.active.values()
    assert dest.dest.node == "n2"
    assert [e["involvedObject"]["name"] for e in events(h, "Moved")] == ["mover"]
    assert [e["involvedObject"]["name"] for e in events(h, "MakingRoom")] == ["big"]
    # The pod ends, its ReplicaSet recreates it: the big pod takes n1's GPU, the replacement n2.
    ev.terminate("mover")
    replacement(h, "mover-2")
    h.deliver()
    h.cycle()
    assert not h.gated("big") and not h.gated("mover-2")
    assert device(h, "c-big") == ("n1", "gpu-0-mig-7g40gb-0-0")
    assert device(h, "c-mover-2")[0] == "n2"
    assert moves.active == {} and holders(h, "moving/") == []
    assert moves.results.labels("completed")._value.get() == 1
    assert "pod-mover-2" in moves.moved  # never moved again within the window
    assert h.api.audit() == []


def test_a_pod_that_did_not_opt_in_is_never_evicted() -> None:
    h, moves = harness()
    ev = Evictions(h)
    movable_setup(h, mover={})
    h.cycle()
    assert ev.sent == [] and h.gated("big") and moves.active == {}


def test_a_namespace_default_makes_pods_movable_and_the_annotation_false_opts_out() -> None:
    h, _ = harness(namespaces=frozenset({"ns"}))
    ev = Evictions(h)
    # "stay" has no annotation: movable by its namespace's default; "mover" opted out.
    movable_setup(h, mover={ANNOTATION_MOVABLE: "false"})
    h.cycle()
    assert ev.sent == ["stay"]
    h, _ = harness(namespaces=frozenset({"other"}))
    ev = Evictions(h)
    movable_setup(h, mover={})
    h.cycle()
    assert ev.sent == []  # neither opted in, nor in a movable namespace


def test_with_moves_off_nothing_is_evicted() -> None:
    h, _ = harness(enabled=False)
    ev = Evictions(h)
    movable_setup(h)
    h.cycle()
    assert ev.sent == [] and h.gated("big")


def test_a_pod_expected_to_end_soon_is_not_moved_but_a_long_one_is() -> None:
    h, _ = harness()
    ev = Evictions(h)
    movable_setup(h, mover={ANNOTATION_MOVABLE: "true", ANNOTATION_EXPECTED_DURATION: "5m"})
    h.cycle()
    assert ev.sent == []  # started a minute ago, ends in four: waiting costs less than a restart
    h, _ = harness()
    ev = Evictions(h)
    movable_setup(h, mover={ANNOTATION_MOVABLE: "true", ANNOTATION_EXPECTED_DURATION: "2h"})
    h.cycle()
    assert ev.sent == ["mover"]


def test_a_pod_moved_within_the_window_or_over_the_rate_limit_is_not_moved() -> None:
    h, moves = harness()
    ev = Evictions(h)
    moves.moved["pod-mover"] = time.monotonic()
    movable_setup(h)
    h.cycle()
    assert ev.sent == []
    h, moves = harness(per_node=1)
    ev = Evictions(h)
    moves.recent.append((time.monotonic(), "n1"))
    movable_setup(h)
    h.cycle()
    assert ev.sent == []
    h, moves = harness(per_cluster=1)
    ev = Evictions(h)
    moves.recent.append((time.monotonic(), "elsewhere"))
    movable_setup(h)
    h.cycle()
    assert ev.sent == []


def test_a_disruption_budget_refusal_releases_every_reservation_and_is_reported() -> None:
    h, moves = harness()
    ev = Evictions(h, refuse={"mover"})
    movable_setup(h)
    h.cycle()
    assert ev.sent == ["mover"] and h.gated("big")
    assert moves.active == {} and holders(h, "moving/") == [] and holders(h, "making-room/") == []
    assert [e["involvedObject"]["name"] for e in events(h, "MoveRefused")] == ["big"]
    assert moves.results.labels("refused")._value.get() == 1
    assert "pod-mover" in moves.refused


def test_a_move_whose_pod_is_not_recreated_releases_its_reservation_after_the_timeout() -> None:
    h, moves = harness(timeout_s=0.0)
    ev = Evictions(h)
    movable_setup(h)
    h.cycle()
    assert holders(h, "moving/") == ["moving/pod-mover"]
    ev.terminate("mover")
    h.deliver()
    h.cycle()  # the pod is gone: the timeout starts
    time.sleep(0.01)
    h.deliver()
    h.cycle()
    assert moves.active == {} and holders(h, "moving/") == []
    assert moves.results.labels("not_recreated")._value.get() == 1
    assert [e["involvedObject"]["name"] for e in events(h, "MoveGivenUp")] == ["big"]
    assert not h.gated("big")  # its own hold was never in the way
    # A late replacement is an ordinary pod now, placed wherever it fits.
    replacement(h, "mover-2")
    h.deliver()
    h.cycle()
    assert not h.gated("mover-2") and h.api.audit() == []


def test_an_unrelated_pod_is_not_taken_for_the_replacement() -> None:
    h, moves = harness()
    Evictions(h)
    movable_setup(h)
    h.cycle()
    other = copy.deepcopy(OWNER)
    other["uid"] = "rs-other"
    h.add_claim(claim("c-stranger", mem(1)))
    h.api.put_object(
        "pods",
        {
            "metadata": {
                "name": "stranger",
                "namespace": "ns",
                "uid": "pod-stranger",
                "ownerReferences": [other],
            },
            "spec": {
                "schedulingGates": [{"name": ALLOCATION_GATE}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "small"}],
                "containers": [{"name": "main"}],
            },
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c-stranger"}]},
        },
    )
    h.deliver()
    h.cycle()
    (move,) = moves.active.values()
    assert move.replacement is None
    assert holders(h, "moving/") == ["moving/pod-mover"]  # the stranger did not take the reservation


def test_only_pods_whose_going_makes_a_legal_placement_are_moved() -> None:
    h, _ = harness(max_moves=2)  # the default is one move per plan
    ev = Evictions(h)
    yes = {ANNOTATION_MOVABLE: "true"}
    # n1 full of 1g.5gb pods; 1, 2 and 3 are movable, 1 the youngest. A 2g.10gb starts at 0, 2 or 4:
    # 1+2 is no placement, so 2+3 move although 1 would lose the least work.
    for start in range(7):
        running(h, f"p{start}", "n1", yes if start in (1, 2, 3) else {}, start=start, age_s=600 - start)
    for start in (0, 2, 4, 6):  # n2: room for 1g.5gb pods (1, 3, 5), none for a 2g.10gb
        running(h, f"q{start}", "n2", {}, start=start)
    waiting(h, "mid", 9000, 0)
    h.deliver()
    h.cycle()
    assert sorted(ev.sent) == ["p2", "p3"]
