"""`flexmig simulate --movable-share/--priority-mix` and the engine under it (flexmig/simulation/room.py)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.allocation.moveplan import MovePlan
from driver.policy.model import Choice
from flexmig.cli import main
from flexmig.simulation import room_run, runner, workload
from flexmig.simulation.room import HIGH, RoomRules, RoomSim

NODES = [runner.NodeSpec("n0", ("A100-40GB",) * 2), runner.NodeSpec("n1", ("A100-40GB",) * 2)]
BUSY = ["simulate", "--nodes", "2", "--models", "A100-40GB", "--pods", "150", "--seed", "3", "--quiet"]


class CheckedRealizer(room_run.NvmlRealizer):
    """After every create or destroy, NVML must hold exactly what the decisions hold, GPU by GPU."""

    def __init__(self, cluster: runner.SimulatedCluster) -> None:
        super().__init__(cluster)
        self.events: list[tuple[str, str]] = []

    def _check(self) -> None:
        in_nvml: Counter[tuple[str, int, int, int]] = Counter()
        for node, nvml in self.cluster.ports.items():
            for gpu in nvml.gpus():
                for gi in nvml.gpu_instances(gpu.index):
                    in_nvml[(node, gpu.index, gi.profile_id, gi.placement.start)] += 1
        held: Counter[tuple[str, int, int, int]] = Counter(
            (r.choice.gpu.node, r.choice.gpu.gpu_index, r.choice.profile.gi_profile_id, r.choice.start)
            for rs in self.held.values()
            for r in rs
        )
        assert in_nvml == held

    def started(self, name: str, choices: Sequence[Choice]) -> None:
        super().started(name, choices)
        self.events.append(("start", name))
        self._check()

    def stopped(self, name: str, choices: Sequence[Choice]) -> None:
        super().stopped(name, choices)
        self.events.append(("stop", name))
        self._check()


def _run(rules: RoomRules, movable: float, high: float) -> tuple[RoomSim, CheckedRealizer, int]:
    cluster = runner.SimulatedCluster(NODES)
    try:
        realizer = CheckedRealizer(cluster)
        sim = RoomSim(cluster.state, rules, realizer=realizer)
        for arrival in room_run.arrivals(workload.generate(200, 3), 3, movable, high):
            sim.arrive(arrival, counted=True)
            # The decisions' own view agrees with what NVML holds after every arrival.
            assert sum(len(j.choices) for j in sim.running.values()) == sum(
                len(v) for v in realizer.held.values()
            )
        sim.finish()
        return sim, realizer, cluster.count_instances()
    finally:
        cluster.close()


def test_moves_are_carried_out_in_nvml_stops_before_starts_and_nothing_leaks() -> None:
    rules = RoomRules(moves=True, min_remaining=room_run.MIN_REMAINING, window=room_run.WINDOW)
    sim, realizer, leaked = _run(rules, 1.0, 0.0)
    assert sim.out.moves > 0 and sim.out.plans > 0 and leaked == 0
    # A moved pod is stopped, then started again at its destination: a restart, never a second copy.
    kinds: dict[str, list[str]] = {}
    for kind, name in realizer.events:
        kinds.setdefault(name, []).append(kind)
    assert sum(seq.count("start") - 1 for seq in kinds.values()) == sim.out.moves
    assert all(seq == ["start", "stop"] * (len(seq) // 2) for seq in kinds.values())


def test_only_movable_pods_move_and_only_lower_priority_pods_are_evicted() -> None:
    rules = RoomRules(
        preemption=True,
        moves=True,
        patience=room_run.PATIENCE,
        min_remaining=room_run.MIN_REMAINING,
        window=room_run.WINDOW,
    )
    cluster = runner.SimulatedCluster(NODES)
    try:
        sim = RoomSim(cluster.state, rules, realizer=room_run.NvmlRealizer(cluster))
        moved: list[str] = []
        evicted: list[tuple[int, int]] = []
        plan = sim._plan
        pods = {a.name: a for a in room_run.arrivals(workload.generate(200, 3), 3, 0.3, 0.25)}

        def watched_plan(job: Any, now: float) -> MovePlan | None:
            found = plan(job, now)
            moved.extend(c.key for c, _ in (found.moves if found else ()))
            return found

        def watched_preempt(job: Any, now: float) -> bool:
            before = set(sim.running)
            done = RoomSim._preempt(sim, job, now)
            evicted.extend((job.pod.priority, pods[n].priority) for n in before - set(sim.running))
            return done

        sim._plan = watched_plan  # type: ignore[method-assign]
        sim._preempt = watched_preempt  # type: ignore[method-assign]
        for arrival in pods.values():
            sim.arrive(arrival, counted=True)
        sim.finish()
        assert moved and all(pods[name].movable for name in moved)
        assert evicted and all(mine == HIGH and theirs < HIGH for mine, theirs in evicted)
        assert cluster.count_instances() == 0
    finally:
        cluster.close()


def test_movable_rows_start_from_flexmig_and_stay_under_their_ceiling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*BUSY, "--policy", "flexmig", "--movable-share", "0,1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    flexmig = doc["results"][0]
    none, every = doc["making_room"]
    # 0 % movable is flexmig's own run: the same pods placed as the main table's row.
    assert (none["movable_share"], none["accepted"], none["moves"]) == (0.0, flexmig["accepted"], 0)
    assert none["refused_by_size"] == flexmig["refused_by_size"]
    assert every["moves"] > 0 and every["pods_placed_by_a_plan"] > 0
    assert every["memory_acceptance"] >= none["memory_acceptance"]
    for row in (none, every):
        assert row["gi_leaked"] == 0 and row["high"]["pods"] == 0 and row["evictions"] == 0
        assert row["memory_acceptance"] <= row["ceiling"]["memory_acceptance"] + 0.02


def test_priority_rows_preempt_only_when_on_and_print_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BUSY, "--policy", "flexmig", "--priority-mix", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "Priority preemption" in out and "Moving movable pods" not in out
    assert main([*BUSY, "--policy", "flexmig", "--priority-mix", "0.25", "--json"]) == 0
    off, on = json.loads(capsys.readouterr().out)["making_room"]
    assert (off["preemption"], on["preemption"]) == (False, True)
    assert off["evictions"] == 0 < on["evictions"] and off["high"]["pods"] == on["high"]["pods"] > 0
    assert (
        on["high"]["placed"] >= off["high"]["placed"] and on["high"]["wait_mean"] <= off["high"]["wait_mean"]
    )
    assert off["ceiling"] is None and off["gi_leaked"] == on["gi_leaked"] == 0


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--movable-share", "1.5"], "--movable-share: '1.5' is out of range; allowed: numbers from 0 to 1"),
        (["--movable-share", "nan"], "--movable-share: 'nan' is out of range"),
        (
            ["--movable-share", "half"],
            "--movable-share: 'half' is not a number; allowed: numbers from 0 to 1",
        ),
        (["--movable-share", "0.5,0.5"], "--movable-share: '0.5' is given twice"),
        (
            ["--movable-share", ",".join(str(i / 10) for i in range(9))],
            "--movable-share: 9 values; at most 8",
        ),
        (
            ["--priority-mix", "0"],
            "--priority-mix: '0' is out of range; allowed: numbers above 0 and below 1",
        ),
        (["--priority-mix", "1"], "--priority-mix: '1' is out of range"),
    ],
)
def test_bad_shares_name_the_flag_and_run_nothing(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    monkeypatch.setattr(runner, "run", lambda *a, **k: ran.append(a))
    assert main(["simulate", "--quiet", *argv]) == 2
    captured = capsys.readouterr()
    assert ran == [] and captured.out == "" and captured.err.count("\n") == 1 and needle in captured.err


def test_the_report_page_carries_the_making_room_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = f"{tmp_path}/report"
    assert main([*BUSY, "--policy", "flexmig", "--movable-share", "1", "--report", out]) == 0
    page = Path(out, "index.html").read_text(encoding="utf-8")
    assert "Moving movable pods to make room" in page and "ceiling mem %" in page
    assert json.loads(Path(out, "simulate.json").read_text())["making_room"][0]["movable_share"] == 1.0
    assert "Moving movable pods" in capsys.readouterr().out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    movable=st.sampled_from([0.0, 0.3, 1.0]),
    high=st.sampled_from([0.0, 0.25]),
    preemption=st.booleans(),
    patience=st.sampled_from([0.0, room_run.PATIENCE]),
)
def test_any_stream_keeps_nvml_equal_to_the_decisions_and_counts_each_pod_once(
    seed: int, movable: float, high: float, preemption: bool, patience: float
) -> None:
    rules = RoomRules(
        preemption=preemption,
        moves=movable > 0,
        patience=patience,
        min_remaining=room_run.MIN_REMAINING,
        window=room_run.WINDOW,
    )
    cluster = runner.SimulatedCluster([runner.NodeSpec("n0", ("A100-40GB", "H100-80GB"))])
    try:
        realizer = CheckedRealizer(cluster)  # checks NVML against the decisions at every step
        sim = RoomSim(cluster.state, rules, realizer=realizer)
        pods = room_run.arrivals(workload.generate(80, seed), seed, movable, high)
        for n, arrival in enumerate(pods):
            sim.arrive(arrival, counted=n >= 10)
        sim.finish()
        out = sim.out
        assert cluster.count_instances() == 0 and not realizer.held
        assert out.pods == 70 and out.placed + sum(out.refused_by_size.values()) == out.pods
        assert out.high + out.low == out.pods and out.high_placed + out.low_placed == out.placed
        assert out.high_placed == len(out.high_waits) and all(0 <= w <= patience for w in out.high_waits)
        assert out.moves == 0 or (rules.moves and out.plans <= out.moves)
        assert out.evictions_all == 0 or preemption
    finally:
        cluster.close()
