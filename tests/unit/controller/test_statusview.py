"""`flexmig status` rendering on inventories built from real slice bodies, and the command's error exits."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import node_slices

from api.constants import DRIVER_NAME
from controller.state.inventory import Inventory
from controller.views.statusmodel import collect_allocations
from controller.views.statusview import CELL, UNKNOWN_POD, render
from flexmig.cli import main


def _claim(
    name: str,
    devices: list[tuple[str, str]],
    *,
    pod: str | None = None,
    owner: str | None = None,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u"}]
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER_NAME, "pool": pool, "device": dev}
                    for pool, dev in devices
                ]
            }
        }
    }
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    if data:
        pool, dev = devices[0]
        status["devices"] = [{"driver": DRIVER_NAME, "pool": pool, "device": dev, "data": data}]
    return {"metadata": meta, "status": status}


def _gpu_block(text: str, node: str, index: int) -> str:
    for block in text.split("\n\n"):
        if block.startswith(f"{node}  GPU {index} "):
            return block
    raise AssertionError(f"no block for {node} GPU {index} in:\n{text}")


def _bar(block: str) -> str:
    (line,) = [ln for ln in block.splitlines() if ln.startswith("  [")]
    return line.strip()


def _segments(bar: str) -> list[tuple[int, str]]:
    """(cells spanned, label) of every [..] segment of a bar."""
    return [((len(m) + 2) // CELL, m.strip()) for m in re.findall(r"\[([^\]]*)\]", bar)]


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return Inventory([*node_slices("node-a", "A100-40GB", 2), *node_slices("node-h", "H100-80GB", 2)])


def test_empty_gpu_is_one_free_bar_and_everything_fits(inventory: Inventory) -> None:
    text = render(inventory, collect_allocations([]))
    block = _gpu_block(text, "node-a", 0)
    assert block.splitlines()[0] == "node-a  GPU 0  A100-40GB (NVIDIA A100-SXM4-40GB)  GPU-node-a-0"
    assert _segments(_bar(block)) == [(8, "free")]
    assert "free: memory slices 0-7 (8/8); compute 0/7 slices used" in block
    assert "fragmentation: 0.00" in block
    assert "still fits: 1g.5gb x7, 2g.10gb x3, 3g.20gb x2, 7g.40gb x1" in block
    # Hopper publishes its whole GPU as well: an empty one can still be handed out whole.
    assert "still fits: 1g.10gb x7, 2g.20gb x3, 3g.40gb x2, 7g.80gb x1, whole GPU x1" in _gpu_block(
        text, "node-h", 0
    )
    assert text.endswith("4 GPUs on 2 nodes, 0 allocated devices")
    assert "\x1b[" not in text


def test_mixed_layout_names_pods_identity_free_slices_and_fits(inventory: Inventory) -> None:
    claims = [
        _claim(
            "train",
            [("node-a", "gpu-0-mig-3g20gb-9-4")],
            pod="trainer",
            data={"migUUID": "MIG-abc", "gpuInstanceID": 2, "computeInstanceID": 0},
        ),
        _claim("infer", [("node-a", "gpu-0-mig-1g5gb-19-0")], owner="server"),
        _claim("other", [("node-h", "gpu-1-mig-1g10gb-19-0")], pod="elsewhere"),
    ]
    text = render(inventory, collect_allocations(claims))
    block = _gpu_block(text, "node-a", 0)
    assert _segments(_bar(block)) == [(1, "1g.5gb"), (3, "free"), (4, "3g.20gb ns/trainer")]
    lines = block.splitlines()
    assert any(
        "0  1g.5gb" in ln and "pod ns/server" in ln and "claim ns/infer" in ln and "not prepared" in ln
        for ln in lines
    )
    assert any("4-7  3g.20gb" in ln and "pod ns/trainer" in ln and "GI 2 CI 0 MIG-abc" in ln for ln in lines)
    assert "free: memory slices 1-3 (3/8); compute 4/7 slices used" in block
    assert "still fits: 1g.5gb x3, 2g.10gb x1" in block
    # The other A100 is untouched; a Hopper with one instance cannot be handed out whole any more.
    assert "still fits: 1g.5gb x7" in _gpu_block(text, "node-a", 1)
    assert "whole GPU" not in _gpu_block(text, "node-h", 1)
    assert text.endswith("4 GPUs on 2 nodes, 3 allocated devices")


def test_fragmented_layout_reports_fragmentation(inventory: Inventory) -> None:
    # 2g@0 + 2g@4 + 1g@3: 2 compute slices and memory slices 2 and 6-7 free, but no 2g placement is.
    claims = [
        _claim("a", [("node-a", "gpu-0-mig-2g10gb-14-0")], pod="a"),
        _claim("b", [("node-a", "gpu-0-mig-2g10gb-14-4")], pod="b"),
        _claim("c", [("node-a", "gpu-0-mig-1g5gb-19-3")], pod="c"),
    ]
    block = _gpu_block(render(inventory, collect_allocations(claims)), "node-a", 0)
    assert "free: memory slices 2,6-7 (3/8); compute 5/7 slices used" in block
    assert "still fits: 1g.5gb x2" in block
    assert "fragmentation: 0.50" in block  # 1g: 2 of 2 reachable, 2g: 0 of 1


def test_whole_gpu_allocation_fills_the_bar(inventory: Inventory) -> None:
    claims = [_claim("big", [("node-h", "gpu-0")], pod="runner", data={"uuid": "GPU-node-h-0"})]
    text = render(inventory, collect_allocations(claims), node="node-h")
    block = _gpu_block(text, "node-h", 0)
    assert _segments(_bar(block)) == [(8, "whole GPU ns/runner")]
    assert any(
        "whole GPU" in ln and "pod ns/runner" in ln and "claim ns/big" in ln for ln in block.splitlines()
    )
    assert "still fits: nothing" in block
    assert "fragmentation" not in block
    assert "node-a" not in text  # --node filter
    assert text.endswith("2 GPUs on 1 node, 1 allocated device")


def test_unknown_pod_shows_the_claim_and_pods_referencing_it_are_found(inventory: Inventory) -> None:
    claims = [_claim("orphan", [("node-a", "gpu-1-mig-2g10gb-14-2")])]
    block = _gpu_block(render(inventory, collect_allocations(claims)), "node-a", 1)
    assert any(UNKNOWN_POD in ln and "claim ns/orphan" in ln for ln in block.splitlines())
    assert _segments(_bar(block)) == [(2, "free"), (2, "2g.10gb"), (4, "free")]  # too narrow for the claim

    pod = {
        "metadata": {"name": "user", "namespace": "ns"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "orphan"}]},
    }
    block = _gpu_block(render(inventory, collect_allocations(claims, [pod])), "node-a", 1)
    assert "pod ns/user" in block and UNKNOWN_POD not in block


def test_conflicts_and_devices_nobody_publishes_are_warned_about(inventory: Inventory) -> None:
    claims = [
        _claim("one", [("node-a", "gpu-0-mig-3g20gb-9-0")], pod="p1"),
        _claim("two", [("node-a", "gpu-0-mig-3g20gb-9-0")], pod="p2"),
        _claim("overlap", [("node-a", "gpu-0-mig-2g10gb-14-2")], pod="p3"),
        _claim("gone", [("node-z", "gpu-0")], pod="p4"),
        {"metadata": {"name": "pending", "namespace": "ns"}, "spec": {}},
    ]
    text = render(inventory, collect_allocations(claims))
    assert "warning: node-a/gpu-0-mig-3g20gb-9-0 is allocated to both ns/one and ns/two" in text
    assert "claim ns/gone holds node-z/gpu-0, which no GPU publishes" in text
    block = _gpu_block(text, "node-a", 0)
    assert "warning: gpu-0-mig-2g10gb-14-2 (ns/overlap)" in block
    assert "pod ns/p1" in block and "pod ns/p2" not in block


def test_incomplete_pool_is_named(inventory: Inventory) -> None:
    slices = node_slices("node-i", "A100-40GB", 1)
    text = render(Inventory(slices[:1]), collect_allocations([]))
    assert "pool node-i: incomplete" in text
    assert text.endswith("no flexmig GPU published")


def test_colour_only_when_asked(inventory: Inventory) -> None:
    claims = [_claim("train", [("node-a", "gpu-0-mig-3g20gb-9-4")], pod="trainer")]
    coloured = render(inventory, collect_allocations(claims), color=True, node="node-a")
    assert "\x1b[" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == render(
        inventory, collect_allocations(claims), node="node-a"
    )


# --- the command's error exits -------------------------------------------------------------------------


def test_missing_kubeconfig_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["status", "--kubeconfig", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"flexmig status: kubeconfig {missing} does not exist"]


def test_bad_kubeconfig_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    assert main(["status", "--kubeconfig", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"flexmig status: cannot load kubeconfig {bad}:")


def test_unreachable_api_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the command runs: connection refused
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    assert main(["status", "--kubeconfig", str(config), "--timeout", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"flexmig status: cannot reach the API server at http://127.0.0.1:{port}:")


def test_shared_gpus_show_each_share_and_what_is_left() -> None:
    from shared_helpers import shared_slice

    inv = Inventory([shared_slice("h", [16000, 16000], split=4)])

    def share(name: str, memory: str | None, cores: str = "0") -> dict[str, Any]:
        result: dict[str, Any] = {
            "request": "gpus",
            "driver": DRIVER_NAME,
            "pool": "h",
            "device": "gpu-0-shared",
            "shareID": f"{name}-0000-4000-8000-000000000000",
        }
        if memory is not None:
            result["consumedCapacity"] = {"memory": memory, "cores": cores, "shares": "1"}
        return _claim(name, [], owner=f"pod-{name}") | {
            "status": {"allocation": {"devices": {"results": [result]}}}
        }

    allocations = collect_allocations([share("a", "4000Mi", "30"), share("b", "2000Mi")])
    assert not allocations.conflicts and not allocations.holders
    text = render(inv, allocations)
    assert "h  GPU 0  A100-40GB  shared (hami-core)" in text
    assert "4000Mi  cores 30%" in text and "pod ns/pod-a" in text and "claim ns/b" in text
    assert "free: 10000/16000 MiB, cores 70/100, split slots 2/4" in text
    assert "free: 16000/16000 MiB, cores 100/100, split slots 4/4" in text  # gpu 1
    assert text.endswith("2 GPUs on 1 node, 2 allocated devices")
    defaults = render(inv, collect_allocations([share("c", None)]))
    assert "16000Mi  cores -" in defaults and "(defaults)" in defaults and "still fits: nothing" in defaults
