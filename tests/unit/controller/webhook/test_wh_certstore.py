"""The shared certificate Secret: the leader creates and renews it, other replicas only read it;
a provided directory is reloaded when its files change."""

from __future__ import annotations

import base64
import datetime as dt
import os
from pathlib import Path

from wh_fakeapi import FakeApi

from controller.webhook.certs import CertPolicy, generate, rotation_reason
from controller.webhook.certstore import DirCertSource, SecretCertSource, bundle_from_secret, secret_path

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
    assert base64.b64encode(got.cert_pem)
