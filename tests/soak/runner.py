"""The soak loop: churn in the background, the invariants every cycle, a fault every `fault_every_s`
followed by a settle check, then everything deleted and the final check.

One progress line per cycle; each violation printed once (by kind and subject) with its evidence, and
appended to `SoakConfig.findings` when given. The last line is `cycles: N, violations: V`.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.cluster import ControlPlane

from . import invariants, settle
from .cluster import SoakCluster
from .faults import Fault, FaultContext, FaultResult, run_fault
from .invariants import Reasons, Violation, gated
from .truth import Truth, gather
from .workload import Churn


@dataclass(frozen=True)
class SoakConfig:
    minutes: float
    seed: int
    faults: tuple[Fault, ...] = tuple(Fault)
    fault_every_s: float = 60.0
    first_fault_s: float = 20.0
    down_s: float = 20.0  # API server / webhook outage
    tick_s: float = 3.0
    settle_s: float = 180.0
    final_s: float = 240.0
    max_live: int = 20
    reason_grace_s: float = 90.0
    findings: Path | None = None


@dataclass
class SoakReport:
    cycles: int = 0
    violations: list[Violation] = field(default_factory=list)
    faults: list[FaultResult] = field(default_factory=list)
    churn: str = ""
    seconds: float = 0.0

    @property
    def last_line(self) -> str:
        return f"cycles: {self.cycles}, violations: {len(self.violations)}"


class Soak:
    def __init__(self, cfg: SoakConfig, out: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.out = out or (lambda line: print(line, flush=True))
        self.rng = random.Random(cfg.seed)
        self.report = SoakReport()
        self._seen: set[tuple[str, str]] = set()
        self.reasons = Reasons(cfg.reason_grace_s)
        self.t0 = time.monotonic()

    # --- bookkeeping ------------------------------------------------------------------------------

    def say(self, line: str) -> None:
        self.out(f"[soak {time.monotonic() - self.t0:7.1f}s] {line}")

    def record(self, found: list[Violation], context: str) -> None:
        for v in found:
            if v.key in self._seen:
                continue
            self._seen.add(v.key)
            self.report.violations.append(v)
            self.say(f"{v.render()}\n    during: {context}")
            if self.cfg.findings is not None:
                with self.cfg.findings.open("a") as f:
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
                    f.write(f"\n- {stamp} UTC seed {self.cfg.seed}, during {context}:\n  {v.render()}\n")

    def _checked(self, what: str, check: Callable[..., list[Violation]], *args: object) -> list[Violation]:
        try:
            return check(*args)
        except Exception as exc:  # a checker bug must not hide as "no violation"
            return [
                Violation(
                    "checker-error", what, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=3)
                )
            ]

    # --- the run ----------------------------------------------------------------------------------

    def run(self, cp: ControlPlane) -> SoakReport:
        cfg = self.cfg
        self.say(f"starting: seed {cfg.seed}, {cfg.minutes} min, faults {', '.join(cfg.faults) or 'none'}")
        cluster = SoakCluster(cp)
        failed = True
        try:
            cluster.start()
            nodes = ", ".join(
                f"{n.name} ({n.spec.mode}: {'+'.join(n.spec.gpus)})" for n in cluster.nodes.values()
            )
            self.say(f"cluster up: {nodes}; leader {cluster.leader()}")
            ns = cluster.scenario.test_namespace("soak")
            churn = Churn(cluster.scenario.api, ns, self.rng, pinned_node=cluster.node_named("mig-h100").name,
                          max_live=cfg.max_live)  # fmt: skip
            churn.setup()
            self._loop(cluster, churn, ns)
            failed = bool(self.report.violations)
        finally:
            cluster.stop(failed=failed)
        self.report.seconds = time.monotonic() - self.t0
        return self.report

    def _truth(self, cluster: SoakCluster, ns: str) -> Truth:
        return gather(cluster.scenario.api, ns, cluster.nodes, cluster.leaders)

    def _loop(self, cluster: SoakCluster, churn: Churn, ns: str) -> None:
        cfg = self.cfg
        churn.start()
        start = time.monotonic()
        end = start + cfg.minutes * 60
        next_fault = start + cfg.first_fault_s
        queue: list[Fault] = []
        ctx = FaultContext(cluster, churn, self.rng, cfg.down_s)
        while time.monotonic() < end or len(self.report.faults) < len(
            cfg.faults
        ):  # every fault at least once
            self.report.cycles += 1
            cycle = self.report.cycles
            try:
                truth = self._truth(cluster, ns)
            except Exception as exc:
                self.say(f"cycle {cycle}: could not read the truth: {type(exc).__name__}: {str(exc)[:200]}")
                time.sleep(cfg.tick_s)
                continue
            churn.observe(truth.pods)
            dead = cluster.dead_standin_loops()
            if dead:
                self.record([Violation("harness-loop-dead", "kubelet stand-in", "a stand-in thread ended; "
                                       "this run's node results cannot be trusted", "; ".join(dead))],
                            f"cycle {cycle}")  # fmt: skip
            self.record(self._checked("continuous", invariants.continuous, truth), f"cycle {cycle}")
            self.record(self._checked("reasons", self.reasons.check, truth), f"cycle {cycle}")
            self.say(self._progress(cycle, truth, churn))
            if cfg.faults and time.monotonic() >= next_fault:
                if not queue:
                    queue = list(cfg.faults)
                fault = queue.pop(0)
                self._fault(fault, ctx, cluster, churn, ns)
                next_fault = time.monotonic() + cfg.fault_every_s
            time.sleep(cfg.tick_s)
        churn.stop()
        self.say(f"churn stopped: {churn.summary()}")
        self._settle(cluster, churn, ns, "the end of the churn")
        churn.delete_all()
        self._final(cluster, ns)
        self.report.churn = churn.summary()
        self._summary()

    def _progress(self, cycle: int, t: Truth, churn: Churn) -> str:
        running = sum(1 for p in t.pods if (p.get("status") or {}).get("phase") == "Running")
        gates = sum(1 for p in t.pods if gated(p))
        instances = sum(len(v) for v in t.instances.values())
        s = churn.stats
        return (
            f"cycle {cycle}: pods {len(t.pods)} (running {running}, gated {gates}), allocations {len(t.allocs)}, "
            f"gpu instances {instances}, leader {','.join(t.leaders) or '-'}, created {sum(s.created.values())}, "
            f"deleted {s.deleted}, refused {s.refused}, faults {len(self.report.faults)}, "
            f"violations {len(self.report.violations)}"
        )

    def _fault(self, fault: Fault, ctx: FaultContext, cluster: SoakCluster, churn: Churn, ns: str) -> None:
        self.say(f"fault {fault}: injecting")
        try:
            result = run_fault(fault, ctx)
        except Exception as exc:
            result = FaultResult(fault, False, f"failed: {type(exc).__name__}: {exc}", 0.0)
            self.record([Violation("fault-recovery", str(fault), "the cluster did not recover from the fault",
                                   traceback.format_exc(limit=4))], f"fault {fault}")  # fmt: skip
        self.report.faults.append(result)
        self.say(
            f"fault {fault}: {'reached' if result.reached else 'NOT reached'} ({result.detail}), {result.seconds:.0f}s"
        )
        self.reasons.reset()
        self._settle(cluster, churn, ns, f"after {fault}")

    def _settle(self, cluster: SoakCluster, churn: Churn, ns: str, context: str) -> None:
        names = list(cluster.nodes)
        with churn.paused():
            t0 = last_note = time.monotonic()
            problems: list[Violation] = []
            while True:
                try:
                    truth = self._truth(cluster, ns)
                    problems = self._checked("settled", settle.settled, truth, names)
                    self.record(self._checked("continuous", invariants.continuous, truth), context)
                except Exception as exc:
                    problems = [Violation("settle-read", context, "could not read the truth", repr(exc))]
                if not problems or time.monotonic() - t0 > self.cfg.settle_s:
                    break
                if time.monotonic() - last_note > 30:
                    last_note = time.monotonic()
                    waiting = "; ".join(f"{v.kind} {v.subject}" for v in problems[:4])
                    self.say(f"settling {context}: waiting for {len(problems)}: {waiting}")
                time.sleep(2)
            self.record(problems, f"settle {context} (window {self.cfg.settle_s:.0f}s)")
            self.say(f"settled {context} in {time.monotonic() - t0:.0f}s: {len(problems)} problem(s)")

    def _final(self, cluster: SoakCluster, ns: str) -> None:
        t0 = time.monotonic()
        problems: list[Violation] = []
        while time.monotonic() - t0 < self.cfg.final_s:
            try:
                problems = self._checked("final", settle.final, self._truth(cluster, ns), ns)
            except Exception as exc:
                problems = [Violation("final-read", ns, "could not read the truth", repr(exc))]
            if not problems:
                break
            time.sleep(2)
        self.record(problems, f"after deleting everything (window {self.cfg.final_s:.0f}s)")
        self.say(f"final check after {time.monotonic() - t0:.0f}s: {len(problems)} problem(s) left")

    def _summary(self) -> None:
        for kind in self.cfg.faults:
            runs = [r for r in self.report.faults if r.fault == kind]
            self.say(f"fault {kind}: injected {len(runs)}, reached {sum(r.reached for r in runs)}")
        self.say(self.report.churn)
