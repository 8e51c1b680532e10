"""Self-signed certificates: what is issued, and when and how rotation happens (fake clock)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from controller.webhook.certs import (
    BACKDATE,
    CertBundle,
    CertError,
    CertPolicy,
    generate,
    rotate,
    rotation_reason,
    san_hosts,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
POLICY = CertPolicy(
    ca_validity=dt.timedelta(days=300),
    cert_validity=dt.timedelta(days=30),
    propagation=dt.timedelta(minutes=2),
)
HOSTS = ("flexmig-webhook.flexmig-system.svc", "127.0.0.1")


def verifies(bundle: CertBundle) -> bool:
    """Whether some CA of the trust bundle signed the serving certificate."""
    for ca in bundle.trust:
        try:
            bundle.serving.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):
            continue
    return False


def test_generated_bundle_serves_the_hosts_and_verifies() -> None:
    bundle = generate(HOSTS, T0, POLICY)
    assert verifies(bundle)
    assert san_hosts(bundle.serving) == set(HOSTS)
    serving = bundle.serving
    assert serving.not_valid_before_utc == T0 - BACKDATE
    assert serving.not_valid_after_utc == T0 + POLICY.cert_validity
    ca = bundle.trust[0]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert rotation_reason(bundle, HOSTS, T0, POLICY) is None


def test_serving_certificate_is_renewed_at_two_thirds_of_its_life_by_the_same_ca() -> None:
    bundle = generate(HOSTS, T0, POLICY)
    assert rotation_reason(bundle, HOSTS, T0 + dt.timedelta(days=19), POLICY) is None
    later = T0 + dt.timedelta(days=21)
    reason = rotation_reason(bundle, HOSTS, later, POLICY)
    assert reason is not None and "serving certificate expires" in reason
    renewed = rotate(bundle, HOSTS, later, POLICY)
    assert renewed.ca_pem == bundle.ca_pem and renewed.ca_key_pem == bundle.ca_key_pem
    assert renewed.serving.not_valid_after_utc == later + POLICY.cert_validity
    assert renewed.fingerprint() != bundle.fingerprint()
    assert verifies(renewed)
    assert rotation_reason(renewed, HOSTS, later, POLICY) is None


def test_a_new_host_reissues_the_serving_certificate() -> None:
    bundle = generate(HOSTS[:1], T0, POLICY)
    reason = rotation_reason(bundle, HOSTS, T0, POLICY)
    assert reason == "the serving certificate lacks host(s) 127.0.0.1"
    assert san_hosts(rotate(bundle, HOSTS, T0, POLICY).serving) == set(HOSTS)


def test_ca_rotation_trusts_the_new_ca_before_serving_with_it() -> None:
    bundle = generate(HOSTS, T0, POLICY)
    t1 = T0 + dt.timedelta(days=201)  # past 2/3 of the CA's 300 days
    assert "CA expires" in str(rotation_reason(bundle, HOSTS, t1, POLICY))
    step1 = rotate(bundle, HOSTS, t1, POLICY)
    # The old serving certificate (about to be renewed anyway) would be kept only while valid; here
    # it expired long ago (30-day certificates), so step 1 also issues one from the new CA.
    assert len(step1.trust) == 2 and step1.trust[1] == bundle.trust[0]
    assert verifies(step1)


def test_ca_rotation_keeps_the_old_serving_certificate_until_the_new_ca_propagated() -> None:
    policy = CertPolicy(
        ca_validity=dt.timedelta(days=30), cert_validity=dt.timedelta(days=30), propagation=POLICY.propagation
    )
    bundle = generate(HOSTS, T0, policy)  # serving certificate capped at the CA's end
    t1 = T0 + dt.timedelta(days=21)
    step1 = rotate(bundle, HOSTS, t1, policy)
    assert step1.cert_pem == bundle.cert_pem, "the old certificate keeps serving in step 1"
    assert step1.trust[1] == bundle.trust[0] and step1.trust[0] != bundle.trust[0]
    assert verifies(step1)
    assert rotation_reason(step1, HOSTS, t1 + dt.timedelta(minutes=1), policy) is None
    t2 = t1 + dt.timedelta(minutes=3)
    assert (
        rotation_reason(step1, HOSTS, t2, policy)
        == "the serving certificate is not yet signed by the current CA"
    )
    step2 = rotate(step1, HOSTS, t2, policy)
    step2.serving.verify_directly_issued_by(step2.trust[0])
    assert step2.trust[1] == bundle.trust[0], "the old CA stays trusted while it is valid"
    assert rotation_reason(step2, HOSTS, t2, policy) is None
    # Once the old CA has expired it leaves the bundle at the next renewal.
    t3 = T0 + dt.timedelta(days=35)  # old CA expired at day 30; the new one is not due
    step3 = rotate(step2, HOSTS, t3, policy)
    assert [c.subject for c in step3.trust] == [step2.trust[0].subject]


def test_an_unreadable_bundle_is_reported() -> None:
    bundle = generate(HOSTS, T0, POLICY)
    broken = CertBundle(b"not pem", bundle.ca_key_pem, b"junk", bundle.key_pem)
    with pytest.raises(CertError, match="serving certificate"):
        broken.serving  # noqa: B018
    with pytest.raises(CertError, match="at least one host"):
        generate((), T0, POLICY)
