"""Per-inventory caches of the shared-GPU path: cached refusals name their own claim, the ledger's
shared states follow claims as they come and go, and a device publishing an impossible request-policy
default is skipped (with a warning) instead of failing the ledger."""

from __future__ import annotations

from typing import Any

from shared_helpers import CLASSES, claim, commit, decider, hami_body, shared_slice

from controller.allocation.decide import ControllerReason, Decider
from controller.claims.candidates import CandidateIndex
from controller.claims.cel import CelEnvironment
from controller.state.inventory import Inventory
from controller.state.ledger import Ledger, ShareUse
from driver.policy.allocator import PackingPolicy
from driver.policy.model import GpuRef
from driver.policy.shared import ShareAmount


def test_cached_refusal_names_each_claim() -> None:
    d = decider({"n": [16000, 16000]})
    # Same shape, both too large for every GPU: the second answer comes from the per-inventory cache.
    alpha = d.decide([claim("alpha", exactly=hami_body(memory=20000))], CLASSES)
    beta = d.decide([claim("beta", exactly=hami_body(memory=20000))], CLASSES)
    assert alpha.reason == beta.reason == ControllerReason.NO_MATCHING_DEVICE
    assert alpha.message.startswith("claim ns/alpha spec.devices.requests[gpus].capacity.requests.memory")
    assert beta.message.startswith("claim ns/beta spec.devices.requests[gpus].capacity.requests.memory")
    assert "ns/alpha" not in beta.message
    assert "exceeds the 16000Mi of gpu-" in beta.message


def test_shared_states_follow_claims() -> None:
    d = decider({"n": [16000, 8000]})
    states = d.ledger.shared_states()
    assert states[GpuRef("n", 0)].used == ShareAmount(0, 0, 0)
    decision = d.decide([claim("a", exactly=hami_body(memory=6000, cores=30))], CLASSES)
    commit(d, decision)
    (alloc,) = decision.allocations
    ref = alloc.devices[0].gpu
    assert ref is not None
    assert d.ledger.shared_states()[ref].used == ShareAmount(6000, 30, 1)
    assert d.ledger.shared_states()[ref].capacity == d.ledger.inventory.shared[ref].total()
    d.ledger.forget(alloc.uid)
    assert d.ledger.shared_states()[ref].used == ShareAmount(0, 0, 0)


def _bad_default_slice() -> dict[str, Any]:
    body = shared_slice("n", [16000, 16000])
    # gpu-1-shared publishes a memory default above its capacity (a broken publisher).
    body["spec"]["devices"][1]["capacity"]["memory"]["requestPolicy"]["default"] = "20000Mi"
    return body


def test_impossible_default_skips_the_device() -> None:
    inventory = Inventory([_bad_default_slice()])
    ledger = Ledger(inventory)
    pool = inventory.shared[GpuRef("n", 1)].pool
    # Results without consumedCapacity count at the published defaults: gpu-1's cannot be computed.
    ledger.observe("u1", [ShareUse(pool, "gpu-1-shared", "s1", None, None, None)])
    ledger.observe("u2", [ShareUse(pool, "gpu-0-shared", "s2", None, None, None)])
    states = ledger.shared_states()
    assert GpuRef("n", 1) not in states
    assert states[GpuRef("n", 0)].used == ShareAmount(16000, 0, 1)
    ledger.forget("u1")  # forgetting a share of the skipped device is harmless
    # Amounts that are all known need no default, so they count even on a device whose default is bad.
    other = Ledger(inventory)
    other.observe("u3", [ShareUse(pool, "gpu-1-shared", "s3", 1000, 10, 1)])
    assert other.shared_states()[GpuRef("n", 1)].used == ShareAmount(1000, 10, 1)


def test_skipped_device_is_not_placed_on() -> None:
    inventory = Inventory([_bad_default_slice()])
    d = Decider(Ledger(inventory), CandidateIndex(inventory, CelEnvironment()), PackingPolicy())
    pool = inventory.shared[GpuRef("n", 0)].pool
    d.ledger.observe("u1", [ShareUse(pool, "gpu-1-shared", "s1", None, None, None)])
    for i in range(3):  # gpu-0 only (16000 MiB): two 6000 MiB shares fit, the third does not
        decision = d.decide([claim(f"c{i}", exactly=hami_body(memory=6000))], CLASSES)
        if i < 2:
            assert [dev.name for dev in decision.allocations[0].devices] == ["gpu-0-shared"]
            commit(d, decision)
        else:
            assert not decision.ok
