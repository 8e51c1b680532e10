"""Defect 3 (controller process): every background loop survives any exception with backoff, and the
metrics port's /healthz reports a dead or stuck loop. The API server is a real TCP endpoint that drops
every request (the kubernetes client then raises urllib3's MaxRetryError after its own retries) or
accepts and never answers (a hung list: stuck), not an exception the test made up."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s

from controller.runtime.process import ControllerProcess, ProcessOptions


class TcpApiServer:
    """Accepts connections; `answer=False` reads the request and closes, `hang=True` never answers."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.requests = 0
        self.held: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.requests += 1
            if self.hang:
                self.held.append(conn)  # open, silent: the client waits for its read timeout
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(4096)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        for conn in self.held:
            conn.close()
        self.sock.close()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def process_for() -> Iterator[Callable[[TcpApiServer, float], ControllerProcess]]:
    started: list[tuple[ControllerProcess, threading.Thread]] = []

    def make(server: TcpApiServer, stuck_after_s: float) -> ControllerProcess:
        api = k8s.ApiClient(k8s.Configuration(host=server.url))
        options = ProcessOptions(
            identity="t",
            metrics_port=0,
            metrics_address="127.0.0.1",
            reflector_stuck_after_s=stuck_after_s,
            lease_s=3.0,
            renew_deadline_s=2.0,
            retry_s=0.5,
        )
        process = ControllerProcess(api, options)
        thread = threading.Thread(target=process.run, daemon=True)
        thread.start()
        started.append((process, thread))
        return process

    yield make
    for process, thread in started:
        process.stop_event.set()
        thread.join(10)


def test_loops_survive_max_retry_errors_and_healthz_says_so(
    process_for: Callable[[TcpApiServer, float], ControllerProcess],
) -> None:
    server = TcpApiServer(hang=False)
    try:
        process = process_for(server, 300.0)
        reflector = process.cache.reflectors[0].runner
        assert process.elector is not None
        elector = process.elector.runner
        # Several failures each, with requests still arriving: no loop ended on the first error.
        assert _wait(lambda: reflector.failures >= 3 and elector.failures >= 3, 40), (
            reflector.health(),
            elector.health(),
        )
        assert "MaxRetryError" in reflector.last_error
        assert process.metrics_port is not None
        status, text = _healthz(process.metrics_port)
        assert status == 200, text
        assert "reflector-resourceslices retrying after" in text and "leader-election" in text
        assert "allocation" in text and "metrics-http ok" in text
        before = server.requests
        assert _wait(lambda: server.requests > before, 20), "the loops stopped calling the API server"
        assert not process.leading()  # no lease could be written: never leader, never writes
        errors = process.metrics.registry.get_sample_value(
            "flexmig_controller_loop_errors_total", {"loop": reflector.name}
        )
        assert errors is not None and errors >= 1
    finally:
        server.close()


def test_healthz_is_503_naming_a_stuck_reflector(
    process_for: Callable[[TcpApiServer, float], ControllerProcess],
) -> None:
    server = TcpApiServer(hang=True)
    try:
        process = process_for(server, 1.0)  # the LIST hangs (read timeout 120 s): stuck after 1 s
        assert process.metrics_port is not None
        port = process.metrics_port
        assert _wait(lambda: _healthz(port)[0] == 503, 20), _healthz(port)
        status, text = _healthz(port)
        assert status == 503 and "FAIL loop reflector-resourceslices is stuck" in text, text
        assert process.cache.reflectors[0].runner.health().ok is False
        # The lease requests time out (read timeout 1 s): the elector fails and goes on, it is not stuck.
        assert process.elector is not None
        elector = process.elector.runner
        assert _wait(lambda: "ReadTimeoutError" in elector.last_error and elector.failures >= 2, 30), (
            elector.health()
        )
        assert elector.health().ok and "ok   loop leader-election" in _healthz(port)[1]
    finally:
        server.close()


def test_a_dead_loop_makes_healthz_503(
    process_for: Callable[[TcpApiServer, float], ControllerProcess],
) -> None:
    """A loop that ended without being stopped (only a BaseException can do that) is reported."""
    server = TcpApiServer(hang=False)
    try:
        process = process_for(server, 300.0)
        runner = process.cache.reflectors[1].runner

        def die() -> None:
            raise SystemExit("gone")

        assert _wait(lambda: runner.health().reason != f"loop {runner.name} not started", 10)
        runner._body = die  # the next iteration ends the thread
        assert process.metrics_port is not None
        port = process.metrics_port
        assert _wait(lambda: _healthz(port)[0] == 503, 60), _healthz(port)
        assert f"{runner.name} is dead" in _healthz(port)[1]
    finally:
        server.close()


def test_the_writer_checks_the_electors_leadership() -> None:
    api = k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))
    process = ControllerProcess(api, ProcessOptions(identity="t"))
    assert process.elector is not None and not process.elector.is_leader()
    assert not process.writer.is_leader()
    process.elector._renewed_at = process.elector._clock()  # as after a successful renew round
    assert process.writer.is_leader()
