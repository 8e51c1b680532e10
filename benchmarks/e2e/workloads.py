"""The pods of a burst, by kind, and the burst that creates them the way many users would at once.

Kinds (every pod asks for one MIG device on the simulated H100-80GB nodes, or nothing):
- `legacy`: HAMi-style limits `nvidia.com/gpu: 1` + `nvidia.com/gpumem: 10000`; the webhook
  rewrites them into a claim template (controller mode only: scheduler mode installs no webhook).
  10000 MiB is more than a 1g.10gb holds (9984 MiB), so each gets the next profile of the default
  allowlist, a 2g.20gb: 3 per GPU where a claim pod's 1g.10gb fits 7;
- `claim`: a ResourceClaim of the MIG class selecting profile 1g.10gb, and a pod using it (the claim's
  POST counts as the start: a user applies both);
- `nogpu`: the same pod with no GPU at all, the baseline flexmig's own cost is measured against.

On the stand-in kubelets no container runs (the image is never pulled). `real=True` (the real-node mode,
realnode.py) gives every kind the same container that really runs: the e2e tests' busybox image, never
pulled, sleeping until the runtime stops it, on the host network (the node has no pod network) and
tolerating the node's not-ready taints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.constants import DRIVER_NAME, RESOURCE_GPU, RESOURCE_GPUMEM
from controller.kube.rest import request
from tests.e2e.objects import UNPULLABLE_IMAGE, claim_body, pod_body
from tests.e2e.realnode.images import TEST_IMAGE
from tests.e2e.realnode.node import TOLERATE_ALL

from .timeline import Timeline

KINDS = ("legacy", "claim", "nogpu")
MIG_CLASS = "mig.gpu.flexmig.dev"
PROFILE = "1g.10gb"
LEGACY_MIB = 10000
# What a real node's container runs: sleep in the background so that SIGTERM ends it at once.
SLEEPER = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
REAL_GRACE_S = 1  # a pod's terminationGracePeriodSeconds on the real node: rounds clean up fast


def _plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": UNPULLABLE_IMAGE}],
        },
    }


def _run_for_real(body: dict[str, Any]) -> None:
    spec = body["spec"]
    spec["containers"][0].update(image=TEST_IMAGE, imagePullPolicy="Never", command=list(SLEEPER))
    spec.update(
        hostNetwork=True,
        tolerations=[dict(t) for t in TOLERATE_ALL],
        terminationGracePeriodSeconds=REAL_GRACE_S,
    )


def pod_for(kind: str, name: str, node_selector: dict[str, str], real: bool = False) -> dict[str, Any]:
    """The pod `name` of `kind`; `real`: its container runs on a real kubelet (module docstring)."""
    if kind == "claim":
        body = pod_body(name, name)
    else:
        body = _plain_pod(name)
        if kind == "legacy":
            limits = {RESOURCE_GPU: "1", RESOURCE_GPUMEM: str(LEGACY_MIB)}
            body["spec"]["containers"][0]["resources"] = {"limits": limits}
    body["spec"]["nodeSelector"] = dict(node_selector)
    if real:
        _run_for_real(body)
    return body


def claim_for(name: str) -> dict[str, Any]:
    return claim_body(name, MIG_CLASS, [f'device.attributes["{DRIVER_NAME}"].profile == "{PROFILE}"'])


def create_burst(
    api: Any,
    ns: str,
    kind: str,
    count: int,
    node_selector: dict[str, str],
    timeline: Timeline,
    clients: int = 16,
    prefix: str = "",
    real: bool = False,
) -> list[str]:
    """Create `count` pods of `kind` from `clients` concurrent clients; the names whose POST failed.
    `prefix` starts every name (a second burst into the same namespace); `real`: see `pod_for`."""
    failed: list[str] = []

    def one(i: int) -> None:
        name = f"{prefix}{kind}-{i:05d}"
        timeline.mark(name, "posted")
        try:
            if kind == "claim":
                request(
                    api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim_for(name)
                )
            request(api, "POST", f"/api/v1/namespaces/{ns}/pods", pod_for(kind, name, node_selector, real))
        except Exception:
            failed.append(name)
            return
        timeline.mark(name, "admitted")

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, range(count)))
    return failed


def wait_for(cond: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return cond()
