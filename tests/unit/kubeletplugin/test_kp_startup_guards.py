"""Issue #11 items 2 and 3 at unit level: the node lock and socket check a second instance meets
before it touches anything, and the permission check's verdicts and messages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kubeletplugin.agent.nodelock import NodeBusy, NodeLock, check_sockets_free
from kubeletplugin.grpcserver.server import socket_in_use, socket_paths
from kubeletplugin.kube.access import REQUIRED, AccessDenied, AccessUnknown, Permission, check_access
from kubeletplugin.settings.config import ConfigError, add_flags, load_config


def test_second_lock_on_the_node_is_refused_naming_the_holder(tmp_path: Path) -> None:
    checkpoint = tmp_path / "state" / "checkpoint.json"
    first = NodeLock(checkpoint)
    first.acquire()
    try:
        with pytest.raises(NodeBusy, match=rf"holds {tmp_path}/state/plugin.lock, pid {os.getpid()}\)"):
            NodeLock(checkpoint).acquire()
    finally:
        first.release()
    again = NodeLock(checkpoint)
    again.acquire()  # released: the next instance gets it
    again.release()


def test_lock_held_by_another_process_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.json"
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[2]);"
        "from pathlib import Path; from kubeletplugin.agent.nodelock import NodeLock;"
        "NodeLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(30)"
    )
    repo = str(Path(__file__).resolve().parents[3])
    proc = subprocess.Popen([sys.executable, "-c", code, str(checkpoint), repo], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"locked"
        with pytest.raises(NodeBusy, match=rf"pid {proc.pid}\)"):
            NodeLock(checkpoint).acquire()
    finally:
        proc.kill()
        proc.wait()
    NodeLock(checkpoint).acquire()  # the kernel released the dead holder's lock


def test_a_served_socket_is_busy_a_stale_one_is_not(tmp_path: Path) -> None:
    reg, dra = socket_paths(tmp_path / "reg", tmp_path / "plugins")
    for path in (reg, dra):
        path.parent.mkdir(parents=True, exist_ok=True)
    check_sockets_free([reg, dra], socket_in_use)  # nothing there
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(reg))
    stale.close()  # the file stays, nobody listens
    check_sockets_free([reg, dra], socket_in_use)
    reg.unlink()
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(dra))
    live.listen(1)
    try:
        with pytest.raises(NodeBusy, match=rf"socket {dra} is served by another running plugin instance"):
            check_sockets_free([reg, dra], socket_in_use)
    finally:
        live.close()


def test_missing_permissions_are_all_named() -> None:
    allowed = {("get", "resourceclaims", ""), ("list", "resourceslices", "")}

    def review(p: Permission) -> bool:
        return (p.verb, p.resource, p.subresource) in allowed

    with pytest.raises(AccessDenied) as err:
        check_access(review, who="system:node:n1")
    text = str(err.value)
    assert text.startswith("identity 'system:node:n1' lacks permissions the kubelet plugin needs:")
    assert "patch resource.k8s.io/resourceclaims/status (prepare records the realised devices)" in text
    assert (
        "get resource.k8s.io/resourceclaims/status" in text
        and "create resource.k8s.io/resourceslices" in text
    )
    assert "get resource.k8s.io/resourceclaims " not in text  # granted ones are not listed
    assert "chart's ServiceAccount" in text and "docs/kubelet-plugin.md" in text
    check_access(lambda p: True)  # everything granted: no error


def test_an_unanswering_api_server_is_retried_then_reported() -> None:
    now = [0.0]
    calls: list[Permission] = []

    def flaky(p: Permission) -> bool:
        calls.append(p)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return True

    check_access(flaky, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert len(calls) == 2 + len(REQUIRED)

    def down(p: Permission) -> bool:
        raise ConnectionError("refused")

    with pytest.raises(AccessUnknown, match="did not answer for 60 s"):
        check_access(down, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])


@pytest.mark.parametrize(
    ("value", "ok"), [("60", 60.0), ("0.5", None), ("abc", None), ("5", 5.0), ("nan", None)]
)
def test_reconcile_interval_flag(tmp_path: Path, value: str, ok: float | None) -> None:
    import argparse

    boot = tmp_path / "boot"
    boot.write_text("b\n")
    sim = tmp_path / "sim.json"
    sim.write_text("{}")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--node-name", "n", "--boot-id-path", str(boot), "--nvml", f"sim:{sim}"])
    env = {"FLEXMIG_RECONCILE_INTERVAL": value}
    if ok is None:
        with pytest.raises(
            ConfigError, match=r"--reconcile-interval \(env FLEXMIG_RECONCILE_INTERVAL\).*1\.\.86400"
        ):
            load_config(args, env=env)
    else:
        assert load_config(args, env=env).reconcile_interval_s == ok
    assert load_config(args, env={}).reconcile_interval_s == 60.0
