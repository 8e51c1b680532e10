"""The allocation loop with its API writes in memory: all or nothing when a write fails half-way, and
which node changes make pending pods be decided again."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from ctl_helpers import CLASS, CLASSES, claim, node_slices
from kubernetes.client.exceptions import ApiException

from api.constants import ALLOCATION_GATE
from controller.allocation.loop import Controller
from controller.kube.store import Event
from controller.kube.watchcache import WatchCache
from controller.kube.writer import FINALIZER, Writer

Obj = dict[str, Any]


class FlakyWriter(Writer):
    """Claims kept in memory; the `fail_on`-th allocation write raises `error`."""

    def __init__(self, claims: Mapping[str, Obj], error: BaseException, fail_on: int = 2) -> None:
        super().__init__(api_client=None)
        self.claims = {k: copy.deepcopy(v) for k, v in claims.items()}
        self.error = error
        self.fail_on = fail_on
        self.writes = 0
        self.released = False

    def _put(self, claim: Mapping[str, Any]) -> Obj:
        body = copy.deepcopy(dict(claim))
        self.claims[body["metadata"]["name"]] = body
        return body

    def protect_claim(self, claim: Mapping[str, Any], pod_uid: str) -> Obj:
        body = copy.deepcopy(dict(claim))
        body["metadata"].setdefault("finalizers", []).append(FINALIZER)
        return self._put(body)

    def write_allocation(
        self,
        claim: Mapping[str, Any],
        allocation: Mapping[str, Any] | None,
        reserve_for: Mapping[str, Any] | None = None,
    ) -> Obj:
        if allocation is not None:
            self.writes += 1
            if self.writes == self.fail_on:
                raise self.error
        body = copy.deepcopy(dict(claim))
        body.setdefault("status", {})["allocation"] = allocation
        if allocation is None:
            body["status"].pop("allocation")
        return self._put(body)

    def unprotect_claim(self, claim: Mapping[str, Any]) -> Obj | None:
        body = copy.deepcopy(dict(claim))
        body["metadata"]["finalizers"] = [
            f for f in body["metadata"].get("finalizers") or [] if f != FINALIZER
        ]
        return self._put(body)

    def release_pod(self, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> Obj:
        self.released = True
        return dict(pod)

    def set_condition(self, pod: Mapping[str, Any], status: str, reason: str, message: str) -> None:
        pass  # the pod's condition is not what this test is about

    def event(self, obj: Mapping[str, Any], kind: str, event_type: str, reason: str, message: str) -> None:
        pass


def _controller(writer: Writer, claims: list[Obj]) -> Controller:
    cache = WatchCache(
        {
            name: lambda **_: None
            for name in ("resourceslices", "resourceclaims", "deviceclasses", "pods", "nodes")
        }
    )
    pod: Obj = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "schedulingGates": [{"name": ALLOCATION_GATE}],
            "resourceClaims": [
                {"name": c["metadata"]["name"], "resourceClaimName": c["metadata"]["name"]} for c in claims
            ],
            "containers": [{"name": "main"}],
        },
    }
    ctl = Controller(cache, writer, catch_up=False)
    ctl.apply(
        [
            Event("nodes", "REPLACE", items=({"metadata": {"name": "n1"}, "spec": {}},)),
            Event("deviceclasses", "REPLACE", items=tuple(CLASSES.values())),
            Event("resourceslices", "REPLACE", items=tuple(node_slices("n1", "A100-40GB", 1))),
            Event("resourceclaims", "REPLACE", items=tuple(claims)),
            Event("pods", "REPLACE", items=(pod,)),
        ]
    )
    return ctl


@pytest.mark.parametrize("error", [ApiException(status=422), ApiException(status=403)])
def test_a_refused_second_write_undoes_the_first(error: BaseException) -> None:
    claims = [claim(name, 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"') for name in ("a", "b")]
    assert all(c["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == CLASS for c in claims)
    writer = FlakyWriter({c["metadata"]["name"]: c for c in claims}, error)
    ctl = _controller(writer, claims)
    with pytest.raises(type(error)):
        ctl._process_pod("ns/p")
    assert writer.writes == 2  # the first claim was written before the failure
    for name in ("a", "b"):
        stored = writer.claims[name]
        assert not (stored.get("status") or {}).get("allocation"), name
        assert FINALIZER not in (stored["metadata"].get("finalizers") or []), name
    assert not ctl.ledger.owners  # nothing stays counted as used
    assert not writer.released


@pytest.mark.parametrize(
    "error", [TimeoutError("read timed out"), ConnectionResetError("reset"), ApiException(status=500)]
)
def test_a_second_write_with_an_unknown_outcome_undoes_nothing_and_holds_both(error: BaseException) -> None:
    """The second allocation may have landed: both claims stay held, the pod waits until it is known."""
    claims = [claim(name, 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"') for name in ("a", "b")]
    writer = FlakyWriter({c["metadata"]["name"]: c for c in claims}, error)
    ctl = _controller(writer, claims)
    with pytest.raises(type(error)):
        ctl._process_pod("ns/p")
    assert writer.claims["a"]["status"]["allocation"]  # confirmed: kept for the pod
    uid_b = claims[1]["metadata"]["uid"]
    assert uid_b in ctl.uncertain.entries
    assert len(ctl.ledger.owners) == 2  # a's device, and the one b may hold
    assert not writer.released
    ctl._process_pod("ns/p")  # decided again before it is known: it must not be
    assert writer.writes == 2 and not writer.released
    assert ctl.pending["ns/p"].reason == "WriteOutcomeUnknown"
    assert "claim b" in ctl.pending["ns/p"].message


def test_the_pod_is_allocated_when_nothing_fails() -> None:
    claims = [claim(name, 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"') for name in ("a", "b")]
    writer = FlakyWriter({c["metadata"]["name"]: c for c in claims}, TimeoutError(), fail_on=99)
    ctl = _controller(writer, claims)
    ctl._process_pod("ns/p")
    assert all(writer.claims[n]["status"]["allocation"] for n in ("a", "b"))
    assert writer.released


def test_only_node_changes_the_filter_reads_wake_pending_pods() -> None:
    from controller.allocation.loop import Pending

    claims = [claim("a", 'device.attributes["gpu.flexmig.dev"].profile == "1g.5gb"')]
    ctl = _controller(FlakyWriter({"a": claims[0]}, TimeoutError(), fail_on=99), claims)
    ctl.pending["ns/p"] = Pending(0.0)
    before = {"metadata": {"name": "n1"}, "spec": {}}
    heartbeat = {"metadata": {"name": "n1"}, "spec": {}, "status": {"conditions": [{"type": "Ready"}]}}
    ctl.dirty.clear()
    ctl.apply([Event("nodes", "MODIFIED", obj=heartbeat)])
    assert ctl.dirty == set()
    tainted = {**heartbeat, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
    ctl.apply([Event("nodes", "MODIFIED", obj=tainted)])
    assert ctl.dirty == {"ns/p"}
    ctl.dirty.clear()
    ctl.apply(
        [Event("nodes", "MODIFIED", obj={**before, "metadata": {"name": "n1", "labels": {"zone": "z"}}})]
    )
    assert ctl.dirty == {"ns/p"}
