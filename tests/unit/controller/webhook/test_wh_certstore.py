"""The shared certificate Secret: the leader creates and renews it, other replicas only read it;
a provided directory is reloaded when its files change."""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from wh_fakeapi import FakeApi

from controller.webhook.certs import CertBundle, CertError, CertPolicy, generate, rotation_reason
from controller.webhook.certstore import (
    DirCertSource,
    SecretCertSource,
    bundle_from_secret,
    secret_data,
    secret_path,
)

NS, NAME = "flexmig-system", "flexmig-webhook-cert"
HOSTS = ("flexmig-webhook.flexmig-system.svc",)
T0 = dt.datetime.now(dt.UTC)
POLICY = CertPolicy(ca_validity=dt.timedelta(days=300), cert_validity=dt.timedelta(days=30))


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> dt.datetime:
        return self.t


def source(clock: Clock, hosts: tuple[str, ...] = HOSTS) -> SecretCertSource:
    return SecretCertSource(None, NS, NAME, hosts, policy=POLICY, clock=clock)


def test_a_follower_waits_and_the_leader_creates(fake_api: FakeApi) -> None:
    clock = Clock()
    follower, leader = source(clock), source(clock)
    assert follower.refresh(leader=False) is None
    assert fake_api.writes() == []
    made = leader.refresh(leader=True)
    assert made is not None
    secret = fake_api.get(secret_path(NS, NAME))
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    assert bundle_from_secret(secret) == made
    assert follower.refresh(leader=False) == made
    assert leader.refresh(leader=True) == made and len(fake_api.writes()) == 1  # nothing due


def test_the_leader_renews_before_expiry_and_followers_follow(fake_api: FakeApi) -> None:
    clock = Clock()
    leader, follower = source(clock), source(clock)
    first = leader.refresh(leader=True)
    assert first is not None
    clock.t = T0 + dt.timedelta(days=21)
    assert follower.refresh(leader=False) == first, "a follower never renews"
    renewed = leader.refresh(leader=True)
    assert renewed is not None and renewed.fingerprint() != first.fingerprint()
    assert rotation_reason(renewed, HOSTS, clock.t, POLICY) is None
    assert follower.refresh(leader=False) == renewed


def test_a_lost_create_race_leaves_the_winner_in_place(fake_api: FakeApi) -> None:
    clock = Clock()
    a, b = source(clock), source(clock)
    winner = a.refresh(leader=True)
    # b read before a's Secret existed (a stale read), so it tries to create one too: 409.
    real_read = b._read
    stale = [True]

    def read_once_stale() -> dict[str, object] | None:
        if stale.pop() if stale else False:
            return None
        return real_read()

    b._read = read_once_stale  # type: ignore[method-assign]
    assert b.refresh(leader=True) is None
    assert fake_api.writes().count(("POST", secret_path(NS))) == 2
    assert b.refresh(leader=True) == winner, "the next round reads the winner's certificate"
    stored = fake_api.get(secret_path(NS, NAME))
    assert stored is not None and bundle_from_secret(stored) == winner


def test_a_broken_secret_is_replaced_by_the_leader_only(fake_api: FakeApi) -> None:
    clock = Clock()
    fake_api.put(
        secret_path(NS), {"metadata": {"name": NAME, "namespace": NS}, "data": {"tls.crt": "bm90IHBlbQ=="}}
    )
    assert source(clock).refresh(leader=False) is None
    fixed = source(clock).refresh(leader=True)
    assert fixed is not None
    stored = fake_api.get(secret_path(NS, NAME))
    assert stored is not None and bundle_from_secret(stored) == fixed


def test_a_new_host_is_added_by_the_leader(fake_api: FakeApi) -> None:
    clock = Clock()
    source(clock).refresh(leader=True)
    wider = source(clock, (*HOSTS, "127.0.0.1")).refresh(leader=True)
    assert wider is not None and rotation_reason(wider, (*HOSTS, "127.0.0.1"), T0, POLICY) is None


def test_provided_files_are_reloaded_when_they_change(tmp_path: Path) -> None:
    first = generate(("a.example",), T0)
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    src = DirCertSource(tmp_path)
    assert src.refresh(leader=True) is not None and src.refresh(leader=True).cert_pem == first.cert_pem  # type: ignore[union-attr]
    second = generate(("a.example",), T0)
    (tmp_path / "tls.crt").write_bytes(second.cert_pem)
    (tmp_path / "tls.key").write_bytes(second.key_pem)
    future = (tmp_path / "tls.crt").stat().st_mtime + 5
    os.utime(tmp_path / "tls.crt", (future, future))
    got = src.refresh(leader=False)
    assert got is not None and got.cert_pem == second.cert_pem
    # A half-written update keeps the last good certificate.
    (tmp_path / "tls.crt").write_bytes(b"garbage")
    os.utime(tmp_path / "tls.crt", (future + 5, future + 5))
    got = src.refresh(leader=False)
    assert got is not None and got.cert_pem == second.cert_pem
    # A certificate with another pair's key, then a junk key: still the last good pair.
    third = generate(("a.example",), T0)
    (tmp_path / "tls.crt").write_bytes(third.cert_pem)
    os.utime(tmp_path / "tls.crt", (future + 10, future + 10))
    got = src.refresh(leader=False)
    assert got is not None and (got.cert_pem, got.key_pem) == (second.cert_pem, second.key_pem)
    (tmp_path / "tls.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\njunk\n-----END PRIVATE KEY-----\n")
    os.utime(tmp_path / "tls.key", (future + 15, future + 15))
    got = src.refresh(leader=False)
    assert got is not None and got.cert_pem == second.cert_pem
    # The matching key arrives: the new pair is served.
    (tmp_path / "tls.key").write_bytes(third.key_pem)
    os.utime(tmp_path / "tls.key", (future + 20, future + 20))
    got = src.refresh(leader=False)
    assert got is not None and (got.cert_pem, got.key_pem) == (third.cert_pem, third.key_pem)


def test_dir_source_names_the_file_it_cannot_use(tmp_path: Path) -> None:
    pair, other = generate(("a.example",), T0), generate(("a.example",), T0)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(other.key_pem)
    with capture_logs() as logs:
        assert DirCertSource(tmp_path).refresh(leader=False) is None
    errors = [str(e.get("error")) for e in logs]
    assert any(e.startswith("tls.key: does not belong to the certificate") for e in errors), errors
    (tmp_path / "tls.crt").write_bytes(b"junk")
    with capture_logs() as logs:
        assert DirCertSource(tmp_path).refresh(leader=False) is None
    assert any(str(e.get("error")).startswith("tls.crt: ") for e in logs), logs


def _secret_with(bundle: CertBundle, **replace: bytes) -> dict[str, Any]:
    data = secret_data(bundle)
    data.update({k: base64.b64encode(v).decode() for k, v in replace.items()})
    return {"metadata": {"name": NAME, "namespace": NS}, "type": "kubernetes.io/tls", "data": data}


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("tls.key", "data.tls.key: does not belong to the certificate"),
        ("ca.key", "data.ca.key (for the first certificate of data.ca.crt): does not belong"),
    ],
)
def test_secret_keys_must_match_their_certificates(field: str, message: str) -> None:
    good, other = generate(HOSTS, T0), generate(HOSTS, T0)
    wrong = other.key_pem if field == "tls.key" else other.ca_key_pem
    with pytest.raises(CertError, match=re.escape(message)):
        bundle_from_secret(_secret_with(good, **{field: wrong}))
    with pytest.raises(CertError, match=re.escape(f"data.{field}")):
        bundle_from_secret(_secret_with(good, **{field: b"junk"}))
    assert bundle_from_secret(_secret_with(good)) == good


def test_a_secret_with_a_mismatched_key_is_regenerated_by_the_leader(fake_api: FakeApi) -> None:
    clock = Clock()
    good, other = generate(HOSTS, T0), generate(HOSTS, T0)
    fake_api.put(secret_path(NS), _secret_with(good, **{"ca.key": other.ca_key_pem}))
    assert source(clock).refresh(leader=False) is None, "a follower does not serve a broken Secret"
    fixed = source(clock).refresh(leader=True)
    assert fixed is not None and fixed.ca_pem != good.ca_pem
    stored = fake_api.get(secret_path(NS, NAME))
    assert stored is not None and bundle_from_secret(stored) == fixed
