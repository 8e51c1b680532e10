"""Shim templates are owned by the DeviceClasses they use, so uninstalling the chart (which deletes
the classes) lets the garbage collector delete the templates left in user namespaces."""

from __future__ import annotations

from wh_fakeapi import FakeApi

from controller.shim import Mode, Shape
from controller.shim.templates import template_for
from controller.webhook.templates import CLASSES_PATH, TemplateEnsurer, class_names, templates_path

SPEC = template_for("team-a", Shape(count=1, memory_mib=8000, memory_percent=None, cores=0, mode=Mode.MIG))


def test_class_names_cover_exactly_and_first_available() -> None:
    body = {
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "a", "exactly": {"deviceClassName": "mig.gpu.flexmig.dev"}},
                        {
                            "name": "b",
                            "firstAvailable": [
                                {"deviceClassName": "gpu.flexmig.dev"},
                                {"deviceClassName": "mig.gpu.flexmig.dev"},
                            ],
                        },
                    ]
                }
            }
        }
    }
    assert class_names(body) == ["gpu.flexmig.dev", "mig.gpu.flexmig.dev"]
    assert class_names(SPEC.body), "the shim's own templates name a class"


def test_created_template_is_owned_by_its_existing_classes(fake_api: FakeApi) -> None:
    owned = {}
    for name in class_names(SPEC.body):
        owned[name] = fake_api.put(CLASSES_PATH, {"metadata": {"name": name}})["metadata"]["uid"]
    TemplateEnsurer(None).ensure([SPEC])
    created = fake_api.get(templates_path("team-a", SPEC.name))
    assert created is not None
    refs = created["metadata"]["ownerReferences"]
    assert {(r["kind"], r["name"], r["uid"]) for r in refs} == {
        ("DeviceClass", n, u) for n, u in owned.items()
    }
    assert all(r["apiVersion"] == "resource.k8s.io/v1" and "controller" not in r for r in refs)


def test_missing_class_gives_no_owner_and_still_creates(fake_api: FakeApi) -> None:
    TemplateEnsurer(None).ensure([SPEC])
    created = fake_api.get(templates_path("team-a", SPEC.name))
    assert created is not None and "ownerReferences" not in created["metadata"]
