"""Priority preemption in the controller (controller/allocation/preempt.py): a gated pod that fits
nowhere evicts lower-priority pods on one node, chosen on the real MIG layout, and the freed devices
are held for it (controller/allocation/nominate.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from ctl_helpers import CLASS, claim, mem
from fake_apiserver import Harness
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from api.constants import DRIVER_NAME

NODE = "n1"


class Evictions:
    """The Eviction API in front of the fake server: a refused pod answers 429 (its PDB), any other
    gets a deletionTimestamp, as the API server does before the kubelet ends it."""

    def __init__(self, h: Harness, refuse: Iterable[str] = ()) -> None:
        self.h = h
        self.refuse = set(refuse)
        self.sent: list[str] = []
        self.inner = h.writer._send
        h.writer._send = self.send

    def send(self, api: Any, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        if not (method == "POST" and path.endswith("/eviction")):
            return self.inner(api, method, path, body, **kw)
        name = path.split("/")[-2]
        self.sent.append(name)
        if name in self.refuse:
            raise ApiException(
                status=429, reason="Cannot evict pod as it would violate the pod's disruption budget."
            )
        pod = copy.deepcopy(self.h.api.objects["pods"][f"ns/{name}"])
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.h.api.put_object("pods", pod)
        return {"kind": "Status", "status": "Success"}

    def terminate(self, name: str) -> None:
        """The kubelet ended the pod; the claim's allocation is cleared (kube-controller-manager)."""
        self.h.api.delete_object("pods", f"ns/{name}")
        c = copy.deepcopy(self.h.api.objects["resourceclaims"][f"ns/c-{name}"])
        c["status"] = {}
        self.h.api.put_object("resourceclaims", c)


def running(h: Harness, name: str, device: str, prio: int) -> None:
    """A pod bound to NODE and running, whose claim (allocated by someone) holds `device`."""
    body = claim(f"c-{name}", mem(1))
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": device}]
            }
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{name}"}],
    }
    h.add_claim(body)
    h.api.put_object(
        "pods",
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"pod-{name}"},
            "spec": {
                "nodeName": NODE,
                "priority": prio,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c-{name}"}],
                "containers": [{"name": "main"}],
            },
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"},
        },
    )


def waiting(h: Harness, name: str, mib: int, prio: int, **spec: Any) -> None:
    h.add_claim(claim(f"c-{name}", mem(mib)))
    pod = h.add_pod(name, [f"c-{name}"])
    pod = copy.deepcopy(pod)
    pod["spec"].update({"priority": prio, **spec})
    h.api.put_object("pods", pod)


def full_a100(h: Harness, prios: dict[int, int]) -> None:
    """Seven 1g.5gb pods, one per memory slice of the A100-40GB; `prios[start]` their priority."""
    for start in range(7):
        running(h, f"low{start}", f"gpu-0-mig-1g5gb-19-{start}", prios.get(start, 0))


def events(h: Harness, reason: str) -> list[dict[str, Any]]:
    return [e for e in h.api.events if e["reason"] == reason]


def test_a_high_priority_pod_evicts_the_fewest_lower_pods_that_make_a_legal_placement() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    # Slices 1 and 2 hold the cheapest pods, but 1+2 is no 2g.10gb placement (starts 0, 2, 4): the
    # cheapest legal pair takes one of them and a priority-5 neighbour.
    full_a100(h, {0: 5, 1: 0, 2: 0, 3: 5, 4: 5, 5: 5, 6: 5})
    waiting(h, "urgent", 9000, 100)
    h.deliver()
    h.cycle()
    assert len(ev.sent) == 2 and set(ev.sent) != {"low1", "low2"}
    assert set(ev.sent) in ({"low0", "low1"}, {"low2", "low3"})
    assert h.gated("urgent")
    (preempting,) = events(h, "Preempting")
    assert preempting["involvedObject"]["name"] == "urgent" and NODE in preempting["message"]
    preempted = events(h, "Preempted")
    assert sorted(e["involvedObject"]["name"] for e in preempted) == sorted(ev.sent)
    assert all("ns/urgent" in e["message"] for e in preempted)
    cond = next(
        c for c in h.api.objects["pods"]["ns/urgent"]["status"]["conditions"] if c["reason"] == "Preempting"
    )
    assert "evicted" in cond["message"]
    # The victims end; the freed slices go to the preemptor.
    for name in ev.sent:
        ev.terminate(name)
    h.deliver()
    h.cycle()
    assert not h.gated("urgent")
    (result,) = h.api.objects["resourceclaims"]["ns/c-urgent"]["status"]["allocation"]["devices"]["results"]
    assert "2g10gb" in result["device"]
    assert h.api.audit() == []


def test_the_freed_devices_are_held_for_the_preemptor_not_taken_by_an_older_pod() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "patient", 9000, 0)  # same size, older, no priority: first in line without a hold
    h.deliver()
    h.cycle()
    waiting(h, "urgent", 9000, 100)
    h.deliver()
    h.cycle()
    assert len(ev.sent) == 2
    for name in ev.sent:
        ev.terminate(name)
    h.deliver()
    h.cycle()
    assert not h.gated("urgent")
    assert h.gated("patient")


def test_a_pod_whose_preemption_policy_is_never_waits_and_evicts_nothing() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "polite", 9000, 100, preemptionPolicy="Never")
    h.deliver()
    h.cycle()
    assert ev.sent == [] and h.gated("polite") and not events(h, "Preempting")


def test_pods_of_equal_priority_are_never_evicted() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, dict.fromkeys(range(7), 100))
    waiting(h, "peer", 9000, 100)
    h.deliver()
    h.cycle()
    assert ev.sent == [] and h.gated("peer")


def test_a_disruption_budget_refusal_moves_on_to_the_next_set() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    # One 1g.5gb request: every pod alone is a set; the cheapest (priority 0 at slice 3) is guarded.
    full_a100(h, {0: 5, 1: 5, 2: 5, 3: 0, 4: 5, 5: 5, 6: 5})
    ev = Evictions(h, refuse={"low3"})
    waiting(h, "urgent", 4000, 100)
    h.deliver()
    h.cycle()
    assert ev.sent[0] == "low3" and len(ev.sent) == 2
    assert not h.api.objects["pods"]["ns/low3"]["metadata"].get("deletionTimestamp")
    assert h.api.objects["pods"][f"ns/{ev.sent[1]}"]["metadata"].get("deletionTimestamp")
    assert len(h.ctl.preemption.nominations.entries) == 1


def test_with_preemption_off_nothing_is_evicted() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    h.ctl.preemption.enabled = False
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "urgent", 9000, 100)
    h.deliver()
    h.cycle()
    assert ev.sent == [] and h.gated("urgent")


def test_a_request_no_device_matches_evicts_nothing() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "huge", 100000, 100)
    h.deliver()
    h.cycle()
    assert ev.sent == [] and h.gated("huge")


def test_a_node_the_pod_may_not_use_is_never_preempted_on() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "urgent", 9000, 100, nodeSelector={"nowhere": "x"})
    h.deliver()
    h.cycle()
    assert ev.sent == [] and h.ctl.preemption.nominations.entries == {}


def test_when_the_hold_times_out_the_freed_devices_go_back_to_everyone() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    h.ctl.preemption.nominations.hold_s = 0.0
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "patient", 9000, 0)
    h.deliver()
    h.cycle()
    waiting(h, "urgent", 9000, 100)
    h.deliver()
    h.cycle()
    h.api.delete_object("pods", "ns/urgent")  # the preemptor gives up before its victims end
    for name in ev.sent:
        ev.terminate(name)
    h.deliver()
    h.cycle()
    assert h.ctl.preemption.nominations.entries == {}
    assert not h.gated("patient")
    assert CLASS


def test_two_preemptors_in_one_step_never_count_on_the_same_victims() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "first", 9000, 100)
    waiting(h, "second", 9000, 100)
    h.deliver()
    h.cycle()
    assert len(ev.sent) == len(set(ev.sent)) == 4
    noms = h.ctl.preemption.nominations.entries
    assert set(noms) == {"ns/first", "ns/second"}
    assert not noms["ns/first"].victims & noms["ns/second"].victims
    for name in ev.sent:
        ev.terminate(name)
    h.deliver()
    h.cycle()
    assert not h.gated("first") and not h.gated("second")
    assert h.api.audit() == []


def test_an_eviction_whose_answer_was_lost_is_never_sent_again() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    ev = Evictions(h)
    full_a100(h, {})
    lost = ReadTimeoutError(None, "/eviction", "read timed out")  # type: ignore[arg-type]
    inner = ev.send

    def send(api: Any, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        answer = inner(api, method, path, body, **kw)
        if path.endswith("/eviction") and len(ev.sent) == 1:
            raise lost  # applied, then the answer is lost
        return answer

    h.writer._send = send
    waiting(h, "urgent", 9000, 100)
    h.deliver()
    h.cycle()
    first = list(ev.sent)
    assert len(first) == 2 and len(h.ctl.preemption.nominations.entries) == 1
    for _ in range(3):
        h.deliver()
        h.cycle()
    assert ev.sent == first  # the lost one was taken as evicted: not sent again, nothing more evicted
    assert h.ctl.preemption.evictions.labels("unknown")._value.get() == 1
