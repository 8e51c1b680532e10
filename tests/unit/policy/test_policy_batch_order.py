"""driver/policy/batch.py `size_order`, the order the controller decides a step's pending pods in
(through driver/policy/placer.py `Placer.batch_order`): largest first, except pods that waited
`AGE_FIRST_AFTER_S`, which go first, longest wait first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driver.policy.batch import AGE_FIRST_AFTER_S, PodSize, batch_order, size_order
from driver.policy.model import DeviceRequest
from driver.policy.placer import Placer


def test_memory_first_then_devices_then_input_order_and_unknown_sizes_last() -> None:
    sizes = [None, PodSize(4864, 1), PodSize(9728, 2), None, PodSize(9728, 1), PodSize(9728, 2)]
    assert size_order(sizes) == [2, 5, 4, 1, 0, 3]
    assert Placer().batch_order(sizes) == size_order(sizes)


def test_batch_order_sizes_pods_by_their_requests() -> None:
    small = [DeviceRequest("a", 4000)]
    two = [DeviceRequest("a", 4000), DeviceRequest("b", 4000)]
    same_memory_one_device = [DeviceRequest("a", 8000)]
    assert batch_order([small, two, same_memory_one_device]) == [1, 2, 0]


sizes_st = st.lists(st.none() | st.builds(PodSize, st.integers(0, 100_000), st.integers(1, 8)), max_size=20)


@given(sizes_st)
def test_size_order_is_a_permutation_sorted_by_size_and_stable(sizes: list[PodSize | None]) -> None:
    order = size_order(sizes)
    assert sorted(order) == list(range(len(sizes)))
    keys = [(1, 0, 0, i) if (s := sizes[i]) is None else (0, -s.memory_mib, -s.devices, i) for i in order]
    assert keys == sorted(keys)


@given(st.data())
def test_with_waits_old_pods_come_first_by_wait_then_the_rest_by_size(data: st.DataObject) -> None:
    sizes = data.draw(sizes_st)
    waited = data.draw(st.lists(st.floats(0, 1000), min_size=len(sizes), max_size=len(sizes)))
    order = size_order(sizes, waited)
    assert sorted(order) == list(range(len(sizes)))
    old = [i for i in order if waited[i] >= AGE_FIRST_AFTER_S]
    assert order[: len(old)] == old  # every old pod before every young one
    assert [(-waited[i], i) for i in old] == sorted((-waited[i], i) for i in old)
    young = order[len(old) :]
    assert young == [i for i in size_order(sizes) if i in set(young)]


def test_pods_that_waited_long_enough_go_first_longest_wait_first_whatever_their_size() -> None:
    sizes = [PodSize(4864, 1), PodSize(40192, 1), None, PodSize(9728, 1), PodSize(19968, 1)]
    young = [0.0, 5.0, 10.0, 60.0, 1.0]
    assert size_order(sizes, young) == size_order(sizes) == [1, 4, 3, 0, 2]
    # p3 and the unsized p2 are old: p2 waited longer; the rest keep the size order.
    waited = [0.0, 5.0, AGE_FIRST_AFTER_S + 50, AGE_FIRST_AFTER_S, 1.0]
    assert size_order(sizes, waited) == [2, 3, 1, 4, 0]
    assert Placer().batch_order(sizes, waited) == [2, 3, 1, 4, 0]
    assert size_order(sizes, waited, age_first_after_s=float("inf")) == size_order(sizes)
    assert size_order(sizes, [AGE_FIRST_AFTER_S] * 5) == [0, 1, 2, 3, 4]  # equal waits: input order
    with pytest.raises(ValueError):
        size_order(sizes, [0.0])
