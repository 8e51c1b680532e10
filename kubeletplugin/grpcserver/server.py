"""The two kubelet-facing gRPC servers of the node agent, on unix sockets.

- registration: <registry dir>/<driver>-reg.sock, found by kubelet's plugin watcher;
- DRA (+ health): <plugins dir>/<driver>/dra.sock, the endpoint GetInfo hands to kubelet.

kubelet runs as root and is the only legitimate client, so the sockets are 0600 and the
directories we create 0750: nothing else on the node may drive prepare/unprepare.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import threading
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import structlog

from api.constants import DRIVER_NAME
from api.gen.pluginregistration_v1 import api_pb2_grpc as reg_grpc

from .dra import add_dra_servicers
from .health import DEFAULT_POLL_S, DEFAULT_RESEND_S, HealthStreamer, add_health_servicers
from .interfaces import ClaimPreparer, HealthSource
from .registration import DRA_SERVICES, HEALTH_SERVICES, RegistrationServicer, RegistrationState

log = structlog.get_logger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_GRACE_S = 10.0
SOCKET_MODE = 0o600
DIR_MODE = 0o750
# sockaddr_un.sun_path is 108 bytes including the terminating NUL on Linux.
MAX_SOCKET_PATH = 107


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"unix socket path too long ({len(os.fsencode(path))} > {MAX_SOCKET_PATH}): {path}")


def _ensure_dir(path: Path, *, owned: bool) -> None:
    """Create path (and parents). Directories this driver owns are always forced to DIR_MODE;
    shared ones (kubelet's plugin directories) only when we created them, never re-permissioned."""
    existed = path.is_dir()
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if owned or not existed:
        os.chmod(path, DIR_MODE)
    elif path.stat().st_mode & stat.S_IWOTH:
        log.warning("socket directory is world-writable", path=str(path))


def socket_paths(
    registry_dir: Path | str, plugins_dir: Path | str, driver_name: str = DRIVER_NAME
) -> tuple[Path, Path]:
    """(registration socket, DRA socket) of a driver instance, exactly as PluginServers binds them."""
    registry = Path(os.path.abspath(registry_dir))
    plugin_dir = Path(os.path.abspath(plugins_dir)) / driver_name
    return registry / f"{driver_name}-reg.sock", plugin_dir / "dra.sock"


def socket_in_use(path: Path) -> bool:
    """Whether a server accepts connections on the unix socket `path` (never changes anything)."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except FileNotFoundError:
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        return False
    else:
        return True
    finally:
        probe.close()


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file left by a previous instance; refuse to touch anything else.

    A socket that still accepts connections belongs to a live instance (or another driver with
    the same name): taking it over would silently cut that instance off from kubelet.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, "refusing to replace a non-socket file", str(path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        pass  # nobody listens: stale
    else:
        raise FileExistsError(errno.EADDRINUSE, "socket is in use by a running server", str(path))
    finally:
        probe.close()
    log.info("removing stale socket", path=str(path))
    path.unlink(missing_ok=True)


def _unlink_socket(path: Path) -> None:
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


class PluginServers:
    """Registration server + DRA/health server of one driver instance.

    start() binds and serves; stop() ends both (health streams first, then in-flight calls get
    grace_s to finish) and removes the socket files, so kubelet's plugin watcher sees the plugin
    leave. Both are idempotent; stop() may be called from any thread (e.g. a signal handler's).
    """

    def __init__(
        self,
        preparer: ClaimPreparer,
        *,
        health_source: HealthSource | None = None,
        registration_state: RegistrationState | None = None,
        driver_name: str = DRIVER_NAME,
        registry_dir: Path | str = DEFAULT_REGISTRY_DIR,
        plugins_dir: Path | str = DEFAULT_PLUGINS_DIR,
        max_workers: int = 16,
        health_poll_s: float = DEFAULT_POLL_S,
        health_resend_s: float = DEFAULT_RESEND_S,
    ) -> None:
        self._preparer = preparer
        self._health_source = health_source
        self.state = registration_state if registration_state is not None else RegistrationState()
        self.driver_name = driver_name
        self._registry_dir = Path(os.path.abspath(registry_dir))
        self._plugin_dir = Path(os.path.abspath(plugins_dir)) / driver_name
        # Not resolve(): kubelet must see the path exactly as configured (hostPath mounts make the
        # same path valid on both sides, a resolved symlink might not be).
        self.registration_socket, self.dra_socket = socket_paths(registry_dir, plugins_dir, driver_name)
        _check_socket_path(self.registration_socket)
        _check_socket_path(self.dra_socket)
        if max_workers < 2:
            raise ValueError("max_workers must be >= 2 (a health stream occupies a worker)")
        self._max_workers = max_workers
        self._health_poll_s = health_poll_s
        self._health_resend_s = health_resend_s

        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._started = False
        self._servers: list[tuple[Any, futures.ThreadPoolExecutor, Path]] = []

    @property
    def supported_versions(self) -> list[str]:
        versions = list(DRA_SERVICES)
        if self._health_source is not None:
            versions += HEALTH_SERVICES
        return versions

    def start(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("PluginServers cannot be restarted after stop(); create a new one")
            if self._started:
                return
            self._started = True
            try:
                self._start_locked()
            except BaseException:
                self._shutdown_locked(grace_s=0)
                raise

    def _start_locked(self) -> None:
        _ensure_dir(self._registry_dir, owned=False)
        _ensure_dir(self._plugin_dir.parent, owned=False)
        _ensure_dir(self._plugin_dir, owned=True)
        _remove_stale_socket(self.dra_socket)
        _remove_stale_socket(self.registration_socket)

        # DRA first: kubelet dials the endpoint right after GetInfo, so it must already be up.
        dra_server = self._bind(self.dra_socket, self._max_workers, "flexmig-dra")
        add_dra_servicers(dra_server, self._preparer)
        if self._health_source is not None:
            streamer = HealthStreamer(
                self._health_source, self._stopping, self._health_poll_s, self._health_resend_s
            )
            add_health_servicers(dra_server, streamer)
        self._serve(dra_server, self.dra_socket)

        # Registration has two tiny unary calls; a separate small pool keeps a busy DRA server
        # (slow prepares, health streams) from delaying kubelet's registration handshake.
        reg_server = self._bind(self.registration_socket, 2, "flexmig-reg")
        servicer = RegistrationServicer(
            self.driver_name, str(self.dra_socket), self.supported_versions, self.state
        )
        reg_grpc.add_RegistrationServicer_to_server(servicer, reg_server)
        self._serve(reg_server, self.registration_socket)
        log.info(
            "kubelet plugin servers started",
            registration=str(self.registration_socket),
            dra=str(self.dra_socket),
            versions=self.supported_versions,
        )

    def _bind(self, path: Path, workers: int, name: str) -> Any:
        executor = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        server = grpc.server(executor)
        self._servers.append((server, executor, path))
        try:
            port = server.add_insecure_port(f"unix:{path}")
        except RuntimeError as e:
            raise OSError(f"cannot bind {path}: {e}") from e
        if port == 0:
            raise OSError(f"cannot bind {path}")
        return server

    def _serve(self, server: Any, path: Path) -> None:
        server.start()
        # The socket exists only once the server started; the 0750 directory already keeps
        # others out during the moment between bind and chmod.
        os.chmod(path, SOCKET_MODE)

    def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._shutdown_locked(grace_s)

    def _shutdown_locked(self, grace_s: float) -> None:
        # Ends health streams at their next poll instead of holding the grace period.
        self._stopping.set()
        servers, self._servers = self._servers, []
        # Registration first: once its socket is gone kubelet deregisters us and stops sending
        # new work, while in-flight DRA calls still get the grace period. Both are stopped before
        # either is waited for, so the two share one grace period (SIGTERM to exit stays under
        # kubelet's 30 s; kubeletplugin/agent/shutdown.py).
        stopped = [(server.stop(grace_s), executor, path) for server, executor, path in reversed(servers)]
        for done, executor, path in stopped:
            done.wait()
            # A handler stuck past the grace period must not block shutdown; its thread is left.
            executor.shutdown(wait=False, cancel_futures=True)
            _unlink_socket(path)
        self._stopped.set()
        if servers:
            log.info("kubelet plugin servers stopped")

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stop() completed; False on timeout."""
        return self._stopped.wait(timeout_s)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()


def install_signal_handlers(
    servers: PluginServers,
    grace_s: float = DEFAULT_GRACE_S,
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> dict[signal.Signals, Any]:
    """Make the given signals stop the servers gracefully. Call from the main thread.

    The handler only spawns the stop: a handler runs on the main thread, which typically sits in
    servers.wait(), and a blocking stop there would delay every other handler by grace_s.
    Returns the previous handlers so callers (tests) can restore them.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, stopping", signal=signal.Signals(signum).name, grace_s=grace_s)
        threading.Thread(target=servers.stop, args=(grace_s,), name="flexmig-stop", daemon=True).start()

    return {sig: signal.signal(sig, handler) for sig in signals}
