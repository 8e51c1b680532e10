"""Shares of HAMi-core GPUs: inventory, requests, placement, ledger, results and the mixed-pool rule."""

from __future__ import annotations

import uuid

from shared_helpers import (
    CLASSES,
    HAMI,
    any_claim,
    claim,
    commit,
    decider,
    hami_body,
    mig_body,
    percent_config,
    used,
)

from controller.allocation.decide import ControllerReason
from controller.state.inventory import Inventory
from controller.state.ledger import ShareUse, claim_holdings
from driver.catalog.simulated import simulated_catalog
from driver.policy.model import GpuRef, ShortReason


def _result(decision: object) -> dict[str, object]:
    (alloc,) = decision.allocations  # type: ignore[attr-defined]
    (result,) = alloc.results
    return dict(result)


def test_inventory_reads_shared_devices_of_the_plugin_builder() -> None:
    from kubeletplugin.shared.device import shared_gpu_device

    catalog = simulated_catalog("A100-40GB")
    dev = shared_gpu_device(catalog, 7, {"index": {"int": 0}})
    inv = Inventory(
        [{"spec": {"driver": "gpu.flexmig.dev", "nodeName": "n", "pool": {"name": "n"}, "devices": [dev]}}]
    )
    info = inv.shared[GpuRef("n", 0)]
    assert info.device == "gpu-0-shared" and info.split_count == 7
    total = info.total()
    assert (total.memory_mib, total.cores, total.shares) == (catalog.gpu.memory_total_mib, 100, 7)
    assert not inv.gpus  # no MIG catalog for a shared GPU


def test_results_carry_share_id_and_consumed_capacity_and_round_trip_through_the_ledger() -> None:
    d = decider({"n": [16000]})
    decision = d.decide([claim("c", hami_body(memory=4000, cores=30))], CLASSES)
    assert decision.ok and decision.node == "n"
    result = _result(decision)
    assert result["device"] == "gpu-0-shared" and result["pool"] == "n" and result["request"] == "gpus"
    assert uuid.UUID(str(result["shareID"])).version == 4
    assert result["consumedCapacity"] == {"memory": "4000Mi", "cores": "30", "shares": "1"}
    alloc = decision.allocations[0]
    written = {"metadata": {"uid": alloc.uid}, "status": {"allocation": {"devices": {"results": [result]}}}}
    assert claim_holdings(written) == alloc.keys  # what the API echoes back is what was assumed
    commit(d, decision)
    assert used(d, "n", 0) == (4000, 30, 1)
    d.ledger.forget(alloc.uid)
    assert used(d, "n", 0) == (0, 0, 0)


def test_shares_sum_to_capacity_and_never_beyond() -> None:
    d = decider({"n": [16000]})
    for i in range(4):
        commit(d, d.decide([claim(f"c{i}", hami_body(memory=4000))], CLASSES))
    assert used(d, "n", 0) == (16000, 0, 4)
    full = d.decide([claim("more", hami_body(memory=1))], CLASSES)
    assert full.reason == ShortReason.NO_FREE_PLACEMENT and "memory" in full.message


def test_cores_are_capped_at_100_per_gpu() -> None:
    d = decider({"n": [16000, 16000]})
    commit(d, d.decide([claim("a", hami_body(memory=1000, cores=60))], CLASSES))
    second = d.decide([claim("b", hami_body(memory=1000, cores=60))], CLASSES)
    assert second.ok
    gpus = {r["device"] for r in second.allocations[0].results}
    commit(d, second)
    assert gpus == {"gpu-1-shared"}  # 60 + 60 would exceed the first GPU's 100 cores
    third = d.decide([claim("c", hami_body(memory=1000, cores=50))], CLASSES)
    assert third.reason == ShortReason.NO_FREE_PLACEMENT and "cores" in third.message


def test_split_count_limits_the_number_of_shares() -> None:
    d = decider({"n": [16000]}, split=3)
    for i in range(3):
        commit(d, d.decide([claim(f"c{i}", hami_body(memory=100))], CLASSES))
    refused = d.decide([claim("c3", hami_body(memory=100))], CLASSES)
    assert refused.reason == ShortReason.NO_FREE_PLACEMENT and "split slots" in refused.message


def test_best_fit_fills_the_fuller_gpu_first() -> None:
    d = decider({"n": [16000, 16000, 16000]})
    commit(d, d.decide([claim("a", hami_body(memory=10000))], CLASSES))  # gpu-0: 6000 left
    commit(d, d.decide([claim("b", hami_body(memory=4000))], CLASSES))
    assert used(d, "n", 0) == (14000, 0, 2)  # tighter fit than an empty GPU
    big = d.decide([claim("c", hami_body(memory=12000))], CLASSES)
    assert _result(big)["device"] in ("gpu-1-shared", "gpu-2-shared")


def test_count_with_distinct_uuid_puts_shares_on_different_gpus() -> None:
    d = decider({"n": [16000, 16000], "m": [16000, 16000, 16000]})
    distinct = [{"requests": ["gpus"], "distinctAttribute": "gpu.flexmig.dev/uuid"}]
    decision = d.decide([claim("c", hami_body(memory=1000, count=2), constraints=distinct)], CLASSES)
    assert decision.ok
    devices = [r["device"] for r in decision.allocations[0].results]
    assert len(set(devices)) == 2 and len({r["shareID"] for r in decision.allocations[0].results}) == 2
    three = d.decide([claim("t", hami_body(memory=1000, count=3), constraints=distinct)], CLASSES)
    assert three.ok and three.node == "m"  # only m has three GPUs
    four = d.decide([claim("f", hami_body(memory=1000, count=4), constraints=distinct)], CLASSES)
    assert four.reason == ShortReason.NO_SINGLE_NODE


def test_percent_config_consumes_a_share_of_each_gpus_memory() -> None:
    d = decider({"n": [16000]})
    c = claim("c", hami_body(cores=20), config=[percent_config(25)])
    decision = d.decide([c], CLASSES)
    assert _result(decision)["consumedCapacity"] == {"memory": "4000Mi", "cores": "20", "shares": "1"}
    # The config travels with the allocation (FromClaim) for the node to see.
    assert decision.allocations[0].config[0]["source"] == "FromClaim"


def test_percent_config_is_decoded_strictly() -> None:
    d = decider({"n": [16000]})
    for cfg, field in (
        (percent_config(25, extra="x"), "extra"),
        (percent_config(0), "memoryPercentage"),
        (percent_config("50"), "memoryPercentage"),
        (percent_config(True), "memoryPercentage"),
        (percent_config(25, apiVersion="gpu.flexmig.dev/v2"), "apiVersion"),
    ):
        decision = d.decide([claim("c", hami_body(cores=0), config=[cfg])], CLASSES)
        assert decision.reason == ControllerReason.INVALID_REQUEST, cfg
        assert field in decision.message, decision.message
        assert "allowed" in decision.message or "1..100" in decision.message
    both = d.decide([claim("c", hami_body(memory=100), config=[percent_config(10)])], CLASSES)
    assert both.reason == ControllerReason.INVALID_REQUEST and "memoryPercentage" in both.message


def test_bad_capacity_inputs_name_the_field_and_the_allowed_values() -> None:
    d = decider({"n": [16000]})
    cases = [
        (
            hami_body(extra={"gpus": "1"}),
            "capacity.requests: unknown capacity 'gpus'; allowed: memory, cores, shares",
        ),
        (hami_body(cores=150), "capacity.requests.cores: 150 is not allowed"),
        (hami_body(extra={"shares": "2"}), "allowed: one of 1"),
        (hami_body(extra={"memory": "lots"}), "capacity.requests.memory"),
        (hami_body(extra={"cores": "-5"}), "must not be negative"),
    ]
    for body, expected in cases:
        decision = d.decide([claim("c", body)], CLASSES)
        assert decision.reason == ControllerReason.INVALID_REQUEST, body
        assert expected in decision.message, decision.message
    assert "allowed: 0..100 in steps of 1" in d.decide([claim("c", hami_body(cores=150))], CLASSES).message
    too_big = d.decide([claim("c", hami_body(memory=20000))], CLASSES)
    assert too_big.reason == ControllerReason.NO_MATCHING_DEVICE and "exceeds" in too_big.message
    on_mig = decider({}, mig={"m": ("A100-40GB", 1)})
    body = mig_body(4000) | {"capacity": {"requests": {"memory": "4000Mi"}}}
    # Capacity on a dedicated MIG device is a filter, as upstream (test_ctl_upstream_fields).
    filtered = on_mig.decide([claim("c", body)], CLASSES)
    assert filtered.ok and "consumedCapacity" not in _result(filtered)


def test_requests_round_up_to_the_published_step() -> None:
    d = decider({"n": [16000]})
    decision = d.decide([claim("c", hami_body(extra={"memory": "1000M"}))], CLASSES)  # 953.67Mi
    assert _result(decision)["consumedCapacity"]["memory"] == "954Mi"  # type: ignore[index]
    plain = d.decide([claim("p", {"deviceClassName": HAMI})], CLASSES)  # the policy defaults
    assert _result(plain)["consumedCapacity"] == {"memory": "16000Mi", "cores": "0", "shares": "1"}


def test_allocations_by_another_allocator_are_counted() -> None:
    d = decider({"n": [16000, 16000]})
    foreign = {
        "metadata": {"uid": "other"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": "gpu.flexmig.dev",
                            "pool": "n",
                            "device": "gpu-0-shared",
                            "shareID": "a7c1e5b0-0000-4000-8000-000000000001",
                            "consumedCapacity": {"memory": "12000Mi", "cores": "50", "shares": "1"},
                        },
                        # kube-scheduler fills consumedCapacity; without it the policy defaults count.
                        {"request": "r", "driver": "gpu.flexmig.dev", "pool": "n", "device": "gpu-1-shared"},
                    ]
                }
            }
        },
    }
    holdings = claim_holdings(foreign)
    assert all(isinstance(h, ShareUse) for h in holdings)
    d.ledger.observe("other", holdings)
    assert used(d, "n", 0) == (12000, 50, 1) and used(d, "n", 1) == (16000, 0, 1)
    decision = d.decide([claim("c", hami_body(memory=8000))], CLASSES)
    assert decision.reason == ShortReason.NO_FREE_PLACEMENT
    fits = d.decide([claim("c", hami_body(memory=4000, cores=50))], CLASSES)
    assert _result(fits)["device"] == "gpu-0-shared"
    d.ledger.observe("other", [])
    assert used(d, "n", 0) == (0, 0, 0)


def test_claims_of_one_pod_share_one_node() -> None:
    d = decider({"a": [16000], "b": [16000]})
    commit(d, d.decide([claim("x", hami_body(memory=10000))], CLASSES))  # on a or b
    decision = d.decide([claim("p", hami_body(memory=8000)), claim("q", hami_body(memory=8000))], CLASSES)
    assert decision.ok
    assert len({r["pool"] for a in decision.allocations for r in a.results}) == 1
    commit(d, decision)
    stuck = d.decide([claim("r", hami_body(memory=5000)), claim("s", hami_body(memory=5000))], CLASSES)
    assert stuck.reason == ShortReason.NO_SINGLE_NODE


def test_mixed_pool_prefers_the_exact_share_over_a_bigger_mig_device() -> None:
    d = decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)})
    decision = d.decide([any_claim("c", 4000, hami_body(memory=4000))], CLASSES)
    # 1g.5gb would strand 864 MiB; the share strands nothing.
    assert decision.ok and decision.node == "h" and _result(decision)["request"] == "gpus/hami-core"


def test_mixed_pool_ties_go_to_mig() -> None:
    d = decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)})
    decision = d.decide([any_claim("c", 4864, hami_body(memory=4864))], CLASSES)
    assert decision.ok and _result(decision)["request"] == "gpus/mig" and decision.node == "m"


def test_mixed_pool_counts_memory_a_last_split_slot_strands() -> None:
    d = decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)}, split=2)
    commit(d, d.decide([claim("x", hami_body(memory=4000))], CLASSES))
    # The share would take the last slot, stranding 32960 MiB; 1g.5gb strands 864 MiB.
    decision = d.decide([any_claim("c", 4000, hami_body(memory=4000))], CLASSES)
    assert _result(decision)["request"] == "gpus/mig"


def test_mixed_pool_percent_and_distinct_across_gpus() -> None:
    d = decider({"h": [40960, 40960]}, mig={"m": ("A100-40GB", 1)})
    hami = hami_body(cores=0, count=2)
    c = any_claim("c", 4000, hami, distinct=True)
    c["spec"]["devices"]["config"] = [percent_config(10, request="gpus/hami-core")]
    decision = d.decide([c], CLASSES)
    results = decision.allocations[0].results
    # 10% of 40960 = 4096 MiB; two 1g.5gb would strand 2 x 768 MiB.
    assert {r["request"] for r in results} == {"gpus/hami-core"}
    assert {r["device"] for r in results} == {"gpu-0-shared", "gpu-1-shared"}
    assert all(r["consumedCapacity"]["memory"] == "4096Mi" for r in results)


def test_mixed_pool_falls_back_to_whatever_fits() -> None:
    d = decider({"h": [16000]}, mig={"m": ("A100-40GB", 1)})
    commit(d, d.decide([claim("x", hami_body(memory=16000))], CLASSES))
    decision = d.decide([any_claim("c", 4000, hami_body(memory=4000))], CLASSES)
    assert _result(decision)["request"] == "gpus/mig"


def test_other_first_available_requests_keep_kep_order() -> None:
    d = decider({"h": [40960]}, mig={"m": ("A100-40GB", 1)})
    subs = [{"name": "big", **hami_body(memory=20000)}, {"name": "small", **hami_body(memory=1000)}]
    decision = d.decide([claim("c", first_available=subs)], CLASSES)
    assert _result(decision)["request"] == "gpus/big"  # the first that fits, not the tighter one
    only_hami = decider({"h": [40960]})
    mixed = only_hami.decide([any_claim("c", 4864, hami_body(memory=4864))], CLASSES)
    assert _result(mixed)["request"] == "gpus/hami-core"  # no MIG device published: falls through


def test_mixed_pool_failure_names_every_alternative() -> None:
    d = decider({"h": [16000]}, mig={"m": ("A100-40GB", 1)})
    decision = d.decide([any_claim("c", 50000, hami_body(memory=50000))], CLASSES)
    assert not decision.ok
    assert "gpus/mig" in decision.message and "exceeds the 16000Mi of gpu-0-shared" in decision.message


def test_a_pod_mixing_mig_and_shares_needs_one_node_with_both() -> None:
    d = decider({"h": [16000]}, mig={"m": ("A100-40GB", 1)})
    decision = d.decide([claim("a", mig_body(4000)), claim("b", hami_body(memory=1000))], CLASSES)
    assert decision.reason == ShortReason.NO_SINGLE_NODE and "no single node takes both" in decision.message


def test_a_node_with_both_kinds_takes_a_pod_mixing_them() -> None:
    from ctl_helpers import node_slices
    from shared_helpers import shared_slice

    from controller.allocation.decide import Decider
    from controller.claims.candidates import CandidateIndex
    from controller.claims.cel import CelEnvironment
    from controller.state.ledger import Ledger
    from driver.policy.allocator import PackingPolicy

    both = shared_slice("n", [16000])
    both["spec"]["pool"]["name"] = "n-shared"  # a second pool of the same node
    slices = [
        both,
        shared_slice("h", [16000]),
        *node_slices("n", "A100-40GB", 1),
        *node_slices("m", "A100-40GB", 1),
    ]
    inv = Inventory(slices)
    d = Decider(Ledger(inv), CandidateIndex(inv, CelEnvironment()), PackingPolicy())
    decision = d.decide([claim("a", mig_body(4000)), claim("b", hami_body(memory=1000))], CLASSES)
    assert decision.ok and decision.node == "n"
    assert {r["pool"] for a in decision.allocations for r in a.results} == {"n", "n-shared"}


def test_canonical_quantities_from_the_api_server_match_what_was_assumed() -> None:
    d = decider({"n": [16384]})
    decision = d.decide([claim("c", hami_body(memory=4096))], CLASSES)
    alloc = decision.allocations[0]
    result = dict(alloc.results[0])
    result["consumedCapacity"] = {"memory": "4Gi", "cores": "0", "shares": "1"}  # as the API returns it
    written = {"metadata": {"uid": alloc.uid}, "status": {"allocation": {"devices": {"results": [result]}}}}
    assert claim_holdings(written) == alloc.keys


def test_every_shim_template_shape_is_allocated() -> None:
    """Contract C3 as the webhook writes it (controller/shim/templates.py), end to end through decide."""
    from controller.shim.legacy import Mode, Shape
    from controller.shim.templates import template_for

    for mode in Mode:
        for mib, pct in ((4000, None), (None, 25)):
            for count in (1, 2):
                d = decider({"h": [40960, 40960]}, mig={"m": ("A100-40GB", 2)})
                generated = template_for("ns", Shape(count, mib, pct, 30, mode)).body["spec"]
                meta = {"name": "c", "namespace": "ns", "uid": "u", **generated["metadata"]}
                c = {"metadata": meta, "spec": generated["spec"]}
                decision = d.decide([c], CLASSES)
                assert decision.ok, (mode, mib, pct, count, decision.message)
                results = decision.allocations[0].results
                assert len(results) == count
                if mode is Mode.MIG:
                    assert decision.node == "m" and all("-mig-3g20gb-" in r["device"] for r in results)
                    continue
                # hami-core, and any (a 3g.20gb, the smallest with 30% of the SMs, strands far more).
                assert decision.node == "h" and len({r["device"] for r in results}) == count
                want = "4000Mi" if mib else "10240Mi"
                assert all(
                    r["consumedCapacity"] == {"memory": want, "cores": "30", "shares": "1"} for r in results
                )
                assert {r["request"] for r in results} == {
                    "gpus" if mode is Mode.HAMI_CORE else "gpus/hami-core"
                }
