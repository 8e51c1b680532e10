"""The webhook as one service inside `flexmig controller`: every replica serves admissions, which
write nothing; the leader alone writes (certificate Secret, caBundle, the shim templates existing pods
name, template garbage collection).

One maintenance thread, every `tick_s` (every second until the first certificate is there):
1. refresh the certificate (`CertSource.refresh`; the leader creates or renews it) and swap the TLS
   context if it changed; the HTTPS listener opens once a certificate exists, so a replica without
   one is not ready (the chart's readiness probe is a TCP connect to the webhook port);
2. leader, self-generated certificate: make the webhook configuration trust its CA bundle;
3. leader, every `gc_interval_s`: delete unused shim templates.
Each step is guarded: a failing step is logged and retried next tick, the others still run.

`loops` are the service's other loops, for the process to run and health-check: the template sync
(controller/webhook/templatesync.py), which creates the shim templates of pods that exist.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from controller.shim import MutationResult, ShimDefaults, mutate_pod
from controller.webhook.cabundle import ensure_ca_bundle
from controller.webhook.certs import DEFAULT_POLICY, CertBundle, CertPolicy
from controller.webhook.certstore import CertSource, DirCertSource, SecretCertSource
from controller.webhook.flexmigclaims import FlexmigClaims
from controller.webhook.quotas import NamespaceQuotas
from controller.webhook.review import AdmissionHandler, ReviewMetrics
from controller.webhook.server import TlsState, WebhookServer
from controller.webhook.templates import DEFAULT_GRACE_S, TemplateCollector, TemplateEnsurer
from controller.webhook.templatesync import TemplateSync
from driver.looprunner import LoopRunner

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class WebhookSettings:
    port: int
    address: str = "0.0.0.0"
    path: str = "/mutate-pods"
    configuration: str = ""
    """MutatingWebhookConfiguration whose caBundle the leader keeps current ("" = someone else does)."""
    hosts: tuple[str, ...] = ()
    """DNS names / IPs of the self-generated serving certificate."""
    tls_dir: Path | None = None
    """A provided certificate (tls.crt, tls.key): nothing is generated or patched."""
    cert_namespace: str = "kube-system"
    cert_secret: str = "flexmig-webhook-cert"
    template_grace_s: float = DEFAULT_GRACE_S
    gc_interval_s: float = 60.0
    tick_s: float = 10.0
    cert_policy: CertPolicy = DEFAULT_POLICY


class WebhookService:
    def __init__(
        self,
        api: Any,
        settings: WebhookSettings,
        defaults: ShimDefaults,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.defaults = defaults
        self.is_leader = is_leader
        self.source: CertSource = (
            DirCertSource(settings.tls_dir)
            if settings.tls_dir is not None
            else SecretCertSource(
                api,
                settings.cert_namespace,
                settings.cert_secret,
                settings.hosts,
                policy=settings.cert_policy,
            )
        )
        self.claims = FlexmigClaims(api)
        self.quotas = NamespaceQuotas(api, defaults)
        self.ensurer = TemplateEnsurer(api)
        self.collector = TemplateCollector(api, grace_s=settings.template_grace_s, ensurer=self.ensurer)
        # Reviews write nothing (their caller is not authenticated): no template hook.
        self.handler = AdmissionHandler(self._mutate, None, ReviewMetrics(registry))
        self.tls = TlsState()
        self.server: WebhookServer | None = None
        self.serving = threading.Event()
        self.stop_event = threading.Event()
        self.sync = TemplateSync(api, self.ensurer, is_leader=is_leader, stop=self.stop_event)
        self.loops: list[LoopRunner] = [self.sync.runner]
        self._thread = threading.Thread(target=self._run, name="webhook-maintenance", daemon=True)
        self._bundle: CertBundle | None = None
        self._last_gc = float("-inf")

    def _mutate(self, pod: Mapping[str, Any], namespace: str) -> MutationResult:
        result = mutate_pod(pod, namespace, self.defaults, self.claims.checker(namespace))
        # HAMi-style quotas on nvidia.com/gpu and gpumem, which Kubernetes no longer sees once the
        # resources are rewritten into claims (controller/shim/quota.py).
        self.quotas.check(namespace, result.shapes)
        return result

    def start(self) -> None:
        """Standalone use; `flexmig controller` runs tick() and `loops` under its own LoopRunners."""
        self._thread.start()
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.server is not None:
            self.server.stop()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            self.tick()
            self.stop_event.wait(self.settings.tick_s if self.serving.is_set() else 1.0)

    def tick(self) -> None:
        leader = self.is_leader()
        self._guard("https server", self._revive_server)
        self._guard("certificate", lambda: self._refresh_certificate(leader))
        bundle = self._bundle
        if leader and bundle is not None and self.source.self_generated and self.settings.configuration:
            self._guard("caBundle", lambda: self._ensure_ca(bundle))
        now = time.monotonic()
        if leader and now - self._last_gc >= self.settings.gc_interval_s:
            self._last_gc = now
            self._guard("template gc", self.collector.collect)

    def _guard(self, step: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:  # retried next tick; the webhook keeps serving meanwhile
            log.warning("webhook maintenance step failed", step=step, error=str(exc))

    def _revive_server(self) -> None:
        # serve_forever ends only on shutdown() or an error in its accept loop; in the second case the
        # API server's admission calls would fail (failurePolicy) while /healthz stayed 200.
        server = self.server
        if server is None or server.alive() or self.stop_event.is_set():
            return
        log.error("webhook https server stopped unexpectedly; starting it again", port=server.port)
        self.serving.clear()
        try:
            server.stop()
        except Exception as exc:  # its socket may already be gone
            log.warning("closing the stopped webhook server failed", error=str(exc))
        self.server = None  # _refresh_certificate starts a new one with the current certificate

    def _refresh_certificate(self, leader: bool) -> None:
        bundle = self.source.refresh(leader)
        if bundle is None:
            return
        self._bundle = bundle
        if self.tls.update(bundle):
            log.info(
                "webhook serving certificate loaded", not_after=bundle.serving.not_valid_after_utc.isoformat()
            )
        if self.server is None:
            s = self.settings
            self.server = WebhookServer(
                s.address, s.port, s.path, self.handler, self.tls, registry=self.handler.metrics.registry
            )
            self.server.start()
            self.serving.set()
            log.info("webhook serving", address=s.address, port=self.server.port, path=s.path)

    def _ensure_ca(self, bundle: CertBundle) -> None:
        # Checked every tick (one GET): a Helm upgrade re-renders the configuration without it.
        ensure_ca_bundle(self.api, self.settings.configuration, bundle.ca_pem)
