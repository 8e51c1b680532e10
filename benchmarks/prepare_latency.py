"""Prepare/unprepare latency of the kubelet plugin's own code for N claims arriving at once.

    python -m benchmarks.prepare_latency [--sim memory,file] [--scenarios 8x1,8x56,16x100]
                                         [--latency zero,realistic] [--rounds 3]

What runs: the plugin's `Preparer` wired as `flexmig kubeletplugin` wires it (NVML ops, MIG mode
manager, inventory discovered from the GPUs, checkpoint store fsyncing to a temp directory on disk,
CDI spec writer, status writer, metrics), on the NVML simulator with A100-40GB GPUs in MIG mode. The
claim API is an in-memory fake, so the API server's and gRPC's costs are left out (the full round trip
through a real control plane is benchmarks/prepare_latency_e2e.py). A scenario `GxN` has G GPUs and N
claims of one 1g.5gb device each, on distinct placements (7 per GPU). A round releases N threads at
once, each calling `prepare` for one claim (as kubelet's N calls when N pods start together), then N
threads calling `unprepare`; each call's latency is measured around the call.

Columns: latency percentiles; `nvml p99`: time a claim spent inside NVML calls (the simulator's work,
its locks and its configured latency); `rest p99`: latency minus that (the plugin's own code,
checkpoint fsyncs, waiting for the claim's GPU locks, and waiting for the interpreter lock while the
other claims' threads run, the in-process simulator's included); `cpu/claim`: the process's CPU time
over the prepare rounds per claim (plugin, simulator and the benchmark's threads; N claims sent at
once cannot all finish before about N times this, since one interpreter runs them); `fsync/claim`:
fsync calls (file and directory, checkpoint and CDI) during the prepare rounds per claim; `writes/fsync`:
checkpoint updates per durable checkpoint write (group commit makes it > 1; the GI/CI ids, not waited
for, ride along with the next durable write). At latency zero the whole latency is the plugin's
overhead plus the simulator's CPU.

Simulator modes: `file` (every NVML call a locked transaction on one state file for the whole node)
and `memory` (in-process state, per-GPU locks, latency slept per GPU). Latency profiles: `zero`, and
`realistic`, an assumption, not a measurement: GI create 300 ms, CI create 100 ms, GI destroy 150 ms,
CI destroy 50 ms, MIG mode switch 500 ms, any other call 1 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.constants import DRIVER_NAME  # noqa: E402
from driver.catalog.discover import discover_all  # noqa: E402
from driver.nvml.port import Nvml  # noqa: E402
from driver.nvml.sim import SimAdmin, SimGpuSpec, init_sim_state, open_sim  # noqa: E402
from flexmig.logsetup import configure_logging  # noqa: E402
from kubeletplugin.agent.crashpoints import Crashpoints  # noqa: E402
from kubeletplugin.agent.metrics import NodeMetrics  # noqa: E402
from kubeletplugin.checkpoint.store import CheckpointStore  # noqa: E402
from kubeletplugin.grpcserver import ClaimRef  # noqa: E402
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimNotFound, ClaimView, PodRef  # noqa: E402
from kubeletplugin.kube.statuswriter import StatusWriter  # noqa: E402
from kubeletplugin.prepare.migmode import MigModeManager  # noqa: E402
from kubeletplugin.prepare.nvmlops import NvmlOps  # noqa: E402
from kubeletplugin.prepare.preparer import Preparer  # noqa: E402
from kubeletplugin.publish.inventory import Inventory  # noqa: E402

T = TypeVar("T")
NODE = "bench-node"
REALISTIC_S = {
    "nvmlDeviceCreateGpuInstanceWithPlacement": 0.300,
    "nvmlGpuInstanceCreateComputeInstance": 0.100,
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement": 0.100,
    "nvmlGpuInstanceDestroy": 0.150,
    "nvmlComputeInstanceDestroy": 0.050,
    "nvmlDeviceSetMigMode": 0.500,
}
REALISTIC_DEFAULT_S = 0.001
SIM_MODES = ("memory", "file")
LATENCIES = ("zero", "realistic")


class FakeApi:
    """The claim API in memory: claims by (namespace, name); status and pod writes are dropped."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], ClaimView] = {}

    def get_claim(self, namespace: str, name: str) -> ClaimView:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None

    def set_device_status(self, claim: ClaimView, devices: list[dict[str, Any]]) -> None:
        pass

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    def set_pod_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        pass


class TimedOps(NvmlOps):
    """NvmlOps that adds the time of every NVML call to the calling thread's total."""

    local = threading.local()

    def _counted(self, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return super()._counted(fn)
        finally:
            TimedOps.local.spent = getattr(TimedOps.local, "spent", 0.0) + time.perf_counter() - start


@dataclass
class Result:
    prep: list[float]
    unprep: list[float]
    prep_nvml: list[float]
    unprep_nvml: list[float]
    prep_cpu: float
    prep_fsyncs: int
    writes: int
    commits: int
    errors: list[str]


def _open(mode: str, state: Path) -> Nvml:
    if mode == "file":
        return open_sim(state)
    from driver.nvml.sim import MemoryState  # the fast mode; absent before it was written

    return open_sim(MemoryState.from_file(state))


def _admin(nvml: Nvml, state: Path) -> SimAdmin:
    lib: Any = nvml._lib  # the simulated library; its in-memory state, if any, is what admin changes
    memory = getattr(lib, "_memory", None)
    return SimAdmin(memory if memory is not None else state)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    # The plugin logs every prepared claim as JSON to stderr, as in production; rendering stays in the
    # measurement, the lines go nowhere.
    saved = sys.stderr
    with open(os.devnull, "w") as devnull:
        sys.stderr = devnull
        try:
            yield
        finally:
            sys.stderr = saved


@contextlib.contextmanager
def _counting_fsyncs() -> Iterator[list[int]]:
    """Count os.fsync calls (file and directory) made meanwhile, by any thread."""
    count = [0]
    real = os.fsync
    lock = threading.Lock()

    def fsync(fd: Any) -> None:
        with lock:
            count[0] += 1
        real(fd)

    os.fsync = fsync
    try:
        yield count
    finally:
        os.fsync = real


def _all_at_once(calls: list[Callable[[], T]]) -> list[tuple[float, float, T]]:
    """Run each call in its own thread, released together; (latency, NVML time, result) per call."""
    barrier = threading.Barrier(len(calls))
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        TimedOps.local.spent = 0.0
        start = time.perf_counter()
        result = calls[i]()
        out[i] = (time.perf_counter() - start, TimedOps.local.spent, result)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _prepare_error(preparer: Preparer, ref: ClaimRef) -> str:
    return preparer.prepare([ref])[ref.uid].error


def _unprepare_error(preparer: Preparer, ref: ClaimRef) -> str | None:
    return preparer.unprepare([ref])[ref.uid]


def run_scenario(workdir: Path, mode: str, gpus: int, claims: int, latency: str, rounds: int) -> Result:
    state = workdir / "sim.json"
    init_sim_state(state, [SimGpuSpec("A100-40GB") for _ in range(gpus)], overwrite=True)
    nvml = _open(mode, state)
    nvml.init()
    metrics = NodeMetrics()
    ops = TimedOps(nvml, metrics)
    api = FakeApi()
    store = CheckpointStore(workdir / "checkpoint.json", "bench-boot")
    preparer = Preparer(
        node_name=NODE,
        ops=ops,
        migmode=MigModeManager(ops, {g.index: g for g in nvml.gpus()}, metrics),
        inventory=Inventory.from_catalogs(discover_all(nvml)),
        store=store,
        api=api,
        status=StatusWriter(api, store, metrics, NODE),
        metrics=metrics,
        cdi_dir=workdir / "cdi",
        mig_minors=None,
        crash=Crashpoints(frozenset(), workdir / "crash-marker"),
    )
    if latency == "realistic":
        _admin(nvml, state).set_latency(REALISTIC_DEFAULT_S, **REALISTIC_S)
    refs = []
    for i in range(claims):
        uid = f"00000000-0000-4000-8000-{i:012d}"
        device = f"gpu-{i // 7}-mig-1g5gb-19-{i % 7}"
        result = AllocatedDevice("gpu", DRIVER_NAME, NODE, device)
        api.claims[("bench", f"c{i}")] = ClaimView(
            "bench", f"c{i}", uid, (result,), (PodRef("bench", f"p{i}", f"pod-{i}"),)
        )
        refs.append(ClaimRef(namespace="bench", uid=uid, name=f"c{i}"))
    res = Result([], [], [], [], 0.0, 0, 0, 0, [])
    # Count checkpoint updates, to show how many shared one durable write. (A store without `begin`,
    # before changes could be begun and finished apart, counts each `update`.)
    real_update = store.update
    real_begin = getattr(store, "begin", None)

    def counted_update(mutate: Callable[[Any], T], **kw: Any) -> T:
        if real_begin is None or not kw.get("wait", True):  # else counted by begin
            res.writes += 1
        return real_update(mutate, **kw)

    def counted_begin(mutate: Callable[[Any], T]) -> Any:
        res.writes += 1
        assert real_begin is not None
        return real_begin(mutate)

    store.update = counted_update  # type: ignore[method-assign]
    if real_begin is not None:
        store.begin = counted_begin  # type: ignore[method-assign]
    try:
        with _quiet_stderr():
            # Warm-up: first-call costs (imports, profile caches) are not latency.
            preparer.prepare([refs[0]])
            preparer.unprepare([refs[0]])
            res.writes, commits_before = 0, getattr(store, "commits", 0)
            for _ in range(rounds):
                cpu = time.process_time()
                with _counting_fsyncs() as fsyncs:
                    done = _all_at_once([functools.partial(_prepare_error, preparer, r) for r in refs])
                res.prep_cpu += time.process_time() - cpu
                res.prep_fsyncs += fsyncs[0]
                res.errors += [e for _, _, e in done if e]
                res.prep += [t for t, _, _ in done]
                res.prep_nvml += [n for _, n, _ in done]
                undone = _all_at_once([functools.partial(_unprepare_error, preparer, r) for r in refs])
                res.errors += [e for _, _, e in undone if e]
                res.unprep += [t for t, _, _ in undone]
                res.unprep_nvml += [n for _, n, _ in undone]
            res.commits = getattr(store, "commits", 0) - commits_before
    finally:
        preparer.close()
        nvml.shutdown()
    return res


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _row(mode: str, gpus: int, claims: int, latency: str, res: Result) -> str:
    rest = [t - n for t, n in zip(res.prep, res.prep_nvml, strict=True)]
    per_write = f"{res.writes / res.commits:.1f}" if res.commits else "-"
    return (
        f"| {mode} | {latency} | {gpus} | {claims} | {_ms(statistics.median(res.prep))} |"
        f" {_ms(_pct(res.prep, 0.99))} | {_ms(_pct(res.prep_nvml, 0.99))} | {_ms(_pct(rest, 0.99))} |"
        f" {_ms(res.prep_cpu / len(res.prep))} | {res.prep_fsyncs / len(res.prep):.1f} |"
        f" {_ms(statistics.median(res.unprep))} |"
        f" {_ms(_pct(res.unprep, 0.99))} | {per_write} |"
    )


def _scenario(text: str) -> tuple[int, int]:
    try:
        gpus, claims = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scenarios: {text!r} is not GPUSxCLAIMS, e.g. 8x56") from None
    if gpus < 1 or not 1 <= claims <= 7 * gpus:
        raise argparse.ArgumentTypeError(f"--scenarios: {text!r} needs 1 <= claims <= 7 x GPUs")
    return gpus, claims


def _scenarios(text: str) -> list[tuple[int, int]]:
    return [_scenario(s) for s in text.split(",")]


def _choices(name: str, allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{name}: {bad or text!r}; allowed: {', '.join(allowed)}")
        return values

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", type=_choices("--sim", SIM_MODES), default=list(SIM_MODES))
    parser.add_argument("--latency", type=_choices("--latency", LATENCIES), default=list(LATENCIES))
    parser.add_argument(
        "--scenarios",
        type=_scenarios,
        default=[(8, 1), (8, 56), (16, 100)],
        help="GPUSxCLAIMS, comma-separated (default 8x1,8x56,16x100)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario (default 3)")
    parser.add_argument("--workdir", type=Path, default=None, help="where checkpoint and CDI files go")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    configure_logging("info", "json", component="kubeletplugin")
    rows = []
    failed = False
    for latency in args.latency:
        for mode in args.sim:
            for gpus, claims in args.scenarios:
                print(f"  {mode} sim, latency {latency}, {gpus} GPUs x {claims} claims ...", file=sys.stderr)
                with tempfile.TemporaryDirectory(dir=args.workdir, prefix="prepare-bench-") as tmp:
                    res = run_scenario(Path(tmp), mode, gpus, claims, latency, args.rounds)
                rows.append(_row(mode, gpus, claims, latency, res))
                if res.errors:
                    failed = True
                    print(f"    {len(res.errors)} errors, first: {res.errors[0]}", file=sys.stderr)
    print(
        f"\nprepare/unprepare latency (ms), {args.rounds} rounds, A100-40GB, 1g.5gb claims all sent at once"
    )
    print(
        "| sim | NVML latency | GPUs | claims | prep p50 | prep p99 | nvml p99 | rest p99 | cpu/claim |"
        " fsync/claim | unprep p50 | unprep p99 | writes/fsync |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
