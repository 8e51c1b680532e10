"""controller/runtime/metrics.py `InstanceRows`: the per-instance rows of the snapshot, rebuilt only for
the claims that changed since the last step."""

from __future__ import annotations

from typing import Any

import pytest

import controller.runtime.metrics as metrics
from api.constants import DRIVER_NAME
from controller.runtime.metrics import InstanceRows, instance_rows


def claim(name: str, version: str, gi: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
        "status": {
            "devices": [
                {
                    "driver": DRIVER_NAME,
                    "pool": "pool-a",
                    "device": "gpu-0-mig-1g5gb-19-0",
                    "data": {"migUUID": f"MIG-{name}", "parentUUID": "GPU-1", "gpuInstanceID": gi},
                }
            ]
        },
    }


def test_rows_equal_a_full_rebuild_and_only_changed_claims_are_rebuilt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    real = metrics.instance_rows

    def counting(claims: Any, pools: Any) -> list[tuple[str, ...]]:
        claims = list(claims)
        built.extend(c["metadata"]["name"] for c in claims)
        return real(claims, pools)

    monkeypatch.setattr(metrics, "instance_rows", counting)
    cache = InstanceRows()
    pools = {"pool-a": "node-a"}
    claims = {f"ns/c{i}": claim(f"c{i}", "1", i) for i in range(3)}
    assert cache.rows(claims, pools) == tuple(real(claims.values(), pools))
    assert built == ["c0", "c1", "c2"]
    built.clear()
    claims["ns/c1"] = claim("c1", "2", 7)  # the node wrote new instance data
    del claims["ns/c2"]
    rows = cache.rows(claims, pools)
    assert built == ["c1"] and rows == tuple(real(claims.values(), pools))
    assert [r[5] for r in rows] == ["0", "7"]
    built.clear()
    assert cache.rows(claims, {"pool-a": "node-b"})[0][0] == "node-b"  # the pool's node changed
    assert built == ["c0", "c1"]


def test_a_claim_without_a_version_is_always_rebuilt() -> None:
    cache = InstanceRows()
    c = claim("c0", "", 1)
    assert cache.rows({"ns/c0": c}, {}) == tuple(instance_rows([c], {}))
    c["status"]["devices"][0]["data"]["gpuInstanceID"] = 9
    assert cache.rows({"ns/c0": c}, {})[0][5] == "9"
