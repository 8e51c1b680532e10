"""The node agent process: wires NVML, checkpoint, API, reconcile, gRPC servers, slices and metrics.

Start-up order matters:
  metrics server (so a crash-looping plugin is still observable) -> node lock and socket check (a
  second instance exits here, having touched nothing: kubeletplugin/agent/nodelock.py) -> NVML -> GPU
  catalog -> checkpoint (a corrupt one stops the plugin: guessing would leak or destroy instances) ->
  API client -> permission check (kubeletplugin/kube/access.py; nothing has changed NVML state yet) ->
  startup reconcile (before kubelet can call us) -> first periodic reconcile pass -> health watcher
  -> gRPC servers -> slice publisher.
The publisher runs on every (re)registration, because kubelet wipes the node's slices then, and keeps
checking for a while after it (kubeletplugin/publish/publisher.py).

Every background loop (slice publisher and its drift check, health events, periodic reconcile, the
metrics/healthz server) is a driver.looprunner.LoopRunner: it survives any exception with backoff,
and /healthz answers 503 naming a loop that is dead or stuck.

Which devices exist is decided once, at start, from the catalog, the node config and each GPU's MIG
mode (an Ampere GPU publishes what its current mode allows; docs/kubelet-plugin.md, "Decisions worth
knowing"). A GPU reset that changes an Ampere
GPU's mode therefore needs a plugin restart, which an administrator doing a reset does anyway.
One exception: a GPU whose NVML refused profile queries with MIG off is re-read once MIG is on, and
republished if NVML disagrees with what was published (kubeletplugin/publish/inventory.py, docs/hardware.md).
An Ampere GPU whose MIG mode is off where MIG is wanted is reported at start and on every reconcile
pass (kubeletplugin/agent/migmodecheck.py).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from api.constants import DRIVER_NAME
from driver import cdi, hamiconfig
from driver.catalog.discover import discover_all
from driver.catalog.types import GpuCatalog
from driver.hamicore import HamiCorePaths
from driver.looprunner import LoopGroup, LoopRunner
from driver.nvml.backend import open_nvml
from driver.nvml.port import Nvml
from driver.nvml.types import GpuInfo, NvmlError
from driver.transportretry import with_safe_retries
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.agent.health import NvmlHealthSource
from kubeletplugin.agent.metrics import MetricsServer, NodeMetrics
from kubeletplugin.agent.migmodecheck import MigModeMonitor
from kubeletplugin.agent.nodelock import NodeBusy, NodeLock, check_sockets_free
from kubeletplugin.agent.shutdown import STOP_LOOPS_S, stop_loops
from kubeletplugin.checkpoint.model import CheckpointCorrupt
from kubeletplugin.checkpoint.periodic import PeriodicReconciler
from kubeletplugin.checkpoint.reconcile import reconcile
from kubeletplugin.checkpoint.store import CheckpointStore, read_boot_id
from kubeletplugin.grpcserver import PluginServers, install_signal_handlers
from kubeletplugin.grpcserver.server import socket_in_use, socket_paths
from kubeletplugin.kube.access import AccessDenied, AccessUnknown, api_review, check_access, whoami
from kubeletplugin.kube.kubeapi import REQUEST_TIMEOUT, KubeClaimApi
from kubeletplugin.kube.nodeevents import post_node_event, report_shares
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.cdiwriter import host_spec_writer
from kubeletplugin.prepare.migmode import MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.preparer import Preparer
from kubeletplugin.publish.inventory import CatalogVerifier, Inventory, verifying_builder
from kubeletplugin.publish.publisher import SlicePublisher
from kubeletplugin.publish.slices import NodeSlices, build_node_slices
from kubeletplugin.publish.withdraw import without_devices
from kubeletplugin.settings.config import PluginConfig, UnenforcedShares
from kubeletplugin.settings.nodeconfig import OperatingMode
from kubeletplugin.shared.device import ShareEnforcement
from kubeletplugin.shared.hamicore import HamiCoreSupport

log = structlog.get_logger(__name__)


def _api_client(cfg: PluginConfig) -> k8s.ApiClient:
    # Writes are never re-sent by the transport once they may have reached the server
    # (driver/transportretry.py): a lost status patch is the preparer's to retry, knowingly.
    conf = with_safe_retries(k8s.Configuration())
    if cfg.kubeconfig is not None:
        client: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(cfg.kubeconfig), client_configuration=conf
        )
        return client
    k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    return k8s.ApiClient(conf)


def _node_uid(api_client: k8s.ApiClient, node: str) -> str | None:
    try:
        meta = k8s.CoreV1Api(api_client).read_node(node, _request_timeout=REQUEST_TIMEOUT).metadata
        uid = meta.uid if meta is not None else None
    except Exception as exc:  # slices without an owner still work; only garbage collection is lost
        log.warning("cannot read the Node object; slices get no owner reference", node=node, error=str(exc))
        return None
    return str(uid) if uid else None


def _mig_modes(ops: NvmlOps, gpus: list[GpuInfo]) -> dict[int, bool]:
    modes: dict[int, bool] = {}
    for gpu in gpus:
        try:
            modes[gpu.index] = ops.mig_mode(gpu.index).current if gpu.mig_capable else False
        except NvmlError:
            modes[gpu.index] = False
    return modes


class NodeAgent:
    """One plugin process's components; `run()` blocks until SIGTERM/SIGINT."""

    def __init__(self, cfg: PluginConfig) -> None:
        self.cfg = cfg
        self.metrics = NodeMetrics()
        self.servers: PluginServers | None = None
        self.loops = LoopGroup()

    def healthy(self) -> tuple[bool, str]:
        if self.servers is None or self.servers.stopped:
            return False, "starting or stopping\n"
        st = self.servers.state.status()
        ok, loops = self.loops.check()
        return ok, f"serving; registered={st.registered} registrations={st.registrations}\n{loops}"

    def _lock_node(self) -> NodeLock | None:
        """The node lock, with the sockets checked free; None (logged) when another instance runs."""
        lock = NodeLock(self.cfg.checkpoint_path)
        try:
            lock.acquire()
            check_sockets_free(socket_paths(self.cfg.registry_dir, self.cfg.plugins_dir), socket_in_use)
        except (NodeBusy, OSError) as exc:
            lock.release()
            log.error("cannot become this node's kubelet plugin", error=str(exc))
            return None
        return lock

    def _access_ok(self, api_client: k8s.ApiClient) -> bool:
        try:
            check_access(api_review(api_client), who=whoami(api_client))
        except (AccessDenied, AccessUnknown) as exc:
            log.error("refusing to start: missing API permissions", error=str(exc))
            return False
        return True

    def run(self) -> int:
        cfg = self.cfg
        if cfg.unused_device_keys:
            log.warning(hamiconfig.unused_keys_message(list(cfg.unused_device_keys)))
        metrics_server: MetricsServer | None = None
        if cfg.metrics_port is not None:
            try:
                metrics_server = MetricsServer(
                    self.metrics, cfg.metrics_address, cfg.metrics_port, self.healthy
                )
            except OSError as exc:
                log.error(
                    "cannot bind the metrics port",
                    address=cfg.metrics_address,
                    port=cfg.metrics_port,
                    error=str(exc),
                )
                return 1
            metrics_server.start()
            log.info("metrics server listening", address=cfg.metrics_address, port=metrics_server.port)
        if metrics_server is not None:
            self.loops.add(metrics_server.runner)
        node_lock = self._lock_node()
        if node_lock is None:
            if metrics_server is not None:
                metrics_server.stop()
            return 1
        nvml = open_nvml(cfg.nvml_spec)
        try:
            nvml.init()
        except NvmlError as exc:
            log.error("NVML initialisation failed", backend=cfg.nvml_spec, error=str(exc))
            if metrics_server is not None:
                metrics_server.stop()
            node_lock.release()
            return 1
        try:
            return self._serve(nvml)
        finally:
            node_lock.release()
            if metrics_server is not None:
                metrics_server.stop()
            try:
                nvml.shutdown()
            except NvmlError as exc:
                log.warning("NVML shutdown failed", error=str(exc))

    def _serve(self, nvml: Nvml) -> int:
        cfg = self.cfg
        metrics = self.metrics
        ops = NvmlOps(nvml, metrics)
        try:
            gpus = nvml.gpus()
            catalogs = discover_all(nvml, cfg.allowlist)
            modes = _mig_modes(ops, gpus)
        except NvmlError as exc:
            log.error("cannot read the GPUs", error=str(exc))
            return 1
        try:
            store = CheckpointStore(cfg.checkpoint_path, read_boot_id(cfg.boot_id_path))
            store.load()
        except (CheckpointCorrupt, OSError, ValueError) as exc:
            log.error(
                "cannot use the checkpoint; refusing to start rather than lose track of instances",
                error=str(exc),
            )
            return 1
        api_client = _api_client(cfg)
        if not self._access_ok(api_client):
            return 1
        node_uid = _node_uid(api_client, cfg.node_name)

        hami_core: HamiCoreSupport | None = None
        shares = ShareEnforcement.ENFORCED
        if any(cfg.node_config.gpu_mode(g.mig_capable) is OperatingMode.HAMI_CORE for g in gpus):
            hami_core = HamiCoreSupport(
                HamiCorePaths(cfg.hami_core_library, cfg.hami_core_dir), cfg.node_name, metrics
            )
            try:
                library = hami_core.check()  # logs a warning and sets the metric when absent
            except OSError as exc:  # e.g. the ld.so.preload file cannot be written
                log.error("cannot set up HAMi-core", dir=str(cfg.hami_core_dir), error=str(exc))
                return 1
            if not library.present:
                shares = (
                    ShareEnforcement.UNENFORCED
                    if cfg.unenforced_shares is UnenforcedShares.PUBLISH
                    else ShareEnforcement.REFUSED
                )
            metrics.add_refresher(hami_core.check)  # installing the library shows up at the next scrape

        def build_from(current: Sequence[GpuCatalog], generation: int) -> NodeSlices:
            return build_node_slices(
                current, cfg.node_name, generation, cfg.node_config, modes, node_uid=node_uid, shares=shares
            )

        published = build_from(catalogs, 0)
        inventory = Inventory.published(catalogs, published)
        # Catalogs NVML refused while MIG was off are checked once MIG is on; a difference republishes.
        build = verifying_builder(CatalogVerifier(nvml, catalogs, cfg.allowlist), inventory, build_from)
        report_shares(api_client, cfg, node_uid, published, metrics)
        # An Ampere GPU with MIG off waits for an administrator: say so (log, metric, Node event).
        mig_check = MigModeMonitor(
            ops,
            catalogs,
            cfg.node_config,
            cfg.allowlist,
            metrics,
            lambda reason, message: post_node_event(api_client, cfg.node_name, node_uid, reason, message),
        )
        mig_check.check()
        for g in published.gpus:
            log.info(
                "GPU publication",
                gpu=g.gpu_index,
                uuid=g.gpu_uuid,
                whole=g.whole,
                mig_devices=g.mig_devices,
                shared=g.shared,
                reason=g.reason,
            )
        api = KubeClaimApi(api_client, DRIVER_NAME)
        status = StatusWriter(api, store, metrics, cfg.node_name)
        migmode = MigModeManager(ops, {g.index: g for g in gpus}, metrics)
        crash = Crashpoints.from_env(cfg.checkpoint_path.with_name("crashpoint-reached"))
        if crash.armed:
            log.warning("crashpoints armed (fault injection for tests)", points=sorted(crash.armed))
        preparer = Preparer(
            node_name=cfg.node_name,
            ops=ops,
            migmode=migmode,
            inventory=inventory,
            store=store,
            api=api,
            status=status,
            metrics=metrics,
            cdi_dir=cfg.cdi_dir,
            # The simulator has no nvidia-caps; a host table would describe other (real) GPUs.
            mig_minors=None if cfg.is_simulated else cdi.read_mig_minors(),
            crash=crash,
            hami_core=hami_core,
            shared_split_count=cfg.node_config.device_split_count,
            idle=cfg.idle,
            specs=host_spec_writer(
                cdi_dir=cfg.cdi_dir,
                dev_root=cfg.dev_root,
                driver_root=cfg.driver_root,
                proc_root=cfg.proc_root,
                cdi_hook=cfg.nvidia_cdi_hook,
                simulated=cfg.is_simulated,
                proc_root_is_default=cfg.proc_root == Path("/proc"),
                container_dev_root=cfg.container_dev_root,
                container_driver_root=cfg.container_driver_root,
                container_cdi_hook=cfg.container_nvidia_cdi_hook,
            ),
        )
        reconcile(
            preparer=preparer,
            store=store,
            ops=ops,
            api=api,
            gpus=gpus,
            migmode=migmode,
            status=status,
            metrics=metrics,
            # flexmig never changes MIG mode on a node the admin declared hami-core.
            manage_mig_mode=cfg.node_config.operating_mode is not OperatingMode.HAMI_CORE,
        )
        health = NvmlHealthSource(
            nvml,
            inventory,
            store,
            cfg.node_name,
            on_error=lambda exc: metrics.loop_errors.labels(loop="health-events").inc(),
        )
        # Devices an out-of-band instance overlaps are left out of what is published (kubeletplugin/checkpoint/periodic.py).
        publisher = SlicePublisher(
            api_client, cfg.node_name, lambda gen: without_devices(build(gen), periodic.withdrawn()), metrics
        )
        periodic = PeriodicReconciler(
            preparer=preparer,
            store=store,
            ops=ops,
            api=api,
            gpus=gpus,
            inventory=inventory,
            metrics=metrics,
            on_withdrawn_change=publisher.request,
        )

        def reconcile_pass() -> None:
            periodic.run_once()
            mig_check.check()  # cheap (one NVML query per GPU); logs only what changed

        try:
            reconcile_pass()  # before the first publish: never offer a device a foreign instance holds
        except Exception as exc:  # the loop retries it with backoff
            log.warning("first periodic reconcile pass failed", error=f"{type(exc).__name__}: {exc}")
        reconciler = LoopRunner(
            "periodic-reconcile",
            reconcile_pass,
            interval_s=cfg.reconcile_interval_s,
            on_error=lambda exc: metrics.loop_errors.labels(loop="periodic-reconcile").inc(),
        )
        periodic.beat = reconciler.beat
        for runner in (publisher.runner, health.runner, reconciler):
            self.loops.add(runner)
        servers = PluginServers(
            preparer, health_source=health, registry_dir=cfg.registry_dir, plugins_dir=cfg.plugins_dir
        )

        def on_registered() -> None:
            metrics.registered.set(1)
            publisher.registered()  # runs in kubelet's gRPC call: only hand the work off

        servers.state.set_on_registered(on_registered)
        health.start()
        try:
            servers.start()
        except (OSError, ValueError) as exc:
            log.error("cannot start the kubelet plugin servers", error=str(exc))
            health.stop()
            return 1
        self.servers = servers
        install_signal_handlers(servers, signals=(signal.SIGTERM, signal.SIGINT))
        publisher.start()
        reconciler.start()
        log.info(
            "kubelet plugin ready",
            node=cfg.node_name,
            registration_socket=str(servers.registration_socket),
            dra_socket=str(servers.dra_socket),
            devices=len(inventory),
        )
        servers.wait()
        stopping = time.monotonic()
        metrics.registered.set(0)
        still = stop_loops((reconciler, publisher.runner, health.runner))
        if still:
            log.warning(
                "loops still running at exit, left to the process exit", loops=still, budget_s=STOP_LOOPS_S
            )
        preparer.close()
        api_client.close()  # type: ignore[no-untyped-call]
        log.info("kubelet plugin stopped", loops_stop_s=round(time.monotonic() - stopping, 2))
        return 0


def run_plugin(cfg: PluginConfig) -> int:
    return NodeAgent(cfg).run()
