"""PluginServers in-process: socket takeover rules, shutdown behaviour, health streams, and the
servicers' defences against a misbehaving preparer, over real unix sockets.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from api.constants import DRIVER_NAME
from api.gen.dra_health_v1 import api_pb2 as h1_pb2
from api.gen.dra_health_v1 import api_pb2_grpc as h1_grpc
from api.gen.dra_v1 import api_pb2 as v1_pb2
from api.gen.dra_v1 import api_pb2_grpc as v1_grpc
from api.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from api.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from kubeletplugin.grpcserver import (
    ClaimRef,
    DeviceHealthState,
    Health,
    PluginServers,
    PreparedDevice,
    PrepareResult,
    RegistrationServicer,
    RegistrationState,
    install_signal_handlers,
)

TIMEOUT = 10.0


class TablePreparer:
    """Answers from fixed tables; records what it was asked."""

    def __init__(self, prepare: dict[str, Any], unprepare: dict[str, Any] | None = None) -> None:
        self._prepare = prepare
        self._unprepare = unprepare or {}
        self.seen: list[list[str]] = []

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        self.seen.append([c.uid for c in claims])
        return dict(self._prepare)

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        return dict(self._unprepare)


class CountingHealthSource:
    """Healthy single device; counts wait_for_change calls, changes when told to."""

    def __init__(self) -> None:
        self.waits = 0
        self.fail = False
        self._changed = threading.Event()
        self._lock = threading.Lock()

    def snapshot(self) -> Sequence[DeviceHealthState]:
        if self.fail:
            raise RuntimeError("nvml went away")
        return [DeviceHealthState("pool", "gpu-0", Health.HEALTHY, int(time.time()))]

    def wait_for_change(self, timeout_s: float) -> bool:
        with self._lock:
            self.waits += 1
        changed = self._changed.wait(timeout_s)
        self._changed.clear()
        return changed

    def poke(self) -> None:
        self._changed.set()


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _servers(root: Path, preparer: Any = None, **kw: Any) -> PluginServers:
    return PluginServers(
        preparer if preparer is not None else TablePreparer({}),
        registry_dir=root / "reg",
        plugins_dir=root / "plugins",
        **kw,
    )


def _channel(path: Path) -> grpc.Channel:
    ch = grpc.insecure_channel(f"unix:{path}")
    grpc.channel_ready_future(ch).result(timeout=TIMEOUT)
    return ch


def test_refuses_to_replace_a_non_socket_file(root: Path) -> None:
    s = _servers(root)
    s.dra_socket.parent.mkdir(parents=True)
    s.dra_socket.write_text("not a socket")
    with pytest.raises(FileExistsError) as exc:
        s.start()
    assert exc.value.errno == errno.EEXIST
    assert s.dra_socket.read_text() == "not a socket"
    assert not s.registration_socket.exists()


def test_refuses_to_steal_a_live_socket(root: Path) -> None:
    first = _servers(root)
    first.start()
    try:
        second = _servers(root)
        with pytest.raises(FileExistsError) as exc:
            second.start()
        assert exc.value.errno == errno.EADDRINUSE
        info = reg_grpc.RegistrationStub(_channel(first.registration_socket)).GetInfo(
            reg_pb2.InfoRequest(), timeout=TIMEOUT
        )
        assert info.name == DRIVER_NAME
    finally:
        first.stop(0)


def test_socket_path_length_is_checked_up_front() -> None:
    deep = Path("/tmp") / ("x" * 90)
    with pytest.raises(ValueError, match="too long"):
        PluginServers(TablePreparer({}), registry_dir=deep, plugins_dir=deep)


def test_without_health_source_health_is_not_advertised(root: Path) -> None:
    s = _servers(root)
    s.start()
    try:
        info = reg_grpc.RegistrationStub(_channel(s.registration_socket)).GetInfo(
            reg_pb2.InfoRequest(), timeout=TIMEOUT
        )
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        stream = h1_grpc.DRAResourceHealthStub(_channel(s.dra_socket)).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest(), timeout=TIMEOUT
        )
        with pytest.raises(grpc.RpcError) as exc:
            next(stream)
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        s.stop(0)


def test_stop_is_prompt_with_open_health_streams_and_idempotent(root: Path) -> None:
    source = CountingHealthSource()
    s = _servers(root, health_source=source, health_poll_s=0.05)
    s.start()
    stub = h1_grpc.DRAResourceHealthStub(_channel(s.dra_socket))
    streams = [stub.NodeWatchResources(h1_pb2.NodeWatchResourcesRequest(), timeout=30) for _ in range(3)]
    for st in streams:
        assert len(next(st).devices) == 1
    started = time.monotonic()
    s.stop(grace_s=20)
    # Held for the grace period, stop() would return after 20 s; half of it is room for a loaded machine.
    assert time.monotonic() - started < 10
    assert s.stopped and s.wait(0)
    assert not s.dra_socket.exists() and not s.registration_socket.exists()
    for st in streams:
        with pytest.raises((StopIteration, grpc.RpcError)):
            next(st)
    s.stop()  # second stop is a no-op
    with pytest.raises(RuntimeError):
        s.start()


def test_client_cancel_ends_the_server_side_loop(root: Path) -> None:
    source = CountingHealthSource()
    s = _servers(root, health_source=source, health_poll_s=0.02)
    s.start()
    try:
        stream = h1_grpc.DRAResourceHealthStub(_channel(s.dra_socket)).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest(), timeout=30
        )
        next(stream)
        source.poke()
        next(stream)  # a change is delivered
        stream.cancel()
        # Nobody polls for a client that is gone: a live loop counts a wait every 0.02 s, so a count
        # unchanged for 0.3 s means it ended. It ends within a poll or two; the deadline only covers
        # a loaded machine, where the cancel itself takes a while to reach the server.
        deadline = time.monotonic() + 10
        before = source.waits
        while True:
            time.sleep(0.3)
            if source.waits == before:
                break
            assert time.monotonic() < deadline, f"still polling {source.waits} times after the cancel"
            before = source.waits
    finally:
        s.stop(0)


def test_periodic_resend_without_changes(root: Path) -> None:
    s = _servers(root, health_source=CountingHealthSource(), health_poll_s=0.02, health_resend_s=0.1)
    s.start()
    try:
        stream = h1_grpc.DRAResourceHealthStub(_channel(s.dra_socket)).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest(), timeout=30
        )
        t0 = time.monotonic()
        for _ in range(3):
            assert len(next(stream).devices) == 1
        assert time.monotonic() - t0 < 3
        stream.cancel()
    finally:
        s.stop(0)


def test_failing_health_source_ends_stream_with_error(root: Path) -> None:
    source = CountingHealthSource()
    source.fail = True
    s = _servers(root, health_source=source)
    s.start()
    try:
        stream = h1_grpc.DRAResourceHealthStub(_channel(s.dra_socket)).NodeWatchResources(
            h1_pb2.NodeWatchResourcesRequest(), timeout=TIMEOUT
        )
        with pytest.raises(grpc.RpcError) as exc:
            next(stream)
        assert exc.value.code() == grpc.StatusCode.UNKNOWN
    finally:
        s.stop(0)


def test_invalid_and_unrequested_results_are_contained(root: Path) -> None:
    good = PrepareResult(devices=[PreparedDevice(["r"], "pool", "gpu-0", ["k8s.gpu.flexmig.dev/claim=x"])])
    bad = PrepareResult(devices=[PreparedDevice(["r"], "pool", 42, [])])  # type: ignore[arg-type]
    preparer = TablePreparer(
        {"u-good": good, "u-bad": bad, "u-stranger": good},
        unprepare={"u-good": None, "u-bad": "still in use", "u-stranger": None},
    )
    s = _servers(root, preparer)
    s.start()
    try:
        stub = v1_grpc.DRAPluginStub(_channel(s.dra_socket))
        claims = [v1_pb2.Claim(namespace="n", uid=u, name=u) for u in ("u-good", "u-bad")]
        resp = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=TIMEOUT)
        assert set(resp.claims) == {"u-good", "u-bad"}  # the unrequested claim is dropped
        assert resp.claims["u-good"].error == ""
        assert resp.claims["u-good"].devices[0].device_name == "gpu-0"
        assert resp.claims["u-bad"].error.startswith("driver returned an invalid result: TypeError")
        assert len(resp.claims["u-bad"].devices) == 0
        assert preparer.seen == [["u-good", "u-bad"]]

        un = stub.NodeUnprepareResources(v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=TIMEOUT)
        assert {u: r.error for u, r in un.claims.items()} == {"u-good": "", "u-bad": "still in use"}
    finally:
        s.stop(0)


class NonePreparer:
    """Breaks the contract by returning None instead of a mapping."""

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        return None  # type: ignore[return-value]

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str | None]:
        return None  # type: ignore[return-value]


def test_result_of_the_wrong_type_becomes_per_claim_errors(root: Path) -> None:
    s = _servers(root, NonePreparer())
    s.start()
    try:
        stub = v1_grpc.DRAPluginStub(_channel(s.dra_socket))
        claims = [v1_pb2.Claim(namespace="n", uid=u, name=u) for u in ("u1", "u2")]
        resp = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=TIMEOUT)
        assert {u: r.error.split(":")[0] for u, r in resp.claims.items()} == {
            "u1": "TypeError",
            "u2": "TypeError",
        }
        un = stub.NodeUnprepareResources(v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=TIMEOUT)
        assert {u: r.error.split(":")[0] for u, r in un.claims.items()} == {
            "u1": "TypeError",
            "u2": "TypeError",
        }
    finally:
        s.stop(0)


def test_registration_state_survives_a_failing_callback(root: Path) -> None:
    calls: list[bool] = []

    def callback() -> None:
        calls.append(state.registered)
        raise RuntimeError("publisher not ready")

    state = RegistrationState(callback)
    s = _servers(root, registration_state=state)
    s.start()
    try:
        assert not state.wait_registered(0.01)
        stub = reg_grpc.RegistrationStub(_channel(s.registration_socket))
        stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=False, error="bad"), timeout=TIMEOUT
        )
        assert (state.registered, state.error, state.notifications) == (False, "bad", 1)
        assert calls == []
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT)
        assert state.wait_registered(1)
        assert calls == [True]  # the callback already sees the new state
        st = state.status()
        assert (st.registered, st.error, st.notifications, st.registrations) == (True, "", 2, 1)
    finally:
        s.stop(0)


def test_registration_state_is_thread_safe() -> None:
    fired: list[int] = []
    lock = threading.Lock()

    def callback() -> None:
        with lock:
            fired.append(1)

    state = RegistrationState()
    state.set_on_registered(callback)

    def hammer() -> None:
        for _ in range(200):
            state.record(True, "")

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state.status().notifications == 1600
    assert state.status().registrations == 1600
    assert len(fired) == 1600


def test_registration_servicer_validates_its_inputs() -> None:
    with pytest.raises(ValueError, match="absolute"):
        RegistrationServicer(DRIVER_NAME, "plugins/dra.sock", ["v1.DRAPlugin"], RegistrationState())
    with pytest.raises(ValueError, match="DRAPlugin"):
        RegistrationServicer(DRIVER_NAME, "/x/dra.sock", ["v1.DRAResourceHealth"], RegistrationState())


def test_signal_handler_stops_the_servers(root: Path) -> None:
    s = _servers(root)
    previous = install_signal_handlers(s, grace_s=1, signals=(signal.SIGUSR1,))
    try:
        s.start()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert s.wait(10)
        assert not s.dra_socket.exists() and not s.registration_socket.exists()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
