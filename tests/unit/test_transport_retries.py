"""Every API client flexmig makes re-sends a request only when that is harmless: a write whose
connection broke after it was sent is not re-sent (it may have landed); a read is."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client as k8s
from urllib3.exceptions import MaxRetryError, ProtocolError

from flexmig.commands import controller as ctl_cmd
from flexmig.commands import status as status_cmd
from kubeletplugin.agent import main as plugin_main


class CuttingServer:
    """Reads each request's head, counts it by method, and closes the connection without answering:
    what a client sees when the API server (or a proxy) dies after the request went out."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.methods: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if data:
                    self.methods.append(data.split(b" ", 1)[0].decode())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[CuttingServer]:
    s = CuttingServer()
    yield s
    s.close()


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return path


def _plugin_client(path: Path) -> Any:
    return plugin_main._api_client(SimpleNamespace(kubeconfig=path))  # type: ignore[arg-type]


FACTORIES: dict[str, Callable[[Path], Any]] = {
    "controller": lambda p: ctl_cmd._api_client(str(p)),
    "status": lambda p: status_cmd.api_client(str(p), None),
    "plugin": _plugin_client,
}


@pytest.mark.parametrize("who", sorted(FACTORIES))
def test_a_write_cut_after_sending_is_sent_once(who: str, server: CuttingServer, tmp_path: Path) -> None:
    api = k8s.CoreV1Api(FACTORIES[who](_kubeconfig(tmp_path, server.port)))
    with pytest.raises((MaxRetryError, ProtocolError)):
        api.patch_namespaced_pod(
            "p", "ns", {"metadata": {"annotations": {"a": "b"}}}, _request_timeout=(2, 2)
        )
    with pytest.raises((MaxRetryError, ProtocolError)):
        api.delete_namespaced_pod("p", "ns", _request_timeout=(2, 2))
    assert server.methods == ["PATCH", "DELETE"]


@pytest.mark.parametrize("who", sorted(FACTORIES))
def test_a_read_cut_after_sending_is_retried(who: str, server: CuttingServer, tmp_path: Path) -> None:
    api = k8s.CoreV1Api(FACTORIES[who](_kubeconfig(tmp_path, server.port)))
    with pytest.raises((MaxRetryError, ProtocolError)):
        api.read_namespaced_pod("p", "ns", _request_timeout=(2, 2))
    assert server.methods == ["GET"] * 4
