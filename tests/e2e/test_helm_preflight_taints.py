"""The chart's preflight check respects taints (templates/_preflight.tpl), against the real control plane.

A node whose NoSchedule/NoExecute taint flexmig's plugin does not tolerate is not one of flexmig's
nodes, whatever its labels: another GPU manager there shares nothing with flexmig. The plugin's
default tolerations (nvidia.com/gpu) and `kubeletPlugin.extraTolerations` put nodes back in. Taints
of a node's passing condition (node.kubernetes.io/not-ready, which the API server puts on every new
Node, unreachable, ...) do not count. See test_helm_preflight.py for the node-selection cases.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .cluster import ControlPlane
from .k8sobjects import model
from .test_helm_preflight import GPU, MARK, NVIDIA, _foreign, _template

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def _tainted_nodes(
    core: k8s.CoreV1Api, nodes: Mapping[str, tuple[Mapping[str, str], Sequence[Mapping[str, str]]]]
) -> Iterator[None]:
    """Node objects with these labels and taints (no kubelet), deleted afterwards."""
    try:
        for name, (labels, taints) in nodes.items():
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": dict(labels)},
                "spec": {"taints": [dict(t) for t in taints]},
            }
            core.create_node(model(k8s.V1Node, body))
        yield
    finally:
        for name in nodes:
            with contextlib.suppress(ApiException):
                core.delete_node(name)


def test_nodes_whose_taints_flexmig_does_not_tolerate_are_not_shared(control_plane: ControlPlane) -> None:
    suffix = uuid.uuid4().hex[:6]
    infra, gpu, own = f"pf-infra-{suffix}", f"pf-gpu-{suffix}", f"pf-own-{suffix}"
    other, ds_name = f"pf-nvidia-{suffix}", "nvidia-device-plugin-daemonset"
    dedicated = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    nodes = {
        infra: ({**GPU, MARK: suffix}, [dedicated]),  # flexmig's plugin does not tolerate it
        gpu: ({**GPU, MARK: suffix}, [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        own: (GPU, []),  # flexmig's alone: so the check judges per node
    }
    with (
        control_plane.api_client() as api,
        _tainted_nodes(k8s.CoreV1Api(api), nodes),
        # The other one tolerates everything, so the DaemonSet controller puts it on both marked nodes.
        _foreign(api, other, ds_name, NVIDIA, {MARK: suffix}, on_nodes={infra, gpu}),
    ):
        # nvidia.com/gpu is tolerated by default: shared there; the dedicated node is not flexmig's.
        refused = _template(control_plane)
        assert refused.returncode != 0
        assert f"daemonset {other}/{ds_name}) runs on 1 of flexmig's GPU nodes: {gpu}." in refused.stderr, (
            refused.stderr
        )
        assert infra not in refused.stderr

        # A toleration for another value of the taint's key does not tolerate it.
        elsewhere = {**dedicated, "operator": "Equal", "value": "batch"}
        refused = _template(
            control_plane, "--set-json", f"kubeletPlugin.extraTolerations=[{json.dumps(elsewhere)}]"
        )
        assert f"runs on 1 of flexmig's GPU nodes: {gpu}." in refused.stderr, refused.stderr

        # Tolerating it (here by key alone) makes that node flexmig's too.
        by_key = {"key": "dedicated", "operator": "Exists"}
        refused = _template(
            control_plane, "--set-json", f"kubeletPlugin.extraTolerations=[{json.dumps(by_key)}]"
        )
        both = ", ".join(sorted((infra, gpu)))
        assert f"runs on 2 of flexmig's GPU nodes: {both}." in refused.stderr, refused.stderr

        # Without the default tolerations flexmig's plugin would run on neither marked node.
        passed = _template(control_plane, "--set-json", "kubeletPlugin.tolerations=[]")
        assert passed.returncode == 0, passed.stderr
