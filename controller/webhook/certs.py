"""The webhook's self-signed certificates: a CA, a serving certificate it signs, and when to renew them.

Pure functions of (bundle, hosts, now): no I/O, so rotation is tested with a fake clock.

Rotation keeps the API server able to verify every replica at every moment:
- the serving certificate is renewed once two thirds of its life have passed (or when the wanted
  hosts are no longer all in its SANs), signed by the current CA;
- the CA is renewed the same way, but in two steps: the new CA is first added to the trust bundle
  (new CA first, the old one kept while it is valid) while the old serving certificate stays in use;
  only after `propagation` has passed, time for the caBundle patch and every replica to catch up,
  is a serving certificate signed by the new CA issued.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BACKDATE = dt.timedelta(minutes=5)
"""Certificates start this long before they are made, so a peer whose clock is behind accepts them."""


class CertError(ValueError):
    """A certificate bundle that cannot be used (the message says which part and why)."""


@dataclass(frozen=True)
class CertPolicy:
    ca_validity: dt.timedelta = dt.timedelta(days=3 * 365)
    cert_validity: dt.timedelta = dt.timedelta(days=90)
    renew_fraction: float = 2 / 3
    """Renew once this fraction of a certificate's life has passed."""
    propagation: dt.timedelta = dt.timedelta(minutes=2)
    """How long a new CA sits in the trust bundle before a serving certificate signed by it is used."""


DEFAULT_POLICY = CertPolicy()


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes. `ca_pem` is the trust bundle (the signing CA first); `ca_key_pem` is empty for a
    certificate someone else issued (then nothing here renews it)."""

    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def serving(self) -> x509.Certificate:
        return _load_one(self.cert_pem, "serving certificate")

    @property
    def trust(self) -> list[x509.Certificate]:
        try:
            return x509.load_pem_x509_certificates(self.ca_pem)
        except ValueError as exc:
            raise CertError(f"CA bundle: not PEM certificates ({exc})") from exc

    def fingerprint(self) -> bytes:
        """Identifies the serving certificate (to notice a change without comparing PEM text)."""
        return self.serving.fingerprint(hashes.SHA256())


def _load_one(pem: bytes, what: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertError(f"{what}: not a PEM certificate ({exc})") from exc


def check_key(cert: x509.Certificate, key_pem: bytes, what: str, *, ec_only: bool = False) -> None:
    """Raise CertError naming `what` unless key_pem is an unencrypted PEM private key whose public
    key is the certificate's (and, with ec_only, an EC key, the only kind `issue_serving` signs with)."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # TypeError: encrypted
        raise CertError(f"{what}: not an unencrypted PEM private key ({exc})") from exc
    if ec_only and not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{what}: not an EC private key")
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*fmt) != cert.public_key().public_bytes(*fmt):
        raise CertError(f"{what}: does not belong to the certificate (its public key differs)")


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(now: dt.datetime, validity: dt.timedelta) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"flexmig-webhook-ca-{stamp}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue_serving(
    ca_cert_pem: bytes, ca_key_pem: bytes, hosts: Sequence[str], now: dt.datetime, validity: dt.timedelta
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `hosts` (DNS names or IP addresses), signed by the CA; it never
    outlives the CA."""
    if not hosts:
        raise CertError("a serving certificate needs at least one host name or IP address")
    ca_cert = _load_one(ca_cert_pem, "CA certificate")
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertError("CA key: not an EC private key")
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(hosts), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def generate(hosts: Sequence[str], now: dt.datetime, policy: CertPolicy = DEFAULT_POLICY) -> CertBundle:
    ca_pem, ca_key = new_ca(now, policy.ca_validity)
    cert, key = issue_serving(ca_pem, ca_key, hosts, now, policy.cert_validity)
    return CertBundle(ca_pem=ca_pem, ca_key_pem=ca_key, cert_pem=cert, key_pem=key)


def _due(cert: x509.Certificate, now: dt.datetime, fraction: float) -> bool:
    start, end = cert.not_valid_before_utc + BACKDATE, cert.not_valid_after_utc
    return now >= start + (end - start) * fraction


def san_hosts(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def rotation_reason(
    bundle: CertBundle, hosts: Sequence[str], now: dt.datetime, policy: CertPolicy = DEFAULT_POLICY
) -> str | None:
    """Why the bundle must be renewed now, or None. Raises CertError if it is unreadable."""
    trust = bundle.trust
    if not trust:
        return "the CA bundle is empty"
    signing, serving = trust[0], bundle.serving
    if _due(signing, now, policy.renew_fraction):
        return f"the CA expires at {signing.not_valid_after_utc.isoformat()}"
    if serving.issuer != signing.subject:
        if now >= signing.not_valid_before_utc + BACKDATE + policy.propagation:
            return "the serving certificate is not yet signed by the current CA"
        return None  # the new CA is still reaching the API server and the other replicas
    missing = set(hosts) - san_hosts(serving)
    if missing:
        return f"the serving certificate lacks host(s) {', '.join(sorted(missing))}"
    if _due(serving, now, policy.renew_fraction):
        return f"the serving certificate expires at {serving.not_valid_after_utc.isoformat()}"
    return None


def rotate(
    bundle: CertBundle, hosts: Sequence[str], now: dt.datetime, policy: CertPolicy = DEFAULT_POLICY
) -> CertBundle:
    """The renewed bundle (call when `rotation_reason` says so)."""
    trust = bundle.trust
    valid = [c for c in trust if c.not_valid_after_utc > now]
    if not valid or _due(trust[0], now, policy.renew_fraction):
        # Step 1 of a CA change: trust the new CA alongside the old one, keep serving the old
        # certificate while it is valid; `rotation_reason` asks for step 2 after `propagation`.
        ca_pem, ca_key = new_ca(now, policy.ca_validity)
        older = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in valid)
        serving_ok = bundle.serving.not_valid_after_utc > now + policy.propagation and bool(valid)
        if serving_ok:
            return CertBundle(ca_pem + older, ca_key, bundle.cert_pem, bundle.key_pem)
        cert, key = issue_serving(ca_pem, ca_key, hosts, now, policy.cert_validity)
        return CertBundle(ca_pem + older, ca_key, cert, key)
    signing_pem = trust[0].public_bytes(serialization.Encoding.PEM)
    cert, key = issue_serving(signing_pem, bundle.ca_key_pem, hosts, now, policy.cert_validity)
    kept = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in valid)
    return CertBundle(kept, bundle.ca_key_pem, cert, key)
