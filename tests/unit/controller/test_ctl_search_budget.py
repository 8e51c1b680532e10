"""What searches for room may cost (controller/allocation/searchbudget.py): a pod whose search found
nothing is not searched again for `RETRY_S`, a step spends at most `STEP_BUDGET_S` searching, and what
is put off is decided again once it may be searched."""

from __future__ import annotations

from ctl_helpers import claim, mem
from fake_apiserver import Harness
from test_ctl_preempt import NODE, Evictions, full_a100, running, waiting

from controller.allocation.searchbudget import RETRY_S, SearchBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fruitless_search_waits_its_retry_time_and_is_then_due() -> None:
    clock = Clock()
    budget = SearchBudget(retry_s=5.0, step_budget_s=1.0, clock=clock)
    budget.start_step()
    assert budget.may_search("ns/a")
    budget.searched("ns/a", 0.01, found=False)
    assert not budget.may_search("ns/a") and budget.due() == set()
    clock.now += 4.9
    budget.start_step()
    assert not budget.may_search("ns/a") and budget.due() == set()
    clock.now += 0.2
    budget.start_step()
    assert budget.due() == {"ns/a"} and budget.may_search("ns/a")
    budget.searched("ns/a", 0.01, found=True)
    assert budget.may_search("ns/a")  # found: no retry time


def test_a_step_searches_until_its_budget_is_spent_and_puts_the_rest_off_to_the_next() -> None:
    clock = Clock()
    budget = SearchBudget(retry_s=5.0, step_budget_s=1.0, clock=clock)
    budget.start_step()
    assert budget.may_search("ns/a")
    budget.searched("ns/a", 1.2, found=True)  # one search may overrun; the next waits
    assert not budget.may_search("ns/b") and not budget.may_search("ns/c")
    budget.start_step()
    assert budget.due() == {"ns/b", "ns/c"} and budget.may_search("ns/b")
    budget.forget("ns/c")
    assert len(budget) == 0


def test_a_preemptor_that_found_nothing_is_searched_again_only_after_its_retry_time() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    clock = Clock()
    h.ctl.preemption.budget = SearchBudget(clock=clock)
    ev = Evictions(h)
    full_a100(h, dict.fromkeys(range(7), 100))  # nobody of lower priority: nothing to find
    waiting(h, "urgent", 4000, 50)
    h.deliver()
    h.cycle()
    searches = h.ctl.preemption.searches
    assert searches.labels("nothing")._value.get() == 1
    # A lower-priority pod appears on the node (the capacity change re-decides the waiting pod), but
    # the last search found nothing a moment ago: put off, not searched.
    ev.terminate("low6")
    running(h, "cheap", "gpu-0-mig-1g5gb-19-6", 0)
    h.deliver()
    h.cycle()
    assert ev.sent == [] and searches.labels("put_off")._value.get() >= 1
    # Once its retry time is over, the put-off pod is decided again without any other change.
    clock.now += RETRY_S + 0.1
    h.cycle()
    assert "cheap" in ev.sent and h.ctl.preemption.nominations.get("ns/urgent") is not None


def test_searches_beyond_a_steps_budget_wait_for_the_next_step() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    h.ctl.preemption.budget = SearchBudget(step_budget_s=1e-9)  # one search spends the step's budget
    ev = Evictions(h)
    full_a100(h, {})
    waiting(h, "first", 4000, 100)
    waiting(h, "second", 4000, 100)
    h.deliver()
    h.cycle()
    assert len(ev.sent) == 1  # one search this step; the other pod's is put off
    assert h.ctl.preemption.searches.labels("put_off")._value.get() >= 1
    h.cycle()
    assert len(ev.sent) == 2 and len(h.ctl.preemption.nominations.entries) == 2
    assert h.api.audit() == []


def test_a_pod_that_cannot_be_helped_is_never_searched() -> None:
    h = Harness({NODE: ("A100-40GB", 1)})
    full_a100(h, {})
    waiting(h, "polite", 9000, 100, preemptionPolicy="Never")
    h.add_claim(claim("c-other", mem(4000)))
    h.deliver()
    h.cycle()
    searches = h.ctl.preemption.searches
    assert sum(searches.labels(r)._value.get() for r in ("found", "nothing", "put_off")) == 0
