"""The end-to-end benchmark's real-node mode, without a cluster: the pods it creates and what it reads
from /proc and the plugin's /metrics (benchmarks/e2e/workloads.py, benchmarks/e2e/realnode.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import benchmarks.e2e.__main__ as cli
from benchmarks.e2e.realnode import HOSTNAME_LABEL, cpu_with_children, prepare_totals
from benchmarks.e2e.workloads import KINDS, REAL_GRACE_S, SLEEPER, pod_for
from tests.e2e.objects import UNPULLABLE_IMAGE
from tests.e2e.realnode.images import TEST_IMAGE
from tests.e2e.realnode.node import TOLERATE_ALL


@pytest.mark.parametrize("kind", KINDS)
def test_real_pod_runs_the_test_image_on_the_node(kind: str) -> None:
    body = pod_for(kind, "p-1", {HOSTNAME_LABEL: "real-bench-abc123"}, real=True)
    spec = body["spec"]
    [container] = spec["containers"]
    assert container["image"] == TEST_IMAGE
    assert container["imagePullPolicy"] == "Never"
    assert container["command"] == SLEEPER
    assert "trap 'exit 0' TERM" in container["command"][-1]  # SIGTERM ends it at once
    assert spec["nodeSelector"] == {HOSTNAME_LABEL: "real-bench-abc123"}
    assert spec["hostNetwork"] is True
    assert spec["tolerations"] == TOLERATE_ALL
    assert spec["terminationGracePeriodSeconds"] == REAL_GRACE_S <= 2
    # What the pod asks for is the stand-in pod's.
    standin = pod_for(kind, "p-1", {HOSTNAME_LABEL: "real-bench-abc123"})["spec"]
    assert container.get("resources") == standin["containers"][0].get("resources")
    assert spec.get("resourceClaims") == standin.get("resourceClaims")


def test_real_pod_does_not_share_mutable_state() -> None:
    a = pod_for("nogpu", "a", {}, real=True)
    a["spec"]["containers"][0]["command"].append("x")
    a["spec"]["tolerations"].append({"key": "k"})
    b = pod_for("nogpu", "b", {}, real=True)
    assert b["spec"]["containers"][0]["command"] == SLEEPER
    assert b["spec"]["tolerations"] == TOLERATE_ALL


@pytest.mark.parametrize("kind", KINDS)
def test_standin_pod_is_unchanged(kind: str) -> None:
    body = pod_for(kind, "p-1", {"e2e.flexmig.dev/scenario": "abc123"})
    spec = body["spec"]
    [container] = spec["containers"]
    assert container["image"] == UNPULLABLE_IMAGE
    assert set(container) <= {"name", "image", "resources"}
    assert spec["nodeSelector"] == {"e2e.flexmig.dev/scenario": "abc123"}
    assert not {"hostNetwork", "tolerations", "terminationGracePeriodSeconds"} & set(spec)
    assert spec["automountServiceAccountToken"] is False
    if kind == "claim":
        assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "p-1"}]
    elif kind == "legacy":
        assert container["resources"] == {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}}
    else:
        assert "resources" not in container and "resourceClaims" not in spec


def test_cpu_with_children_sums_own_and_reaped_children_ticks() -> None:
    # pid (comm with spaces) state ppid ... utime=11 stime=7 cutime=5 cstime=3 (fields 14..17)
    stat = "123 (containerd shim) S 1 2 3 4 5 6 7 8 9 10 11 7 5 3 20 0 1 0 100 200 300"
    assert cpu_with_children(stat) == 11 + 7 + 5 + 3


def test_prepare_totals_sums_every_result() -> None:
    metrics = "\n".join(
        [
            "# HELP flexmig_node_prepare_duration_seconds Time to prepare one claim",
            "# TYPE flexmig_node_prepare_duration_seconds histogram",
            'flexmig_node_prepare_duration_seconds_bucket{le="0.1",result="ok"} 3.0',
            'flexmig_node_prepare_duration_seconds_count{result="ok"} 4.0',
            'flexmig_node_prepare_duration_seconds_sum{result="ok"} 0.25',
            'flexmig_node_prepare_duration_seconds_count{result="error"} 1.0',
            'flexmig_node_prepare_duration_seconds_sum{result="error"} 0.5',
            'flexmig_node_unprepare_duration_seconds_sum{result="ok"} 9.0',
            'flexmig_node_unprepare_duration_seconds_count{result="ok"} 9.0',
            'flexmig_node_prepare_duration_seconds_created{result="ok"} 1.7e+09',
        ]
    )
    assert prepare_totals(metrics) == (0.75, 5)
    assert prepare_totals("") == (0.0, 0)


def _exit_message(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    monkeypatch.setattr("sys.argv", ["benchmarks.e2e", *argv])
    with pytest.raises(SystemExit) as info:
        cli.main()  # every check fails before anything starts
    return str(info.value)


def test_real_node_bursts_fit_the_kubelet_and_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "1..109" in _exit_message(monkeypatch, "--real-node", "--gpus-per-node", "16", "--pods", "110")
    assert "1..56" in _exit_message(monkeypatch, "--real-node", "--pods", "57", "--kinds", "claim")
    msg = _exit_message(monkeypatch, "--real-node", "--pods", "10,30", "--kinds", "claim,legacy")
    assert "at most 24 legacy pods" in msg and "2g.20gb" in msg


def test_real_node_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEXMIG_NODE_BIN", str(tmp_path))  # no binaries there
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    msg = _exit_message(monkeypatch, "--real-node", "--pods", "3", "--kinds", "claim")
    assert msg.startswith("--real-node: the node binaries could not be built") and "\n" not in msg
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    msg = _exit_message(monkeypatch, "--real-node", "--pods", "3", "--kinds", "claim")
    assert msg.startswith("--real-node: needs root") and "\n" not in msg
