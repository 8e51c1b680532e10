"""driver/policy/batch.py `size_order`, the order the controller decides a step's pending pods in
(through driver/policy/placer.py `Placer.batch_order`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from driver.policy.batch import PodSize, batch_order, size_order
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
