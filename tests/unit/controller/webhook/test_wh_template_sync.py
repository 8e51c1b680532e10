"""Shim templates exist for pods that exist, and only for them: reviews from anyone write nothing and
keep nothing; the leader's template sync creates what a stored pod names; a template collected while
a new pod came to name it is created again; the stamp cache is bounded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from wh_fakeapi import FakeApi

from controller.shim import Mode, Shape, ShimDefaults
from controller.shim.templates import template_for
from controller.webhook import WebhookService, WebhookSettings
from controller.webhook.templates import TemplateCollector, TemplateEnsurer, templates_path
from controller.webhook.templatesync import TemplateSync, templates_needed

SHAPE = Shape(count=1, memory_mib=8000, memory_percent=None, cores=0, mode=Mode.MIG)
NAME = template_for("x", SHAPE).name  # flexmig-mig-1x8000mi-c0


def pod(ns: str, name: str, templates: Iterable[str], **status: Any) -> dict[str, Any]:
    claims = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return {
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c"}], "resourceClaims": claims},
        "status": {"phase": "Pending", **status},
    }


def hami_review(namespace: str, uid: str) -> bytes:
    obj = {
        "metadata": {"name": f"ghost-{uid}"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": obj,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def test_anonymous_reviews_for_pods_that_never_exist_create_nothing_and_keep_nothing(
    fake_api: FakeApi,
) -> None:
    service = WebhookService(None, WebhookSettings(port=0, hosts=("127.0.0.1",)), ShimDefaults())
    try:
        for i in range(210):
            status, raw = service.handler(hami_review(f"ns-{i}", f"u-{i}"))
            assert status == 200 and json.loads(raw)["response"]["allowed"] is True
        # The only calls are the reads of each namespace's quotas (HAMi-style GPU quotas).
        assert fake_api.writes() == []
        assert {(m, p.rsplit("/", 1)[-1]) for m, p in fake_api.calls} == {("GET", "resourcequotas")}
        assert service.ensurer.cached() == 0
        # The leader's sync finds no such pod: still nothing.
        service.sync.watch_fn = lambda _rv: []
        service.sync.once()
        assert fake_api.writes() == []
    finally:
        service.stop()


def test_templates_needed_only_for_shim_names_of_unfinished_pods_whose_claims_are_missing() -> None:
    two = template_for("ns", Shape(count=2, memory_mib=None, memory_percent=50, cores=0, mode=Mode.ANY)).name
    assert [t.name for t in templates_needed(pod("ns", "p", [NAME, "mine", two, NAME]))] == [NAME, two]
    assert templates_needed(pod("ns", "p", [NAME])) == [template_for("ns", SHAPE)]
    created = [{"name": "c0", "resourceClaimName": "p-c0-abcde"}]
    assert templates_needed(pod("ns", "p", [NAME], resourceClaimStatuses=created)) == []
    assert templates_needed(pod("ns", "p", [NAME], phase="Succeeded")) == []
    deleting = pod("ns", "p", [NAME])
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert templates_needed(deleting) == []
    assert templates_needed(pod("Bad/NS", "p", [NAME])) == []
    assert templates_needed(pod("ns", "p", ["flexmig-mig-1x8000mi-c0-d", "../x"])) == []


class Feed:
    """A list and a scripted watch for the sync, recording the resourceVersions it watched from."""

    def __init__(self, pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> None:
        self.pods = pods
        self.events = events or []
        self.lists = 0
        self.watched_from: list[str] = []

    def list(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return self.pods, "10"

    def watch(self, rv: str) -> Iterable[Mapping[str, Any]]:
        self.watched_from.append(rv)
        events, self.events = self.events, []
        yield from events


def sync_for(feed: Feed, leading: list[bool], ensurer: TemplateEnsurer | None = None) -> TemplateSync:
    return TemplateSync(
        None,
        ensurer or TemplateEnsurer(None),
        is_leader=lambda: leading[0],
        stop=threading.Event(),
        list_fn=feed.list,
        watch_fn=feed.watch,
    )


def test_a_follower_lists_nothing_and_writes_nothing(fake_api: FakeApi) -> None:
    feed = Feed([pod("team-a", "p", [NAME])])
    sync_for(feed, [False]).once()
    assert feed.lists == 0 and fake_api.writes() == []


def test_the_leader_creates_templates_for_listed_and_watched_pods(fake_api: FakeApi) -> None:
    feed = Feed(
        [pod("team-a", "p", [NAME])],
        [
            {"type": "ADDED", "object": pod("team-b", "q", [NAME])},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
        ],
    )
    sync = sync_for(feed, [True])
    sync.once()
    assert fake_api.get(templates_path("team-a", NAME)) is not None
    assert fake_api.get(templates_path("team-b", NAME)) is not None
    sync.once()  # resumes from the bookmark, no new list
    assert feed.lists == 1 and feed.watched_from == ["10", "12"]


def test_a_failed_create_is_replayed_and_a_refused_one_skipped(fake_api: FakeApi) -> None:
    fake_api.fail[("POST", templates_path("team-a"))] = 503
    fake_api.fail[("POST", templates_path("team-c"))] = 403
    feed = Feed(
        [],
        [
            {"type": "ADDED", "object": pod("team-c", "r", [NAME])},
            {
                "type": "ADDED",
                "object": {
                    **pod("team-a", "p", [NAME]),
                    "metadata": {"name": "p", "namespace": "team-a", "resourceVersion": "11"},
                },
            },
        ],
    )
    sync = sync_for(feed, [True])
    with pytest.raises(Exception, match="503"):
        sync.once()
    assert fake_api.get(templates_path("team-c", NAME)) is None  # refused for good: skipped, logged
    del fake_api.fail[("POST", templates_path("team-a"))]
    feed.events = [{"type": "ADDED", "object": pod("team-a", "p", [NAME])}]
    sync.once()
    # Resumed after the last handled event (the refused one, version 7), not past the failed one (11).
    assert feed.watched_from == ["10", "7"]
    assert fake_api.get(templates_path("team-a", NAME)) is not None


def test_losing_the_lease_mid_watch_stops_writes_and_lists_again_when_leading(fake_api: FakeApi) -> None:
    leading = [True]
    feed = Feed([], [{"type": "ADDED", "object": pod("team-a", "p", [NAME])}])
    sync = sync_for(feed, leading)
    real_watch = feed.watch

    def lose_lease_first(rv: str) -> Iterable[Mapping[str, Any]]:
        leading[0] = False
        return real_watch(rv)

    sync.watch_fn = lose_lease_first
    sync.once()
    assert fake_api.writes() == []
    leading[0] = True
    sync.watch_fn = real_watch
    feed.pods = [pod("team-a", "p", [NAME])]
    sync.once()
    assert feed.lists == 2 and fake_api.get(templates_path("team-a", NAME)) is not None


def test_an_expired_watch_lists_again(fake_api: FakeApi) -> None:
    feed = Feed([], [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}])
    sync = sync_for(feed, [True])
    sync.once()
    feed.pods = [pod("team-a", "p", [NAME])]
    sync.once()
    assert feed.lists == 2 and fake_api.get(templates_path("team-a", NAME)) is not None


def test_a_template_collected_while_a_new_pod_named_it_is_created_again(
    fake_api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector listed the namespace's pods before the new pod existed, then deleted the template;
    its second look after the delete sees the pod and creates the template again."""
    now = [1_000_000.0]
    fake_api.clock = lambda: now[0]
    ensurer = TemplateEnsurer(None, clock=lambda: now[0])
    ensurer.ensure([template_for("team-a", SHAPE)])
    now[0] += 3600
    collector = TemplateCollector(None, grace_s=600, clock=lambda: now[0], ensurer=ensurer)
    import controller.webhook.templates as templates_module

    real_request = fake_api.request

    def pod_created_before_delete(
        api: Any, method: str, path: str, body: Any = None, **kw: Any
    ) -> dict[str, Any]:
        if method == "DELETE":
            fake_api.put("/api/v1/namespaces/team-a/pods", pod("team-a", "new", [NAME]))
        return real_request(api, method, path, body, **kw)

    monkeypatch.setattr(templates_module, "request", pod_created_before_delete)
    assert collector.collect() == [f"team-a/{NAME}"]
    assert fake_api.get(templates_path("team-a", NAME)) is not None


def test_the_stamp_cache_is_bounded_per_namespace_and_in_namespaces(fake_api: FakeApi) -> None:
    ensurer = TemplateEnsurer(None, max_namespaces=4, max_per_namespace=3)
    for ns in range(10):
        for memory in range(1, 8):
            shape = Shape(count=1, memory_mib=memory, memory_percent=None, cores=0, mode=Mode.MIG)
            ensurer.ensure([template_for(f"ns-{ns}", shape)])
    assert ensurer.cached() == 4 * 3
