"""A claim generated from a shim template written before templates labelled their claims, through the
allocation loop: the pod's entry names a shim template, so the claim keeps the shim's strand-least
order (the share) where a user's claim would take its first alternative (the MIG device)."""

from __future__ import annotations

from typing import Any

import pytest
from ctl_helpers import node_slices
from kubernetes.client.exceptions import ApiException
from shared_helpers import CLASSES, any_claim, hami_body, shared_slice
from test_ctl_loop import FlakyWriter

from api.constants import ALLOCATION_GATE
from controller.allocation.loop import Controller
from controller.kube.store import Event
from controller.kube.watchcache import WatchCache


def _chosen(template_name: str) -> str:
    c = any_claim("c", 4000, hami_body(memory=4000))
    del c["metadata"]["labels"]  # as an old shim template generated it
    writer = FlakyWriter({"c": c}, ApiException(status=500), fail_on=99)
    cache = WatchCache(
        {n: lambda **_: None for n in ("resourceslices", "resourceclaims", "deviceclasses", "pods", "nodes")}
    )
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {
            "schedulingGates": [{"name": ALLOCATION_GATE}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template_name}],
            "containers": [{"name": "main"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "c"}]},
    }
    ctl = Controller(cache, writer, catch_up=False)
    slices = [shared_slice("h", [40960]), *node_slices("m", "A100-40GB", 1)]
    ctl.apply(
        [
            Event(
                "nodes",
                "REPLACE",
                items=({"metadata": {"name": "h"}, "spec": {}}, {"metadata": {"name": "m"}, "spec": {}}),
            ),
            Event("deviceclasses", "REPLACE", items=tuple(CLASSES.values())),
            Event("resourceslices", "REPLACE", items=tuple(slices)),
            Event("resourceclaims", "REPLACE", items=(c,)),
            Event("pods", "REPLACE", items=(pod,)),
        ]
    )
    ctl._process_pod("ns/p")
    [result] = writer.claims["c"]["status"]["allocation"]["devices"]["results"]
    return str(result["request"])


@pytest.mark.parametrize(
    ("template", "request_name"),
    [("flexmig-any-1x4000mi-c0", "gpus/hami-core"), ("my-own-template", "gpus/mig")],
)
def test_old_shim_claims_keep_the_shims_order_and_users_keep_theirs(template: str, request_name: str) -> None:
    assert _chosen(template) == request_name
