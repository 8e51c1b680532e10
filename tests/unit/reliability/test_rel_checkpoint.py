"""A checkpoint the node agent cannot trust (garbage, truncated by a full disk, edited by hand, from a
newer plugin): the agent refuses to start with one error line naming the file and what is wrong, before
it talks to the API server or kubelet, and touches nothing: the checkpoint keeps its bytes, the GPU
instances it describes stay, no socket or CDI directory appears. Rows K12-K15 of docs/reliability.md."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from sim_node import make_node

from api.constants import DRIVER_NAME
from driver.nvml.sim import SimAdmin, SimGpuSpec
from kubeletplugin.agent.main import NodeAgent
from kubeletplugin.checkpoint.model import CHECKPOINT_VERSION_IDLE
from kubeletplugin.grpcserver import ClaimRef
from kubeletplugin.kube.kubeapi import AllocatedDevice, ClaimView, PodRef
from kubeletplugin.settings.config import add_flags, load_config

NODE = "n1"
UID = "7d0c5a1e-0000-4c9e-8a59-0000000000c1"


def _prepared_node(tmp: Path) -> tuple[Path, Path]:
    """A node with one prepared claim (a GI on GPU 0 and its checkpoint entry); (sim state, checkpoint)."""
    n = make_node(tmp, NODE, [SimGpuSpec("A100-40GB")])
    try:
        dev = AllocatedDevice("gpu", DRIVER_NAME, NODE, "gpu-0-mig-1g5gb-19-3")
        n.api.claims[("ns", "c")] = ClaimView("ns", "c", UID, (dev,), (PodRef("ns", "p", "pod-uid"),))
        assert n.preparer.prepare([ClaimRef(namespace="ns", uid=UID, name="c")])[UID].error == ""
    finally:
        n.preparer.close()
    return tmp / "sim.json", tmp / "state" / "checkpoint.json"


def _truncate(text: str) -> str:
    return text[: len(text) // 2]


def _edit_gi_id(text: str) -> str:
    doc = json.loads(text)
    doc["claims"][UID]["devices"][0]["giID"] += 1  # the checksum no longer matches
    return json.dumps(doc)


def _newer(text: str) -> str:
    doc = json.loads(text)
    doc["version"] = CHECKPOINT_VERSION_IDLE + 1  # written by a plugin newer than any this one reads
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("damage", "cause"),
    [
        (lambda _t: "\x00\x17garbage", "not valid JSON"),
        (_truncate, "not valid JSON"),
        (_edit_gi_id, "checksum mismatch"),
        (_newer, f"unknown checkpoint version {CHECKPOINT_VERSION_IDLE + 1}"),
    ],
    ids=["k12-garbage", "k13-truncated", "k14-edited", "k15-newer-version"],
)
def test_an_untrusted_checkpoint_stops_the_agent_before_it_touches_anything(
    tmp_path: Path, damage: Callable[[str], str], cause: str
) -> None:
    sim, checkpoint = _prepared_node(tmp_path)
    checkpoint.write_text(damage(checkpoint.read_text()))
    damaged = checkpoint.read_bytes()
    gpus_before = SimAdmin(sim).snapshot()
    assert len(gpus_before.gpus[0].gpu_instances) == 1
    (tmp_path / "boot_id").write_text("boot-1\n")
    parser = argparse.ArgumentParser()
    add_flags(parser)
    flags = {
        "node-name": NODE,
        "boot-id-path": str(tmp_path / "boot_id"),
        "nvml": f"sim:{sim}",
        "registry-dir": str(tmp_path / "registry"),
        "plugins-dir": str(tmp_path / "plugins"),
        "cdi-dir": str(tmp_path / "agent-cdi"),
        "checkpoint-path": str(checkpoint),
        "metrics-port": "-1",
        "operating-mode": "mig",
        # No API server exists: reaching the client would fail differently than asserted below.
        "kubeconfig": str(tmp_path / "boot_id"),
    }
    cfg = load_config(parser.parse_args([x for k, v in flags.items() for x in (f"--{k}", v)]), env={})
    with structlog.testing.capture_logs() as logs:
        assert NodeAgent(cfg).run() == 1
    (error,) = [e for e in logs if e["log_level"] == "error"]
    assert (
        error["event"] == "cannot use the checkpoint; refusing to start rather than lose track of instances"
    )
    assert str(checkpoint) in error["error"] and cause in error["error"]
    assert checkpoint.read_bytes() == damaged
    assert SimAdmin(sim).snapshot().gpus == gpus_before.gpus  # the claim's GI is still there
    for made in ("registry", "plugins", "agent-cdi"):
        assert not (tmp_path / made).exists(), made
