"""benchmarks/packing/priority.py: the priority-mix stream, preemption off and on."""

from __future__ import annotations

import pytest

from benchmarks.packing import online, priority


def test_preemption_places_more_high_priority_pods_and_only_evicts_when_on() -> None:
    scenario = online.SCENARIOS[0]
    stream = online.generate(scenario, 1.1, 300, 0)
    off = priority.run_priority(scenario, stream, 0.25, 0, preemption=False)
    on = priority.run_priority(scenario, stream, 0.25, 0, preemption=True)
    assert off.high == on.high > 0 and off.low == on.low
    assert off.evictions == 0 < on.evictions
    assert on.high_placed > off.high_placed
    assert max(on.high_waits) <= priority.PATIENCE


def test_the_table_has_a_row_per_share_and_switch() -> None:
    text = priority.priority_table(1, 80, [online.SCENARIOS[0]], [0.9], [0.1])
    rows = [line for line in text.splitlines() if line.startswith("| single-8")]
    assert [r.split(" | ")[3:5] for r in rows] == [["0%", "off"], ["0%", "on"]]


def test_with_movable_pods_moves_join_preemption_and_high_pods_still_preempt() -> None:
    scenario = online.SCENARIOS[0]
    stream = online.generate(scenario, 1.1, 300, 0)
    plain = priority.run_priority(scenario, stream, 0.25, 0, preemption=True)
    both = priority.run_priority(scenario, stream, 0.25, 0, preemption=True, movable_share=1.0)
    assert plain.moves == 0 < both.moves and both.evictions_all > 0
    assert (both.high, both.low) == (plain.high, plain.low)  # the same pods, the same priorities
    text = priority.priority_table(1, 80, [scenario], [0.9], [0.1], [0.0, 1.0])
    rows = [line.split(" | ")[3:5] for line in text.splitlines() if line.startswith("| single-8")]
    assert rows == [["0%", "off"], ["0%", "on"], ["100%", "off"], ["100%", "on"]]


def test_share_lists_follow_flexmig_simulates_rules(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.packing.__main__ import main

    for argv, needle in (
        (
            ["--priority-mix", "1"],
            "--priority-mix: '1' is out of range; allowed: numbers above 0 and below 1",
        ),
        (["--movable-shares", "0.5,0.5"], "--movable-shares: '0.5' is given twice"),
        (["--moves-best-case"], "--moves-best-case: needs --movable-shares"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "--skip", "online,offline,scale"])
        assert exit_.value.code == 2 and needle in capsys.readouterr().err
