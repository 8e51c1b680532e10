"""A pod's claims: containers that would get HAMi-core shares from more than one claim."""

from __future__ import annotations

from typing import Any

from api.constants import DRIVER_NAME
from controller.claims.podclaims import split_share_problem

SHARE = {"driver": DRIVER_NAME, "pool": "n", "device": "gpu-0-shared", "shareID": "s"}
MIG = {"driver": DRIVER_NAME, "pool": "n", "device": "gpu-1-mig-1g5gb-19-0"}
OTHER = {"driver": "nic.example.com", "pool": "n", "device": "gpu-0-shared"}


def pod(**containers: list[str]) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": name, "resources": {"claims": [{"name": c} for c in claims]}}
                for name, claims in containers.items()
            ]
        }
    }


def test_two_shared_claims_in_one_container_are_named() -> None:
    message = split_share_problem(pod(main=["a", "b"], side=["a"]), {"a": [SHARE], "b": [SHARE]})
    assert message is not None and "main" in message and "side" not in message


def test_one_shared_claim_per_container_is_fine() -> None:
    assert split_share_problem(pod(x=["a"], y=["b"]), {"a": [SHARE], "b": [SHARE]}) is None
    # A shared claim beside MIG or another driver's devices in one container is fine too.
    assert split_share_problem(pod(x=["a", "b", "c"]), {"a": [SHARE], "b": [MIG], "c": [OTHER]}) is None


def test_init_containers_count() -> None:
    body = pod()
    body["spec"]["initContainers"] = [
        {"name": "init", "resources": {"claims": [{"name": "a"}, {"name": "b"}]}}
    ]
    message = split_share_problem(body, {"a": [SHARE], "b": [SHARE]})
    assert message is not None and "init" in message
