"""Shim templates: made to exist before admission (idempotently, stamped on use), and collected
only when no live pod of their namespace names them and they have been unused for the grace time."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from wh_fakeapi import FakeApi

from controller.shim import Mode, Shape
from controller.shim.templates import template_for
from controller.webhook.templates import (
    LAST_USED_ANNOTATION,
    TemplateCollector,
    TemplateEnsurer,
    TemplateError,
    last_used,
    templates_path,
    unused_templates,
)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC).timestamp()
SPEC = template_for("team-a", Shape(count=2, memory_mib=8000, memory_percent=None, cores=0, mode=Mode.MIG))
PATH = templates_path("team-a", SPEC.name)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def stamp_of(api: FakeApi) -> str:
    obj = api.get(PATH)
    assert obj is not None
    return str(obj["metadata"]["annotations"][LAST_USED_ANNOTATION])


def test_ensure_creates_once_then_stamps_at_most_every_touch_interval(fake_api: FakeApi) -> None:
    clock = Clock(T0)
    ensurer = TemplateEnsurer(None, touch_s=60, clock=clock)
    ensurer.ensure([SPEC, SPEC])
    created = fake_api.get(PATH)
    assert created is not None and created["spec"] == SPEC.body["spec"]
    assert created["metadata"]["labels"] == SPEC.body["metadata"]["labels"]
    assert stamp_of(fake_api) == "2026-03-01T12:00:00Z"
    assert fake_api.writes() == [("POST", templates_path("team-a"))]
    clock.t += 30
    ensurer.ensure([SPEC])
    assert len(fake_api.writes()) == 1, "stamped recently: no API call"
    clock.t += 40
    ensurer.ensure([SPEC])
    assert stamp_of(fake_api) == "2026-03-01T12:01:10Z"
    assert fake_api.writes()[-2:] == [("POST", templates_path("team-a")), ("PATCH", PATH)]


def test_another_replica_finds_it_existing_and_stamps_it(fake_api: FakeApi) -> None:
    TemplateEnsurer(None, clock=Clock(T0)).ensure([SPEC])
    TemplateEnsurer(None, clock=Clock(T0 + 5)).ensure([SPEC])
    assert stamp_of(fake_api) == "2026-03-01T12:00:05Z"


def test_api_errors_name_the_template(fake_api: FakeApi) -> None:
    fake_api.fail[("POST", templates_path("team-a"))] = 403
    with pytest.raises(TemplateError, match=f"team-a/{SPEC.name} could not be created: 403"):
        TemplateEnsurer(None).ensure([SPEC])


def template(
    name: str, ns: str = "team-a", *, created: float, used: float | None = None, shim: bool = True
) -> dict[str, Any]:
    labels = dict(SPEC.body["metadata"]["labels"]) if shim else {"app": "mine"}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": labels,
        "creationTimestamp": dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "uid": f"uid-{name}",
        "resourceVersion": "1",
    }
    if used is not None:
        meta["annotations"] = {
            LAST_USED_ANNOTATION: dt.datetime.fromtimestamp(used, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        }
    return {"metadata": meta, "spec": {"spec": {}}}


def pod(name: str, templates: list[str], phase: str = "Pending") -> dict[str, Any]:
    claims = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return {"metadata": {"name": name}, "spec": {"resourceClaims": claims}, "status": {"phase": phase}}


def test_unused_templates_rules() -> None:
    now, grace = T0, 600.0
    old = now - 3600
    templates = [
        template("named-by-live-pod", created=old),
        template("named-by-finished-pod", created=old),
        template("unnamed-old", created=old),
        template("unnamed-used-recently", created=old, used=now - 60),
        template("unnamed-new", created=now - 60),
        template("not-ours", created=old, shim=False),
        template("other-ns-named-here", ns="team-b", created=old),
    ]
    pods = {
        "team-a": [
            pod("a", ["named-by-live-pod", "other-ns-named-here"]),
            pod("b", ["named-by-finished-pod"], "Succeeded"),
        ],
        "team-b": [],
    }
    listed: list[str] = []

    def pods_in(ns: str) -> list[dict[str, Any]]:
        listed.append(ns)
        return pods[ns]

    out = unused_templates(templates, pods_in, now, grace)
    assert sorted(f"{t['metadata']['namespace']}/{t['metadata']['name']}" for t in out) == [
        "team-a/named-by-finished-pod",
        "team-a/unnamed-old",
        "team-b/other-ns-named-here",
    ]
    assert listed == ["team-a", "team-b"]
    assert last_used(templates[3]) == now - 60


def test_collector_deletes_unused_and_skips_one_used_meanwhile(
    fake_api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(T0)
    fake_api.clock = clock
    TemplateEnsurer(None, clock=clock).ensure([SPEC])
    other = template_for("team-a", Shape(count=1, memory_mib=None, memory_percent=50, cores=0, mode=Mode.ANY))
    TemplateEnsurer(None, clock=clock).ensure([other])
    fake_api.put("/api/v1/namespaces/team-a/pods", pod("user", [SPEC.name]))
    collector = TemplateCollector(None, grace_s=600, clock=clock)
    assert collector.collect() == []  # both too recent
    clock.t += 601
    assert collector.collect() == [f"team-a/{other.name}"]
    assert fake_api.get(PATH) is not None and fake_api.get(templates_path("team-a", other.name)) is None
    # The pod goes; the template was stamped by an admission between the collector's list and its delete.
    del fake_api.objects["/api/v1/namespaces/team-a/pods/user"]
    real_request = fake_api.request

    def stamp_before_delete(api: Any, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        if method == "DELETE":
            TemplateEnsurer(None, clock=Clock(clock.t)).ensure([SPEC])
        return real_request(api, method, path, body, **kw)

    monkeypatch.setattr("controller.webhook.templates.request", stamp_before_delete)
    assert collector.collect() == []
    assert fake_api.get(PATH) is not None
