"""The HTTPS listener over a real socket: reviews, wrong paths, oversized bodies, a silent client,
and a rotated certificate picked up by the next connection without a restart."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import socket
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.webhook.certs import CertBundle, generate, rotate
from controller.webhook.server import MAX_BODY, TlsState, WebhookServer, bind_check

NOW = dt.datetime.now(dt.UTC)


def client_context(bundle: CertBundle) -> ssl.SSLContext:
    with tempfile.NamedTemporaryFile(suffix=".crt") as f:
        f.write(bundle.ca_pem)
        f.flush()
        return ssl.create_default_context(cafile=f.name)


def echo(body: bytes) -> tuple[int, bytes]:
    return 200, json.dumps({"got": len(body)}).encode()


@pytest.fixture
def served() -> Iterator[tuple[WebhookServer, TlsState, CertBundle]]:
    bundle = generate(("127.0.0.1", "localhost"), NOW)
    tls = TlsState()
    assert tls.update(bundle) and not tls.update(bundle)
    server = WebhookServer("127.0.0.1", 0, "/mutate-pods", echo, tls)
    server.start()
    try:
        yield server, tls, bundle
    finally:
        server.stop()


def post(
    port: int, ctx: ssl.SSLContext, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def peer_fingerprint(port: int, ctx: ssl.SSLContext) -> bytes:
    import hashlib

    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        der = s.getpeercert(binary_form=True)
        assert der is not None
        return hashlib.sha256(der).digest()


def test_reviews_are_answered_over_tls_on_the_path(
    served: tuple[WebhookServer, TlsState, CertBundle],
) -> None:
    server, _, bundle = served
    ctx = client_context(bundle)
    assert post(server.port, ctx, "/mutate-pods", b"12345") == (200, b'{"got": 5}')
    status, body = post(server.port, ctx, "/other", b"{}")
    assert status == 404 and b"/mutate-pods" in body
    status, body = post(server.port, ctx, "/mutate-pods", b"x", {"Content-Length": str(MAX_BODY + 1)})
    assert status == 413


def test_a_silent_client_does_not_block_others(served: tuple[WebhookServer, TlsState, CertBundle]) -> None:
    server, _, bundle = served
    with socket.create_connection(("127.0.0.1", server.port)):  # never sends a ClientHello
        started = time.monotonic()
        assert post(server.port, client_context(bundle), "/mutate-pods", b"{}")[0] == 200
        assert time.monotonic() - started < 5


def test_a_rotated_certificate_serves_the_next_connection(
    served: tuple[WebhookServer, TlsState, CertBundle],
) -> None:
    server, tls, bundle = served
    ctx = client_context(bundle)
    before = peer_fingerprint(server.port, ctx)
    assert before == bundle.fingerprint()
    renewed = rotate(bundle, ("127.0.0.1", "localhost"), NOW)  # a new serving certificate, same CA
    assert tls.update(renewed)
    assert peer_fingerprint(server.port, ctx) == renewed.fingerprint() != before


def test_an_untrusted_client_fails_the_handshake_and_the_server_goes_on(
    served: tuple[WebhookServer, TlsState, CertBundle],
) -> None:
    server, _, bundle = served
    stranger = client_context(generate(("127.0.0.1",), NOW))
    with pytest.raises(ssl.SSLError):
        post(server.port, stranger, "/mutate-pods", b"{}")
    assert post(server.port, client_context(bundle), "/mutate-pods", b"{}")[0] == 200


def test_bind_check_names_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        problem = bind_check("127.0.0.1", s.getsockname()[1])
    assert problem is not None and "cannot listen on 127.0.0.1" in problem
    assert bind_check("127.0.0.1", 0) is None


def raw_exchange(port: int, ctx: ssl.SSLContext, data: bytes) -> bytes:
    """Send bytes on one kept-alive connection; everything the server writes until it closes."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


# The body of a refused request is a complete second request: read as one, it would be answered 200.
SMUGGLED = b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (f"POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: {len(SMUGGLED)}\r\n", b"404"),
        (f"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n", b"413"),
        ("POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n", b"400"),
        ("POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: five\r\n", b"400"),
        ("POST /mutate-pods HTTP/1.1\r\nHost: x\r\n", b"411"),
    ],
)
def test_a_refused_request_closes_the_connection_with_its_body_unread(
    served: tuple[WebhookServer, TlsState, CertBundle], head: str, status: bytes
) -> None:
    server, _, bundle = served
    got = raw_exchange(server.port, client_context(bundle), head.encode() + b"\r\n" + SMUGGLED)
    assert got.startswith(b"HTTP/1.1 " + status), got[:80]
    assert got.count(b"HTTP/1.1 ") == 1, got
