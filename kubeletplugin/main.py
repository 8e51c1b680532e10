"""The node agent process: wires NVML, checkpoint, API, reconcile, gRPC servers, slices and metrics.

Start-up order matters:
  metrics server (so a crash-looping plugin is still observable) -> NVML -> GPU catalog -> checkpoint
  (a corrupt one stops the plugin: guessing would leak or destroy instances) -> API client ->
  startup reconcile (before kubelet can call us) -> health watcher -> gRPC servers -> slice publisher.
The publisher runs on every (re)registration, because kubelet wipes the node's slices then.

Which devices exist is decided once, at start, from the catalog, the node config and each GPU's MIG
mode (design.md: Ampere publishes what its current mode allows). A GPU reset that changes an Ampere
GPU's mode therefore needs a plugin restart, which an administrator doing a reset does anyway.
"""

from __future__ import annotations

import signal

import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from api.constants import DRIVER_NAME
from driver import cdi
from driver.catalog.discover import discover_all
from driver.hamicore import HamiCorePaths
from driver.nvml.backend import open_nvml
from driver.nvml.port import Nvml
from driver.nvml.types import GpuInfo, NvmlError
from kubeletplugin.checkpoint import CheckpointStore, read_boot_id
from kubeletplugin.checkpoint_model import CheckpointCorrupt
from kubeletplugin.config import PluginConfig
from kubeletplugin.crashpoints import Crashpoints
from kubeletplugin.grpcserver import PluginServers, install_signal_handlers
from kubeletplugin.hamicoresupport import HamiCoreSupport
from kubeletplugin.health import NvmlHealthSource
from kubeletplugin.inventory import Inventory
from kubeletplugin.kubeapi import KubeClaimApi
from kubeletplugin.metrics import MetricsServer, NodeMetrics
from kubeletplugin.migmode import MigModeManager
from kubeletplugin.nvmlops import NvmlOps
from kubeletplugin.preparer import Preparer
from kubeletplugin.publisher import SlicePublisher
from kubeletplugin.reconcile import reconcile
from kubeletplugin.slices import NodeSlices, build_node_slices
from kubeletplugin.statuswriter import StatusWriter

log = structlog.get_logger(__name__)


def _api_client(cfg: PluginConfig) -> k8s.ApiClient:
    if cfg.kubeconfig is not None:
        client: k8s.ApiClient = k8s_config.new_client_from_config(config_file=str(cfg.kubeconfig))  # type: ignore[no-untyped-call]
        return client
    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    return k8s.ApiClient()


def _node_uid(api_client: k8s.ApiClient, node: str) -> str | None:
    try:
        meta = k8s.CoreV1Api(api_client).read_node(node).metadata
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


def _published_inventory(full: Inventory, slices: NodeSlices) -> Inventory:
    names = {d["name"] for s in slices.slices for d in s.body["spec"].get("devices") or []}
    return Inventory({n: d for n in names if (d := full.get(n)) is not None})


class NodeAgent:
    """One plugin process's components; `run()` blocks until SIGTERM/SIGINT."""

    def __init__(self, cfg: PluginConfig) -> None:
        self.cfg = cfg
        self.metrics = NodeMetrics()
        self.servers: PluginServers | None = None

    def healthy(self) -> tuple[bool, str]:
        if self.servers is None or self.servers.stopped:
            return False, "starting or stopping\n"
        st = self.servers.state.status()
        return True, f"serving; registered={st.registered} registrations={st.registrations}\n"

    def run(self) -> int:
        cfg = self.cfg
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
        nvml = open_nvml(cfg.nvml_spec)
        try:
            nvml.init()
        except NvmlError as exc:
            log.error("NVML initialisation failed", backend=cfg.nvml_spec, error=str(exc))
            if metrics_server is not None:
                metrics_server.stop()
            return 1
        try:
            return self._serve(nvml)
        finally:
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
        node_uid = _node_uid(api_client, cfg.node_name)

        def build(generation: int) -> NodeSlices:
            return build_node_slices(
                catalogs, cfg.node_name, generation, cfg.node_config, modes, node_uid=node_uid
            )

        inventory = _published_inventory(Inventory.from_catalogs(catalogs), build(0))
        for g in build(0).gpus:
            log.info(
                "GPU publication",
                gpu=g.gpu_index,
                uuid=g.gpu_uuid,
                whole=g.whole,
                mig_devices=g.mig_devices,
                shared=g.shared,
                reason=g.reason,
            )
        hami_core: HamiCoreSupport | None = None
        if cfg.node_config.publishes_shared:
            hami_core = HamiCoreSupport(
                HamiCorePaths(cfg.hami_core_library, cfg.hami_core_dir), cfg.node_name, metrics
            )
            try:
                hami_core.check()  # logs a warning and sets the metric when the library is absent
            except OSError as exc:  # e.g. the ld.so.preload file cannot be written
                log.error("cannot set up HAMi-core", dir=str(cfg.hami_core_dir), error=str(exc))
                return 1
            metrics.add_refresher(hami_core.check)  # installing the library shows up at the next scrape
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
            manage_mig_mode=not cfg.node_config.publishes_shared,
        )
        health = NvmlHealthSource(nvml, inventory, store, cfg.node_name)
        publisher = SlicePublisher(api_client, cfg.node_name, build, metrics)
        servers = PluginServers(
            preparer, health_source=health, registry_dir=cfg.registry_dir, plugins_dir=cfg.plugins_dir
        )

        def on_registered() -> None:
            metrics.registered.set(1)
            publisher.request()  # runs in kubelet's gRPC call: only hand the work off

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
        log.info(
            "kubelet plugin ready",
            node=cfg.node_name,
            registration_socket=str(servers.registration_socket),
            dra_socket=str(servers.dra_socket),
            devices=len(inventory),
        )
        servers.wait()
        metrics.registered.set(0)
        publisher.stop()
        health.stop()
        preparer.close()
        api_client.close()  # type: ignore[no-untyped-call]
        log.info("kubelet plugin stopped")
        return 0


def run_plugin(cfg: PluginConfig) -> int:
    return NodeAgent(cfg).run()
