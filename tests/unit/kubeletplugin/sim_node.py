"""A node for Preparer tests: the real Preparer on the NVML simulator, with the claim API in memory.

`make_node` builds what the plugin's main wires together (NVML ops, MIG mode manager, inventory of
every name a GPU could have, checkpoint store, status writer, metrics) and, for a hami-core node, the
HAMi-core support whose library file the test may leave out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.constants import DRIVER_NAME
from driver.catalog.discover import discover_all
from driver.hamicore import HamiCorePaths
from driver.nvml.port import Nvml
from driver.nvml.sim import MemoryState, SimAdmin, SimGpuSpec, init_sim_state, open_sim
from kubeletplugin.agent.crashpoints import Crashpoints
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.checkpoint.reconcile import ReconcileReport, reconcile
from kubeletplugin.checkpoint.store import CheckpointStore
from kubeletplugin.kube.kubeapi import ClaimNotFound, ClaimView
from kubeletplugin.kube.statuswriter import StatusWriter
from kubeletplugin.prepare.migmode import MigModeManager
from kubeletplugin.prepare.nvmlops import NvmlOps
from kubeletplugin.prepare.preparer import Preparer
from kubeletplugin.publish.inventory import Inventory
from kubeletplugin.settings.idlepolicy import IdlePolicy
from kubeletplugin.shared.hamicore import HamiCoreSupport

MIG_MUTATIONS = ("nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy")


class FakeApi:
    """ClaimApi over dicts: claims by (namespace, name), the status writes it received."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimView] = {}
        self.status: dict[str, list[dict[str, Any]]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None

    def set_device_status(self, claim: ClaimView, devices: list[dict[str, Any]]) -> None:
        self.status[claim.uid] = devices

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        pass  # no pod is known (get_pod answers None unless a test adds one): nothing to mirror


@dataclass
class SimNode:
    nvml: Nvml
    admin: SimAdmin
    api: FakeApi
    store: CheckpointStore
    metrics: NodeMetrics
    preparer: Preparer
    paths: HamiCorePaths
    cdi_dir: Path
    migmode: MigModeManager
    ops: NvmlOps
    hami: HamiCoreSupport | None
    node_name: str = "n1"

    def spec(self, uid: str) -> dict[str, Any]:
        """The CDI spec written for claim `uid`."""
        data: dict[str, Any] = json.loads((self.cdi_dir / f"{DRIVER_NAME}-{uid}.json").read_text())
        return data

    def mig_calls(self) -> dict[str, int]:
        """How often each NVML call that changes MIG state was made."""
        counts = self.admin.call_counts()
        return {name: counts.get(name, 0) for name in MIG_MUTATIONS}

    def reconcile(self, api: Any = None, **options: Any) -> ReconcileReport:
        """The plugin's start-up reconcile on this node (against `api` instead of the node's own
        when given; `options` such as manage_mig_mode=False go through)."""
        api = self.api if api is None else api
        return reconcile(
            preparer=self.preparer,
            store=self.store,
            ops=self.ops,
            api=api,
            gpus=self.nvml.gpus(),
            migmode=self.migmode,
            status=StatusWriter(api, self.store, self.metrics, self.node_name),
            metrics=self.metrics,
            **options,
        )

    def gauge(self, name: str, gpu: int) -> float | None:
        uuid = self.nvml.gpu(gpu).uuid
        return self.metrics.registry.get_sample_value(name, {"gpu": str(gpu), "uuid": uuid})


def make_node(
    tmp_path: Path,
    node_name: str,
    specs: list[SimGpuSpec],
    *,
    api: FakeApi | None = None,
    hami_library: bool | None = None,
    split_count: int | None = None,
    ops_factory: Callable[[Nvml, NodeMetrics], NvmlOps] = NvmlOps,
    memory: bool = False,
    crash: frozenset[str] = frozenset(),
    idle: IdlePolicy | None = None,
) -> SimNode:
    """A node of simulated `specs`; with HAMi-core support unless `hami_library` is None, the library
    file present when it is True; on the in-memory simulator when `memory`; the preparer crashing at
    `crash` points, keeping idle instances per `idle`. A node made again in the same `tmp_path` (a restart) finds the GPUs, checkpoint
    and CDI specs the last one left. The caller closes `preparer`."""
    state = tmp_path / "sim.json"
    if not state.exists():
        init_sim_state(state, specs)
    source: Path | MemoryState = MemoryState.from_file(state) if memory else state
    nvml = open_sim(source)
    nvml.init()
    metrics = NodeMetrics()
    ops = ops_factory(nvml, metrics)
    paths = HamiCorePaths(tmp_path / "host" / "libvgpu.so", tmp_path / "vgpu")
    if hami_library:
        paths.library.parent.mkdir(parents=True)
        paths.library.write_bytes(b"\x7fELF-fake-libvgpu")
    api = api or FakeApi()
    store = CheckpointStore(tmp_path / "state" / "checkpoint.json", "boot-1")
    # Every name a GPU could have; the plugin restricts this to what it published (kubeletplugin/agent/main.py).
    inventory = Inventory.from_catalogs(discover_all(nvml))
    migmode = MigModeManager(ops, {g.index: g for g in nvml.gpus()}, metrics)
    hami = None if hami_library is None else HamiCoreSupport(paths, node_name, metrics)
    preparer = Preparer(
        node_name=node_name,
        ops=ops,
        migmode=migmode,
        inventory=inventory,
        store=store,
        api=api,
        status=StatusWriter(api, store, metrics, node_name),
        metrics=metrics,
        cdi_dir=tmp_path / "cdi",
        mig_minors=None,
        crash=Crashpoints(crash, tmp_path / "marker"),
        hami_core=hami,
        shared_split_count=split_count,
        idle=idle,
    )
    return SimNode(
        nvml,
        SimAdmin(source),
        api,
        store,
        metrics,
        preparer,
        paths,
        tmp_path / "cdi",
        migmode,
        ops,
        hami,
        node_name,
    )
