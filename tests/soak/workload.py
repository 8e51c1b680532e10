"""The soak's churn: a bounded random stream of pods from a seeded RNG, run in a background thread.

Kinds of pods (`PodKind`): HAMi-style pods as a HAMi user writes them (`nvidia.com/gpu` 1-2,
`nvidia.com/gpumem` of various sizes, some larger than any profile, with and without
`nvidia.com/vgpu-mode`), pods using a hand-written ResourceClaim (a MIG selector on memory, or a whole
GPU), pods using a shared ResourceClaimTemplate, bursts of many 1g pods pinned to the one-GPU node, and
pods deleted while they are being allocated or prepared. Every pod lives a random time once it runs and
is deleted then (or after `max_age_s` if it never runs).
"""

from __future__ import annotations

import contextlib
import enum
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from api.constants import ANNOTATION_VGPU_MODE, RESOURCE_GPU, RESOURCE_GPUMEM
from controller.kube.rest import claim_path, pod_path, request
from tests.e2e.objects import UNPULLABLE_IMAGE, claim_body, pod_body

Obj = dict[str, Any]
SOAK_LABEL = "soak.flexmig.dev/run"
GPUMEM_MIB = (2000, 4000, 4000, 8000, 9000, 15000, 19000, 30000, 39000, 60000, 90000, 200000)
MODES = (None, None, "mig", "mig", "hami-core")
MIG_CLAIM_MIB = (4000, 9000, 18000, 35000)
TEMPLATE = "soak-mig-small"


class PodKind(enum.StrEnum):
    HAMI = "hami"
    CLAIM = "claim"
    WHOLE = "whole"
    TEMPLATE = "template"
    BURST = "burst"


@dataclass
class Tracked:
    name: str
    kind: PodKind
    created: float
    lifetime_s: float
    claim: str | None = None
    running_since: float | None = None


@dataclass
class ChurnStats:
    created: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    deleted: int = 0
    mid_prepare_deletes: int = 0
    errors: int = 0
    last_error: str = ""


def _mib_selector(mib: int) -> str:
    return f'device.capacity["gpu.flexmig.dev"].memory.compareTo(quantity("{mib}Mi")) >= 0'


class Churn:
    def __init__(
        self,
        api: Any,
        namespace: str,
        rng: random.Random,
        *,
        pinned_node: str,
        max_live: int = 20,
        max_age_s: float = 150.0,
        lifetime_s: tuple[float, float] = (5.0, 40.0),
        step_s: float = 1.5,
    ) -> None:
        self.api, self.ns, self.rng = api, namespace, rng
        self.pinned_node = pinned_node  # the one-GPU node that bursts compete for
        self.max_live, self.max_age_s, self.lifetime_s, self.step_s = max_live, max_age_s, lifetime_s, step_s
        self.live: dict[str, Tracked] = {}
        self.stats = ChurnStats()
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._idle = threading.Event()
        self._thread: threading.Thread | None = None
        self.bursts = 0

    # --- control ----------------------------------------------------------------------------------

    def setup(self) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE},
            "spec": {"spec": claim_body("x", "mig.gpu.flexmig.dev", [_mib_selector(4000)])["spec"]},
        }
        request(
            self.api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaimtemplates", body
        )

    def start(self) -> Churn:
        self._thread = threading.Thread(target=self._run, name="soak-churn", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    @contextlib.contextmanager
    def paused(self) -> Any:
        """No creations or deletions inside the block (the current step finishes first)."""
        self._idle.clear()
        self._pause.set()
        if self._thread is not None and self._thread.is_alive():
            self._idle.wait(120)
        try:
            yield
        finally:
            self._pause.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._pause.is_set():
                self._idle.set()
                time.sleep(0.2)
                continue
            try:
                self.step()
            except Exception as exc:  # the churn must outlive any fault (API server down, ...)
                self._error(exc)
            self._stop.wait(self.step_s)

    def _error(self, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"

    # --- one step ---------------------------------------------------------------------------------

    def observe(self, pods: list[Obj]) -> None:
        """Note which tracked pods run (from the invariant checker's pod list)."""
        now = time.monotonic()
        running = {p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"}
        with self._lock:
            for t in self.live.values():
                if t.running_since is None and t.name in running:
                    t.running_since = now

    def step(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [
                t
                for t in self.live.values()
                if (t.running_since is not None and now - t.running_since > t.lifetime_s)
                or now - t.created > self.max_age_s
            ]
        for t in due:
            self.delete(t.name)
        rng = self.rng
        if len(self.live) < self.max_live and rng.random() < 0.12:
            self.burst(rng.randint(8, 12))
            return
        for _ in range(rng.randint(0, 3)):
            if len(self.live) >= self.max_live:
                break
            kind = rng.choices(list(PodKind)[:4], weights=(6, 2, 1, 2))[0]
            name = self.create(kind)
            if name and rng.random() < 0.1:  # deleted while it is being allocated or prepared
                time.sleep(rng.uniform(0.2, 2.5))
                self.stats.mid_prepare_deletes += 1
                self.delete(name)

    def burst(self, n: int) -> None:
        self.bursts += 1
        for _ in range(n):
            self.create(PodKind.BURST)

    # --- objects ----------------------------------------------------------------------------------

    def _name(self, kind: PodKind) -> str:
        with self._lock:  # the fault matrix creates pods from the main thread while the churn runs
            self._seq += 1
            return f"{kind.value}-{self._seq:05d}"

    def hami_pod(self, name: str, gpus: int, mib: int, mode: str | None, node: str | None = None) -> Obj:
        meta: Obj = {"name": name, "labels": {SOAK_LABEL: "1"}}
        if mode:
            meta["annotations"] = {ANNOTATION_VGPU_MODE: mode}
        spec: Obj = {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": UNPULLABLE_IMAGE,
                    "resources": {"limits": {RESOURCE_GPU: str(gpus), RESOURCE_GPUMEM: str(mib)}},
                }
            ],
        }
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def create(self, kind: PodKind, *, node: str | None = None, smallest: bool = False) -> str | None:
        """Create one pod of `kind` (and its claim); its name, or None if the API server refused it.
        `smallest`: one GPU and the least memory in MIG mode, so it fits any MIG node with a free slice
        (the fault matrix needs a prepare to happen, not a random pod that may never fit)."""
        rng, name, claim = self.rng, self._name(kind), None
        if kind is PodKind.HAMI:
            gpus, mib, mode = (
                (1, min(GPUMEM_MIB), "mig")
                if smallest
                else (rng.choice((1, 1, 1, 2)), rng.choice(GPUMEM_MIB), rng.choice(MODES))
            )
            body = self.hami_pod(name, gpus, mib, mode, node)
        elif kind is PodKind.BURST:
            body = self.hami_pod(name, 1, 9000, "mig", node or self.pinned_node)
        elif kind is PodKind.TEMPLATE:
            body = pod_body(name, {"resourceClaimTemplateName": TEMPLATE})
        else:
            claim = name
            if kind is PodKind.WHOLE:
                cbody = claim_body(claim, "gpu.flexmig.dev")
            else:
                mib = min(MIG_CLAIM_MIB) if smallest else rng.choice(MIG_CLAIM_MIB)
                cbody = claim_body(claim, "mig.gpu.flexmig.dev", [_mib_selector(mib)])
            try:
                request(
                    self.api, "POST", f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims", cbody
                )
            except ApiException:
                self.stats.refused += 1
                return None
            body = pod_body(name, claim)
        body["metadata"].setdefault("labels", {})[SOAK_LABEL] = "1"
        if node and kind is not PodKind.HAMI and kind is not PodKind.BURST:
            body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        try:
            request(self.api, "POST", f"/api/v1/namespaces/{self.ns}/pods", body)
        except ApiException:
            self.stats.refused += 1
            if claim:
                with contextlib.suppress(ApiException):
                    request(self.api, "DELETE", claim_path(self.ns, claim))
            return None
        lifetime = self.rng.uniform(*self.lifetime_s)
        with self._lock:
            self.live[name] = Tracked(name, kind, time.monotonic(), lifetime, claim)
        self.stats.created[kind.value] += 1
        return name

    def delete(self, name: str) -> None:
        with self._lock:
            t = self.live.pop(name, None)
        try:
            request(self.api, "DELETE", pod_path(self.ns, name))
        except ApiException as exc:
            if exc.status != 404:
                with self._lock:  # try again on a later step
                    if t is not None:
                        self.live[name] = t
                raise
        if t is not None and t.claim:
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", claim_path(self.ns, t.claim))
        self.stats.deleted += 1

    def delete_all(self) -> None:
        for name in list(self.live):
            with contextlib.suppress(Exception):
                self.delete(name)
        for plural, base in (("pods", "/api/v1"), ("resourceclaims", "/apis/resource.k8s.io/v1")):
            with contextlib.suppress(ApiException):
                request(self.api, "DELETE", f"{base}/namespaces/{self.ns}/{plural}")

    def summary(self) -> str:
        s = self.stats
        made = ", ".join(f"{k} {v}" for k, v in sorted(s.created.items()))
        return (
            f"created {sum(s.created.values())} ({made}), bursts {self.bursts}, refused {s.refused}, "
            f"deleted {s.deleted} ({s.mid_prepare_deletes} mid-prepare), churn errors {s.errors}"
        )
