"""The controller backlog benchmark's arithmetic and table, without a cluster (benchmarks/e2e/backlog.py)."""

from __future__ import annotations

import math

from benchmarks.e2e.backlog import HEADER, Backlog, row


def test_rates_count_from_the_uncordon_and_between_the_first_and_last_gate() -> None:
    r = Backlog(
        pods=101,
        ungated=101,
        first_s=0.5,
        last_s=2.5,
        p50_s=1.5,
        p99_s=2.4,
        running_s=4.0,
        controller_cpu_s=0.6,
        echo_wait_mean_s=0.012,
        released_first_s=0.4,
        released_last_s=1.4,
    )
    assert r.per_s == 101 / 2.5 and r.sustained_per_s == 100 / 2.0 and round(r.released_per_s, 9) == 100.0
    cells = row(r).strip("|").split("|")
    assert len(cells) == HEADER.splitlines()[0].count("|") - 1
    assert cells[5].strip() == "40.4" and cells[6].strip() == "50.0" and cells[-3].strip() == "12"
    assert cells[-2].strip() == "0.40 / 1.40" and cells[-1].strip() == "100.0"


def test_a_backlog_with_no_gate_removed_has_no_rate() -> None:
    nan = float("nan")
    r = Backlog(3, 0, nan, nan, nan, nan, nan, 0.0, nan)
    assert math.isnan(r.per_s) and math.isnan(r.sustained_per_s) and math.isnan(r.released_per_s)
    assert "nan" in row(r)
