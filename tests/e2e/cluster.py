"""A real Kubernetes control plane for the e2e tests.

`ControlPlane` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by
`k8sbuild/build.sh` from the Kubernetes Go modules) as local processes on loopback with random free
ports. It generates its own PKI (CA, serving certificate, client certificates, service-account key;
see `pki.py`), writes one kubeconfig per identity, waits until everything is ready and tears it
all down again. Nothing in here fakes an API: there is no kubelet and no container runtime, which the
tests supply themselves (a kubelet stand-in; the Node, Lease and Namespace objects it would
maintain are made by `k8sobjects.py`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .pki import PKI, b64, new_service_account_key

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "k8sbuild" / "build.sh"

#: Feature gates passed to every component. Only gates that exist in 1.37 and are not locked belong
#: here (an unknown gate is fatal; a locked GA gate only produces a warning, so it is left out).
#: In 1.37: DRAPartitionableDevices and DRAConsumableCapacity are beta (on by default), DRADeviceTaints
#: is GA but not yet locked. Setting them explicitly keeps the tests independent of defaults.
FEATURE_GATES: dict[str, bool] = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
}

#: Gates the design relies on, whether set above or on by default (GA, locked) in 1.37.
#: The smoke test checks each one via the apiserver's `kubernetes_feature_enabled` metric.
REQUIRED_FEATURES: tuple[str, ...] = (
    "DynamicResourceAllocation",  # GA, locked
    "DRAPrioritizedList",  # GA, locked
    "DRAResourceClaimDeviceStatus",  # GA, locked
    "DRAExtendedResource",  # GA, locked
    "DRAAdminAccess",  # GA, locked
    *FEATURE_GATES,
)

RUNTIME_CONFIG = "resource.k8s.io/v1=true,resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
SERVICE_CIDR = "10.96.0.0/24"  # only an allocation range inside the apiserver; no traffic goes there
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (the message names the log to read)."""


# --------------------------------------------------------------------------------------------------
# binaries


def build_binaries(timeout_s: float = 3 * 3600) -> Path:
    """Run build.sh (instant when cached) and return the directory holding the binaries.

    `FLEXMIG_K8S_BIN` may point at a directory with prebuilt binaries to skip the build.
    """
    override = os.environ.get("FLEXMIG_K8S_BIN")
    if override:
        return Path(override)
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} failed with exit code {proc.returncode}:\n{proc.stderr[-6000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed no bin directory")
    return Path(lines[-1].strip())


# --------------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGKILL the child when the thread that started it dies.

    Keeps a killed test run (SIGKILL, timeout) from leaking control-plane processes, which run in
    their own session. So start a ControlPlane from a thread that outlives it (e.g. the main one).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    def start(self, env: Mapping[str, str] | None = None) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(("+ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=dict(env) if env is not None else None,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {self.proc.returncode}; log {self.log_path}:\n"
                + tail(self.log_path)
            )

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


def tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-max_bytes:].decode(errors="replace")


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.25,
    check: Callable[[], None] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        if check is not None:
            check()
        try:
            if predicate():
                return
            last_exc = None
        except Exception as exc:  # readiness probes raise until the server is up
            last_exc = exc
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout_s:.0f}s waiting for {what}: {last_exc!r}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------------------------------
# the control plane


@dataclass(frozen=True)
class Identity:
    """Who a kubeconfig authenticates as (a client certificate's CN and O)."""

    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("kubernetes-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")


def node_identity(node_name: str) -> Identity:
    """The identity a kubelet (and so a kubelet plugin using its credentials) has on `node_name`."""
    return Identity(f"system:node:{node_name}", ("system:nodes",))


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

    Use as a context manager or call `start()` / `stop()`. `kubeconfig` is the admin kubeconfig.
    """

    def __init__(
        self,
        bin_dir: Path,
        *,
        workdir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        extra_apiserver_args: Sequence[str] = (),
        client_qps: int | None = None,
        verbosity: int = 2,
        advertise_address: str | None = None,
    ) -> None:
        self.bin_dir = Path(bin_dir)
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="flexmig-cp-"))
        self.feature_gates = dict(FEATURE_GATES if feature_gates is None else feature_gates)
        self.extra_apiserver_args = list(extra_apiserver_args)
        # kube-scheduler's and kube-controller-manager's client rate limit (None: their defaults, 50 and
        # 20 requests/s): the end-to-end benchmark raises it to see what flexmig itself costs.
        self.client_qps = client_qps
        self.verbosity = verbosity
        # Set (a non-loopback address of this machine): the API server also listens there and the
        # `kubernetes` Service's endpoint is it, as on a real cluster, so pods on a pod network reach
        # it through kube-proxy (realnode/network.py). None: loopback only, the Service has no endpoint.
        self.advertise_address = advertise_address
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig_dir = self.workdir / "kubeconfigs"
        for d in (self.pki_dir, self.log_dir, self.kubeconfig_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.pki = PKI()
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.kcm_port = free_port()
        self.scheduler_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.ca_file = self.pki_dir / "ca.crt"
        self.kubeconfig = self.kubeconfig_dir / "admin.kubeconfig"
        self.components: list[Component] = []
        self.start_seconds: dict[str, float] = {}
        self._started = False

    # ---- credentials ------------------------------------------------------------------------

    def _write(self, path: Path, data: bytes, mode: int = 0o600) -> Path:
        path.write_bytes(data)
        path.chmod(mode)
        return path

    def write_kubeconfig(self, identity: Identity, path: Path | None = None) -> Path:
        """Write a self-contained kubeconfig with a client certificate for `identity`."""
        pair = self.pki.issue(identity.user, organizations=identity.groups, client=True)
        if path is None:
            safe = identity.user.replace(":", "_").replace("/", "_")
            path = self.kubeconfig_dir / f"{safe}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self.pki.ca_pem),
                    },
                }
            ],
            "users": [
                {
                    "name": identity.user,
                    "user": {
                        "client-certificate-data": b64(pair.cert_pem),
                        "client-key-data": b64(pair.key_pem),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": identity.user}}],
            "current-context": "e2e",
        }
        return self._write(path, yaml.safe_dump(config).encode())

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig authenticating as the kubelet of `node_name` (user system:node:<name>)."""
        return self.write_kubeconfig(node_identity(node_name))

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A ready `kubernetes.client.ApiClient` (admin unless another kubeconfig is given)."""
        from kubernetes import config as k8s_config

        return k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig or self.kubeconfig)
        )

    def helm(
        self, *args: str, kubeconfig: Path | None = None, timeout_s: float = 300.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the built `helm` against this cluster (helm's own state lives in the temp dir)."""
        home = self.workdir / "helm"
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        proc = subprocess.run(
            [self._bin("helm"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """A raw admin GET on the apiserver (for /readyz, /metrics, ...)."""
        req = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._ssl_context()) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    def _write_pki(self) -> None:
        p = self.pki
        self._write(self.ca_file, p.ca_pem, 0o644)
        self._write(self.pki_dir / "ca.key", p.ca_key_pem)
        serving = p.issue(
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=(
                "127.0.0.1",
                str(next(ipaddress.ip_network(SERVICE_CIDR).hosts())),
                *([self.advertise_address] if self.advertise_address else []),
            ),
            server=True,
        )
        self._write(self.pki_dir / "apiserver.crt", serving.cert_pem)
        self._write(self.pki_dir / "apiserver.key", serving.key_pem)
        admin = p.issue(ADMIN.user, organizations=ADMIN.groups, client=True)
        self._write(self.pki_dir / "admin.crt", admin.cert_pem)
        self._write(self.pki_dir / "admin.key", admin.key_pem)
        sa_private, sa_public = new_service_account_key()
        self._write(self.pki_dir / "sa.key", sa_private)
        self._write(self.pki_dir / "sa.pub", sa_public, 0o644)

    # ---- lifecycle --------------------------------------------------------------------------

    def _qps_flags(self) -> list[str]:
        if self.client_qps is None:
            return []
        return [f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={2 * self.client_qps}"]

    def _gates_flag(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _address_flags(self) -> list[str]:
        if self.advertise_address:
            # The lease reconciler writes the `kubernetes` Service's endpoint: this address.
            return ["--bind-address=0.0.0.0", f"--advertise-address={self.advertise_address}"]
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # A loopback advertise address is refused by the lease endpoint reconciler; nothing
            # here reaches the apiserver through the in-cluster `kubernetes` Service anyway.
            "--endpoint-reconciler-type=none",
        ]

    def _bin(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ControlPlaneError(f"missing binary {path}; run {BUILD_SCRIPT}")
        return str(path)

    def _component(self, name: str, argv: list[str]) -> Component:
        comp = Component(name, argv, self.log_dir / f"{name}.log")
        self.components.append(comp)
        comp.start()
        return comp

    def start(self, timeout_s: float = 180.0) -> ControlPlane:
        if self._started:
            return self
        self._started = True
        t0 = time.monotonic()
        try:
            self._start(t0 + timeout_s)
        except BaseException:
            self.stop(failed=True)
            raise
        self.start_seconds["total"] = time.monotonic() - t0
        return self

    def _remaining(self, deadline: float) -> float:
        return max(1.0, deadline - time.monotonic())

    def _start(self, deadline: float) -> None:
        t0 = time.monotonic()
        self._write_pki()
        pki = self.pki_dir
        self.write_kubeconfig(ADMIN, self.kubeconfig)
        kcm_kubeconfig = self.write_kubeconfig(CONTROLLER_MANAGER)
        sched_kubeconfig = self.write_kubeconfig(SCHEDULER)

        # etcd
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.etcd_peer_port}"
        etcd = self._component(
            "etcd",
            [
                self._bin("etcd"),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # throwaway data; fsync only slows the tests
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )

        def etcd_healthy() -> bool:
            with urllib.request.urlopen(f"{etcd_url}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        wait_until(etcd_healthy, self._remaining(deadline), "etcd /health", check=etcd.check_alive)
        self.start_seconds["etcd"] = time.monotonic() - t0

        # kube-apiserver
        apiserver = self._component(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                *self._address_flags(),
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_file}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--runtime-config={RUNTIME_CONFIG}",
                *self._gates_flag(),
                "--profiling=false",
                f"--v={self.verbosity}",
                *self.extra_apiserver_args,
            ],
        )

        def apiserver_ready() -> bool:
            return self.get("/readyz", timeout_s=3)[0] == 200

        wait_until(
            apiserver_ready, self._remaining(deadline), "kube-apiserver /readyz", check=apiserver.check_alive
        )
        self.start_seconds["kube-apiserver"] = time.monotonic() - t0

        # kube-controller-manager and kube-scheduler
        kcm = self._component(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                f"--authentication-kubeconfig={kcm_kubeconfig}",
                f"--authorization-kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.kcm_port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *self._gates_flag(),
                *self._qps_flags(),
                "--profiling=false",
                f"--v={self.verbosity}",
            ],
        )
        scheduler = self._component(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                f"--kubeconfig={sched_kubeconfig}",
                f"--authentication-kubeconfig={sched_kubeconfig}",
                f"--authorization-kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}",
                "--leader-elect=false",
                *self._gates_flag(),
                *self._qps_flags(),
                "--profiling=false",
                f"--v={self.verbosity}",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # components serve self-signed certs on loopback

        def healthz(port: int) -> Callable[[], bool]:
            def probe() -> bool:
                url = f"https://127.0.0.1:{port}/healthz"
                with urllib.request.urlopen(url, timeout=2, context=insecure) as resp:
                    return int(resp.status) == 200

            return probe

        def both_alive() -> None:
            kcm.check_alive()
            scheduler.check_alive()

        wait_until(
            healthz(self.scheduler_port),
            self._remaining(deadline),
            "kube-scheduler /healthz",
            check=both_alive,
        )
        self.start_seconds["kube-scheduler"] = time.monotonic() - t0
        wait_until(
            healthz(self.kcm_port),
            self._remaining(deadline),
            "kube-controller-manager /healthz",
            check=both_alive,
        )
        self.start_seconds["kube-controller-manager"] = time.monotonic() - t0

        # the default namespace (apiserver) and its default ServiceAccount (controller-manager)
        from kubernetes import client as k8s

        with self.api_client() as api:
            core = k8s.CoreV1Api(api)
            wait_until(
                lambda: core.read_namespace("default") is not None,
                self._remaining(deadline),
                "namespace default",
                check=both_alive,
            )
            wait_until(
                lambda: core.read_namespaced_service_account("default", "default") is not None,
                self._remaining(deadline),
                "serviceaccount default/default",
                check=both_alive,
            )
        self.start_seconds["ready"] = time.monotonic() - t0

    def check_alive(self) -> None:
        """Raise if any component has died."""
        for comp in self.components:
            comp.check_alive()

    def restart_apiserver(self, down_s: float, timeout_s: float = 120.0) -> None:
        """Fault injection: stop kube-apiserver (SIGTERM; etcd and the rest keep running), keep it down
        for `down_s` (the outage is the point, not a wait for something), start it again on the same
        port and wait for /readyz. Call it from a thread that outlives the control plane (the main
        one): the new process dies with the thread that started it (`_die_with_parent`)."""
        comp = next(c for c in self.components if c.name == "kube-apiserver")
        comp.stop()
        time.sleep(down_s)
        comp.start()
        wait_until(
            lambda: self.get("/readyz", timeout_s=3)[0] == 200,
            timeout_s,
            "kube-apiserver /readyz after restart",
            check=comp.check_alive,
        )

    def stop(self, failed: bool = False) -> Path | None:
        """Stop all components (SIGTERM, then SIGKILL); remove the temp data unless `failed`.

        Returns the kept log directory (also printed), or None when everything was removed.
        """
        for comp in reversed(self.components):
            comp.stop()
        self.components.clear()
        if failed or os.environ.get("FLEXMIG_E2E_KEEP"):
            print(f"\n[e2e] control-plane data and logs kept in {self.workdir} (logs: {self.log_dir})")
            return self.log_dir
        shutil.rmtree(self.workdir, ignore_errors=True)
        return None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(failed=exc_type is not None)


@contextlib.contextmanager
def control_plane(bin_dir: Path | None = None) -> Iterator[ControlPlane]:
    """Build (cached) and run a control plane for the duration of the block."""
    cp = ControlPlane(bin_dir or build_binaries())
    with cp:
        yield cp
