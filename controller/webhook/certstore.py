"""Where the webhook's certificate comes from: a Secret every replica shares, or files someone else
maintains (a mounted `kubernetes.io/tls` Secret, e.g. from cert-manager).

Self-generated (`SecretCertSource`): the Secret holds the CA (and its key) and the serving
certificate, so all replicas serve certificates one CA bundle verifies. Only the leader writes it:
it creates the Secret when missing and rotates it before expiry (`certs.rotation_reason`), each
write carrying the resourceVersion it read, so a replica that lost the lead between read and write
gets 409 instead of overwriting. Every replica re-reads the Secret each round and picks up changes.

Provided (`DirCertSource`): `tls.crt`/`tls.key` (and `ca.crt` if present) are re-read whenever their
modification time changes, which is how kubelet delivers an updated Secret volume.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
from kubernetes.client.exceptions import ApiException

from controller.kube.rest import request
from controller.webhook.certs import (
    DEFAULT_POLICY,
    CertBundle,
    CertError,
    CertPolicy,
    check_key,
    generate,
    rotate,
    rotation_reason,
)

log = structlog.get_logger(__name__)
T = TypeVar("T")

KEYS = {"ca_pem": "ca.crt", "ca_key_pem": "ca.key", "cert_pem": "tls.crt", "key_pem": "tls.key"}
MANAGED_LABELS = {"app.kubernetes.io/managed-by": "flexmig", "app.kubernetes.io/component": "webhook-cert"}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertSource(Protocol):
    self_generated: bool

    def refresh(self, leader: bool) -> CertBundle | None:
        """The bundle to serve now (None: none yet); the leader may create or renew it."""


def secret_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


def bundle_from_secret(secret: dict[str, Any]) -> CertBundle:
    data = secret.get("data") or {}
    values: dict[str, bytes] = {}
    for field, key in KEYS.items():
        if not data.get(key):
            raise CertError(f"data.{key}: missing")
        try:
            values[field] = base64.b64decode(data[key], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CertError(f"data.{key}: not base64 ({exc})") from exc
    bundle = CertBundle(**values)
    # Parse and pair now, so a broken Secret is reported (and the leader replaces it) here, and not
    # at serve time or as a rotation that fails every round.
    serving = _named("data.tls.crt", lambda: bundle.serving)
    trust = _named("data.ca.crt", lambda: bundle.trust)
    if not trust:
        raise CertError("data.ca.crt: no certificate")
    check_key(serving, bundle.key_pem, "data.tls.key")
    check_key(
        trust[0], bundle.ca_key_pem, "data.ca.key (for the first certificate of data.ca.crt)", ec_only=True
    )
    return bundle


def _named(field: str, load: Callable[[], T]) -> T:
    """load(), with a CertError's message prefixed by the Secret field or file it came from."""
    try:
        return load()
    except CertError as exc:
        raise CertError(f"{field}: {exc}") from exc


def secret_data(bundle: CertBundle) -> dict[str, str]:
    return {key: base64.b64encode(getattr(bundle, field)).decode() for field, key in KEYS.items()}


class SecretCertSource:
    self_generated = True

    def __init__(
        self,
        api: Any,
        namespace: str,
        name: str,
        hosts: Sequence[str],
        *,
        policy: CertPolicy = DEFAULT_POLICY,
        clock: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        if not hosts:
            raise ValueError("a self-generated webhook certificate needs at least one host (service or IP)")
        self.api = api
        self.namespace, self.name = namespace, name
        self.hosts = tuple(dict.fromkeys(hosts))
        self.policy = policy
        self.clock = clock
        self._last: CertBundle | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            return request(self.api, "GET", secret_path(self.namespace, self.name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def refresh(self, leader: bool) -> CertBundle | None:
        secret = self._read()
        bundle: CertBundle | None = None
        problem = ""
        if secret is not None:
            try:
                bundle = bundle_from_secret(secret)
            except CertError as exc:
                problem = str(exc)
                log.warning("webhook certificate secret is unusable", secret=self._key, problem=problem)
        if leader:
            now = self.clock()
            if secret is None:
                bundle = self._create(generate(self.hosts, now, self.policy)) or bundle
            else:
                reason = problem or (bundle and rotation_reason(bundle, self.hosts, now, self.policy))
                if reason:
                    renewed = (
                        rotate(bundle, self.hosts, now, self.policy)
                        if bundle is not None
                        else generate(self.hosts, now, self.policy)
                    )
                    bundle = self._update(secret, renewed, str(reason)) or bundle
        if bundle is not None:
            self._last = bundle
        return self._last

    @property
    def _key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _create(self, bundle: CertBundle) -> CertBundle | None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(MANAGED_LABELS)},
            "type": "kubernetes.io/tls",
            "data": secret_data(bundle),
        }
        try:
            request(self.api, "POST", secret_path(self.namespace), body)
        except ApiException as exc:
            if exc.status == 409:  # another replica was first; its certificate is read next round
                return None
            raise
        log.info("webhook certificate created", secret=self._key, hosts=list(self.hosts))
        return bundle

    def _update(self, secret: dict[str, Any], bundle: CertBundle, reason: str) -> CertBundle | None:
        body = dict(secret)
        body["data"] = {**(secret.get("data") or {}), **secret_data(bundle)}
        try:
            request(self.api, "PUT", secret_path(self.namespace, self.name), body)
        except ApiException as exc:
            if exc.status in (404, 409):  # changed or deleted meanwhile: read again next round
                return None
            raise
        log.info("webhook certificate renewed", secret=self._key, reason=reason)
        return bundle


class DirCertSource:
    self_generated = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stamp: tuple[float, ...] | None = None
        self._last: CertBundle | None = None

    def refresh(self, leader: bool) -> CertBundle | None:
        files = [self.directory / n for n in ("tls.crt", "tls.key", "ca.crt")]
        stamp = tuple(f.stat().st_mtime if f.exists() else -1.0 for f in files)
        if stamp == self._stamp:
            return self._last
        try:
            cert, key = files[0].read_bytes(), files[1].read_bytes()
            ca = files[2].read_bytes() if files[2].exists() else b""
            bundle = CertBundle(ca_pem=ca, ca_key_pem=b"", cert_pem=cert, key_pem=key)
            # Fail here, with the file named, rather than at serve time; the last good pair stays.
            check_key(_named("tls.crt", lambda: bundle.serving), key, "tls.key")
        except (OSError, CertError) as exc:
            log.warning(
                "webhook certificate files are unusable", directory=str(self.directory), error=str(exc)
            )
            return self._last
        self._stamp, self._last = stamp, bundle
        log.info("webhook certificate loaded", directory=str(self.directory))
        return bundle
