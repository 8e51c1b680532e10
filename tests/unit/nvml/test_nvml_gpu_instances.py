"""GPU-instance behaviour of the simulator, exercised through the `Nvml` port."""

from __future__ import annotations

import pytest

from driver.nvml.types import NvmlError, NvmlErrorCode, Placement
from tests.unit.nvml.conftest import SimFactory

P_1G, P_1G_ME, P_1G_2X, P_2G, P_3G, P_4G, P_7G = 19, 20, 15, 14, 9, 5, 0
ERR = NvmlErrorCode


@pytest.fixture(params=["file", "memory"])
def sim_mode(request: pytest.FixtureRequest) -> str:
    """Every test here runs on both simulator modes: the in-memory one must follow the same rules."""
    return str(request.param)


def _code(exc: pytest.ExceptionInfo[NvmlError]) -> NvmlErrorCode:
    return exc.value.code


def test_profiles_report_ids_placements_and_memory(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    by_id = {p.profile_id: p for p in nvml.gi_profiles(0)}
    assert set(by_id) == {19, 20, 15, 14, 9, 5, 0}
    assert by_id[P_3G].placements == (Placement(0, 4), Placement(4, 4))
    assert by_id[P_1G_2X].placements == tuple(Placement(s, 2) for s in (0, 2, 4, 6))
    assert [by_id[i].memory_mib for i in (P_1G, P_2G, P_3G, P_7G)] == [4864, 9856, 19968, 40192]
    assert by_id[P_7G].compute_slices == 7 and by_id[P_7G].memory_slices == 8
    assert by_id[P_1G_ME].enum_index == 7 and by_id[P_1G_2X].enum_index == 9
    assert by_id[P_3G].nvml_name == "MIG 3g.20gb"
    assert nvml.gi_profile_by_id(0, P_4G).instance_count == 1


def test_unknown_profile_id_is_invalid_argument(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    with pytest.raises(NvmlError) as exc:
        nvml.gi_profile_by_id(0, 42)
    assert _code(exc) is ERR.INVALID_ARGUMENT
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, 42, 0)
    assert _code(exc) is ERR.INVALID_ARGUMENT


def test_start_outside_profile_placements_is_invalid_argument(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, P_3G, 2)
    assert _code(exc) is ERR.INVALID_ARGUMENT
    assert exc.value.function == "nvmlDeviceCreateGpuInstanceWithPlacement"


def test_4g_at_0_plus_3g_at_4_is_accepted(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    nvml.create_gpu_instance(0, P_4G, 0)
    nvml.create_gpu_instance(0, P_3G, 4)
    assert [(g.profile_id, g.placement) for g in nvml.gpu_instances(0)] == [
        (P_4G, Placement(0, 4)),
        (P_3G, Placement(4, 4)),
    ]
    assert all(nvml.gi_remaining_capacity(0, p.profile_id) == 0 for p in nvml.gi_profiles(0))


def test_3g_plus_3g_uses_six_compute_slices_and_fills_memory(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    nvml.create_gpu_instance(0, P_3G, 0)
    nvml.create_gpu_instance(0, P_3G, 4)
    profiles = {p.profile_id: p for p in nvml.gi_profiles(0)}
    used = sum(profiles[g.profile_id].compute_slices for g in nvml.gpu_instances(0))
    assert used == 6
    with pytest.raises(NvmlError) as exc:  # one compute slice is left, but no memory slice
        nvml.create_gpu_instance(0, P_1G, 6)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES


def test_overlap_is_insufficient_resources(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-80GB")
    nvml.create_gpu_instance(0, P_2G, 2)
    for profile, start in ((P_1G, 2), (P_1G, 3), (P_3G, 0), (P_1G_2X, 2), (P_7G, 0)):
        with pytest.raises(NvmlError) as exc:
            nvml.create_gpu_instance(0, profile, start)
        assert _code(exc) is ERR.INSUFFICIENT_RESOURCES, (profile, start)
    assert len(nvml.gpu_instances(0)) == 1  # failed creations leave nothing behind


def test_compute_budget_limits_creation(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    for start in range(7):
        nvml.create_gpu_instance(0, P_1G, start)
    # Memory slice 7 is free, but only a 1g.10gb@6 / 3g@4 / 7g could reach it and compute is used up.
    assert nvml.gi_remaining_capacity(0, P_1G) == 0
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, P_1G, 0)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES


def test_max_instances_and_single_plus_me(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    nvml.create_gpu_instance(0, P_1G_ME, 0)
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, P_1G_ME, 1)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES
    assert nvml.gi_remaining_capacity(0, P_1G_ME) == 0


def test_a30_plus_me_profiles_share_one_media_engine(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A30-24GB")
    assert {p.profile_id: p.memory_slices for p in nvml.gi_profiles(0)} == {14: 1, 21: 1, 5: 2, 6: 2, 0: 4}
    nvml.create_gpu_instance(0, 21, 0)  # 1g.6gb+me
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, 6, 2)  # 2g.12gb+me
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES
    nvml.create_gpu_instance(0, 5, 2)
    nvml.create_gpu_instance(0, 14, 1)
    with pytest.raises(NvmlError) as exc:  # 4 compute slices used: 1 + 2 + 1
        nvml.create_gpu_instance(0, 0, 0)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES


def test_rtx_pro_me_all_rules(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("RTX-PRO-6000")
    one_me_all, one_no_me, one_plain, two_no_me = 65, 67, 14, 66
    assert nvml.gi_profile_by_id(0, 5).placements == (Placement(0, 6), Placement(6, 6))
    nvml.create_gpu_instance(0, one_me_all, 0)
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, one_plain, 3)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES
    nvml.create_gpu_instance(0, one_no_me, 3)
    nvml.create_gpu_instance(0, two_no_me, 6)
    assert nvml.gi_remaining_capacity(0, one_plain) == 0


def test_me_all_needs_only_no_me_neighbours(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("RTX-PRO-6000")
    nvml.create_gpu_instance(0, 14, 0)  # plain 1g
    assert nvml.gi_remaining_capacity(0, 65) == 0
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, 65, 3)
    assert _code(exc) is ERR.INSUFFICIENT_RESOURCES


def test_gi_ids_go_by_size(make_sim: SimFactory) -> None:
    """Real GPUs number GIs by size: full 0, halves 1-2, quarters 3-6, eighths 7-14."""
    nvml, _, _ = make_sim("A100-40GB")
    assert nvml.create_gpu_instance(0, P_7G, 0).gi_id == 0
    nvml.destroy_gpu_instance(0, 0)
    ids = [nvml.create_gpu_instance(0, P_1G, s).gi_id for s in (3, 0, 1)]
    assert ids == [7, 8, 9]  # lowest free inside the 1g range, whatever the placement
    nvml.destroy_gpu_instance(0, 8)
    assert nvml.create_gpu_instance(0, P_1G, 2).gi_id == 8
    assert nvml.create_gpu_instance(0, P_3G, 4).gi_id == 1
    nvml.destroy_gpu_instance(0, 1)
    assert nvml.create_gpu_instance(0, P_2G, 4).gi_id == 3
    # The 1g double-memory GI holds a quarter of the memory: a quarter's id.
    assert nvml.create_gpu_instance(0, P_1G_2X, 6).gi_id == 4


def test_gi_id_ranges_cover_every_instance_of_every_model(make_sim: SimFactory) -> None:
    """Filling a GPU with its most numerous profile never runs out of ids; ranges per size hold."""
    nvml, _, _ = make_sim("A100-40GB", "A30-24GB", "RTX-PRO-6000", "H100-80GB")
    expected = {
        0: {P_1G: range(7, 15), P_2G: range(3, 7), P_3G: range(1, 3), P_4G: range(1, 3), P_7G: range(0, 1)},
        1: {14: range(3, 7), 5: range(1, 3), 0: range(0, 1)},  # A30: 1g, 2g, 4g
        2: {14: range(3, 7), 5: range(1, 3), 0: range(0, 1)},  # RTX PRO 6000: 1g, 2g, 4g
        3: {P_1G: range(7, 15), P_1G_2X: range(3, 7), P_2G: range(3, 7), P_3G: range(1, 3)},
    }
    for gpu, by_profile in expected.items():
        for profile, ids in by_profile.items():
            made = []
            for pl in nvml.gi_profile_by_id(gpu, profile).placements:
                try:
                    made.append(nvml.create_gpu_instance(gpu, profile, pl.start).gi_id)
                except NvmlError as exc:
                    assert exc.code is ERR.INSUFFICIENT_RESOURCES  # e.g. the 7-compute-slice limit
            assert made and all(i in ids for i in made), (gpu, profile, made)
            assert len(set(made)) == len(made)
            for gi_id in made:
                nvml.destroy_gpu_instance(gpu, gi_id)


def test_remaining_capacity_counts_free_placements(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    assert [nvml.gi_remaining_capacity(0, p) for p in (P_1G, P_1G_2X, P_2G, P_3G, P_4G, P_7G)] == [
        7,
        4,
        3,
        2,
        1,
        1,
    ]
    nvml.create_gpu_instance(0, P_3G, 0)
    assert nvml.gi_remaining_capacity(0, P_1G) == 3
    assert nvml.gi_remaining_capacity(0, P_3G) == 1
    assert nvml.gi_remaining_capacity(0, P_7G) == 0


def test_destroy_unknown_gi_is_not_found(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-40GB")
    with pytest.raises(NvmlError) as exc:
        nvml.destroy_gpu_instance(0, 5)
    assert _code(exc) is ERR.NOT_FOUND


def test_destroy_gi_with_ci_or_process_is_in_use(make_sim: SimFactory) -> None:
    nvml, admin, _ = make_sim("H200-141GB")
    gi = nvml.create_gpu_instance(0, P_3G, 4)
    ci = nvml.create_compute_instance(0, gi.gi_id)
    with pytest.raises(NvmlError) as exc:
        nvml.destroy_gpu_instance(0, gi.gi_id)
    assert _code(exc) is ERR.IN_USE
    admin.add_process(0, gi.gi_id, ci.ci_id, pid=4242)
    with pytest.raises(NvmlError) as exc:
        nvml.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
    assert _code(exc) is ERR.IN_USE
    admin.remove_process(0, 4242)
    nvml.destroy_compute_instance(0, gi.gi_id, ci.ci_id)
    nvml.destroy_gpu_instance(0, gi.gi_id)
    assert nvml.gpu_instances(0) == []


def test_gi_operations_need_mig_enabled(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("H100-80GB", mig_enabled=False)
    assert nvml.gi_profiles(0)  # Hopper answers profile queries with MIG off [U]
    assert nvml.gpu_instances(0) == []
    with pytest.raises(NvmlError) as exc:
        nvml.create_gpu_instance(0, P_1G, 0)
    assert _code(exc) is ERR.NOT_SUPPORTED
    with pytest.raises(NvmlError) as exc:
        nvml.gi_remaining_capacity(0, P_1G)
    assert _code(exc) is ERR.NOT_SUPPORTED


def test_ampere_with_mig_off_has_no_profiles(make_sim: SimFactory) -> None:
    nvml, _, _ = make_sim("A100-80GB", mig_enabled=False)
    assert nvml.gi_profiles(0) == []
    assert nvml.gpu(0).mig_capable
