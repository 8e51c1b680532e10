"""The plugin process as kubelet sees it: a separate process, real unix sockets, real gRPC calls.

The plugin runs tests/component/grpc_plugin_entry.py (PluginServers + an in-memory preparer); each
test plays kubelet against it with the generated client stubs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from api.constants import DRIVER_NAME
from api.gen.dra_health_v1 import api_pb2 as h1_pb2
from api.gen.dra_health_v1 import api_pb2_grpc as h1_grpc
from api.gen.dra_health_v1alpha1 import api_pb2 as h1a1_pb2
from api.gen.dra_health_v1alpha1 import api_pb2_grpc as h1a1_grpc
from api.gen.dra_v1 import api_pb2 as v1_pb2
from api.gen.dra_v1 import api_pb2_grpc as v1_grpc
from api.gen.dra_v1beta1 import api_pb2 as v1beta1_pb2
from api.gen.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from api.gen.pluginregistration_v1 import api_pb2 as reg_pb2
from api.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc

ENTRY = Path(__file__).with_name("grpc_plugin_entry.py")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 10.0  # per RPC; kubelet uses 45 s, tests want quick failures
# The plugin's shutdown grace period. Long, so that "the shutdown did not wait for it" is told apart
# from "the machine is slow" by a wide margin: a SIGTERMed plugin exits in ~0.2 s idle but slows with
# the load of a shared 2-CPU machine, where a 4 s bound under a 5 s grace period left too little room.
GRACE_S = 60.0


@dataclass
class Plugin:
    proc: subprocess.Popen[bytes]
    root: Path
    state_dir: Path
    reg_sock: Path
    dra_sock: Path

    def channel(self, path: Path) -> grpc.Channel:
        ch = grpc.insecure_channel(f"unix:{path}")
        grpc.channel_ready_future(ch).result(timeout=TIMEOUT)
        return ch

    def write_health(self, entries: list[dict[str, str]]) -> None:
        target = self.state_dir / "health.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, target)


@pytest.fixture
def plugin() -> Iterator[Plugin]:
    # Short absolute paths: sun_path holds at most 107 bytes, pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))
    state = root / "state"
    state.mkdir()
    (state / "health.json").write_text(json.dumps([{"device": "gpu-0", "health": "HEALTHY"}]))
    args = [
        sys.executable,
        str(ENTRY),
        f"--registry-dir={root / 'registry'}",
        f"--plugins-dir={root / 'plugins'}",
        f"--state-dir={state}",
        f"--grace-s={GRACE_S}",
    ]
    stderr_path = root / "stderr.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
    p = Plugin(
        proc=proc,
        root=root,
        state_dir=state,
        reg_sock=root / "registry" / f"{DRIVER_NAME}-reg.sock",
        dra_sock=root / "plugins" / DRIVER_NAME / "dra.sock",
    )
    try:
        deadline = time.monotonic() + 30
        while not (state / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"plugin did not start (rc={proc.poll()}):\n{stderr_path.read_text()}")
            time.sleep(0.02)
        yield p
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _claim(pb: Any, name: str, uid: str | None = None) -> Any:
    return pb.Claim(namespace="ns", uid=uid or f"uid-{name}", name=name)


def _registered_lines(p: Plugin) -> int:
    path = p.state_dir / "registrations.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_get_info_describes_the_dra_endpoint(plugin: Plugin) -> None:
    stub = reg_grpc.RegistrationStub(plugin.channel(plugin.reg_sock))
    info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=TIMEOUT)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER_NAME
    assert info.endpoint == str(plugin.dra_sock)
    assert os.path.isabs(info.endpoint)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_registration_status_fires_callback_on_every_success(plugin: Plugin) -> None:
    stub = reg_grpc.RegistrationStub(plugin.channel(plugin.reg_sock))
    stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT)
    assert _registered_lines(plugin) == 1
    # A rejection is recorded but is not a (re)registration: no republish.
    stub.NotifyRegistrationStatus(
        reg_pb2.RegistrationStatus(plugin_registered=False, error="duplicate endpoint"), timeout=TIMEOUT
    )
    assert _registered_lines(plugin) == 1
    # kubelet restarted and registered us again.
    stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=TIMEOUT)
    assert _registered_lines(plugin) == 2


@pytest.mark.parametrize(
    ("pb", "grpc_mod"), [(v1_pb2, v1_grpc), (v1beta1_pb2, v1beta1_grpc)], ids=["v1", "v1beta1"]
)
def test_prepare_unprepare_round_trip(plugin: Plugin, pb: Any, grpc_mod: Any) -> None:
    stub = grpc_mod.DRAPluginStub(plugin.channel(plugin.dra_sock))
    claims = [_claim(pb, "a"), _claim(pb, "b")]
    resp = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=TIMEOUT)
    assert set(resp.claims) == {"uid-a", "uid-b"}
    a, b = resp.claims["uid-a"], resp.claims["uid-b"]
    assert a.error == "" and b.error == ""
    assert [d.device_name for d in a.devices] == ["gpu-0"]
    assert [d.device_name for d in b.devices] == ["gpu-1-mig-1g10gb-19-0"]
    dev = a.devices[0]
    assert list(dev.request_names) == ["gpu"]
    assert dev.pool_name == "node-a"
    assert list(dev.cdi_device_ids) == [f"k8s.{DRIVER_NAME}/claim=uid-a-gpu-0"]

    # kubelet retries prepare after a restart: same answer, nothing allocated twice.
    again = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims[:1]), timeout=TIMEOUT)
    assert again.claims["uid-a"] == a

    un = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=TIMEOUT)
    assert {uid: r.error for uid, r in un.claims.items()} == {"uid-a": "", "uid-b": ""}
    # Unprepare is idempotent, and the freed devices are handed out again.
    un = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=TIMEOUT)
    assert {uid: r.error for uid, r in un.claims.items()} == {"uid-a": "", "uid-b": ""}
    resp = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_claim(pb, "c")]), timeout=TIMEOUT
    )
    assert [d.device_name for d in resp.claims["uid-c"].devices] == ["gpu-0"]


def test_every_claim_gets_an_answer(plugin: Plugin) -> None:
    stub = v1_grpc.DRAPluginStub(plugin.channel(plugin.dra_sock))
    claims = [_claim(v1_pb2, n) for n in ("ok1", "omit-x", "fail-y", "raise-z", "ok2")]
    resp = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=TIMEOUT)
    assert set(resp.claims) == {c.uid for c in claims}
    errors = {uid: r.error for uid, r in resp.claims.items()}
    assert errors["uid-ok1"] == "" and errors["uid-ok2"] == ""
    assert [d.device_name for d in resp.claims["uid-ok1"].devices] == ["gpu-0"]
    assert [d.device_name for d in resp.claims["uid-ok2"].devices] == ["gpu-1-mig-1g10gb-19-0"]
    assert errors["uid-omit-x"] == "driver returned no result for this claim"
    assert errors["uid-fail-y"] == "cannot prepare ns/fail-y"
    assert errors["uid-raise-z"] == "RuntimeError: preparer exploded on raise-z"
    for uid in ("uid-omit-x", "uid-fail-y", "uid-raise-z"):
        assert len(resp.claims[uid].devices) == 0

    un = stub.NodeUnprepareResources(v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=TIMEOUT)
    assert set(un.claims) == {c.uid for c in claims}
    assert un.claims["uid-raise-z"].error == "RuntimeError: unpreparer exploded on raise-z"
    assert un.claims["uid-omit-x"].error == "driver returned no result for this claim"
    assert un.claims["uid-ok1"].error == "" and un.claims["uid-fail-y"].error == ""


def test_empty_and_duplicate_requests(plugin: Plugin) -> None:
    stub = v1_grpc.DRAPluginStub(plugin.channel(plugin.dra_sock))
    assert len(stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(), timeout=TIMEOUT).claims) == 0
    dup = [_claim(v1_pb2, "d"), _claim(v1_pb2, "d")]
    resp = stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=dup), timeout=TIMEOUT)
    assert list(resp.claims) == ["uid-d"]
    assert [d.device_name for d in resp.claims["uid-d"].devices] == ["gpu-0"]


@pytest.mark.parametrize(
    ("pb", "grpc_mod"), [(h1_pb2, h1_grpc), (h1a1_pb2, h1a1_grpc)], ids=["v1", "v1alpha1"]
)
def test_health_stream_sends_full_list_then_updates(plugin: Plugin, pb: Any, grpc_mod: Any) -> None:
    stub = grpc_mod.DRAResourceHealthStub(plugin.channel(plugin.dra_sock))
    stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=30)
    try:
        first = next(stream)
        assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [("node-a", "gpu-0")]
        assert first.devices[0].health == pb.HEALTHY
        assert first.devices[0].health_check_timeout_seconds == 60
        assert abs(first.devices[0].last_updated_time - time.time()) < 60

        plugin.write_health(
            [
                {"device": "gpu-0", "health": "UNHEALTHY", "message": "XID 79"},
                {"device": "gpu-1-mig-1g10gb-19-0", "health": "HEALTHY"},
            ]
        )
        update = next(stream)
        assert [(d.device.device_name, d.health, d.message) for d in update.devices] == [
            ("gpu-0", pb.UNHEALTHY, "XID 79"),
            ("gpu-1-mig-1g10gb-19-0", pb.HEALTHY, ""),
        ]
    finally:
        stream.cancel()


def test_sockets_and_directories_are_private(plugin: Plugin) -> None:
    for sock in (plugin.reg_sock, plugin.dra_sock):
        st = sock.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
    for d in (plugin.root / "registry", plugin.root / "plugins", plugin.dra_sock.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o750


def test_sigterm_stops_gracefully_and_removes_sockets(plugin: Plugin) -> None:
    stub = h1_grpc.DRAResourceHealthStub(plugin.channel(plugin.dra_sock))
    stream = stub.NodeWatchResources(h1_pb2.NodeWatchResourcesRequest(), timeout=30)
    next(stream)  # an open stream must not hold the shutdown for the grace period

    started = time.monotonic()
    plugin.proc.send_signal(signal.SIGTERM)
    # Held for the grace period, the plugin would exit after GRACE_S at the earliest.
    assert plugin.proc.wait(timeout=GRACE_S / 2) == 0
    assert time.monotonic() - started < GRACE_S / 2
    assert not plugin.reg_sock.exists()
    assert not plugin.dra_sock.exists()
    # The stream ended (server side) rather than hanging the client.
    with pytest.raises((StopIteration, grpc.RpcError)):
        next(stream)


def test_restart_replaces_stale_sockets(plugin: Plugin) -> None:
    # A SIGKILLed plugin leaves its socket files behind; the next instance must take over.
    plugin.proc.kill()
    plugin.proc.wait()
    assert plugin.reg_sock.exists() and plugin.dra_sock.exists()
    (plugin.state_dir / "ready").unlink()
    proc = subprocess.Popen(plugin.proc.args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (plugin.state_dir / "ready").exists():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        info = reg_grpc.RegistrationStub(plugin.channel(plugin.reg_sock)).GetInfo(
            reg_pb2.InfoRequest(), timeout=TIMEOUT
        )
        assert info.endpoint == str(plugin.dra_sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
