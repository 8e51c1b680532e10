"""Events on this node's Node object: what an admin sees in `kubectl describe node`.

Used for facts about what the node offers that a pod's author would otherwise only find in the plugin's
log, e.g. that HAMi-core shares are withheld or unenforced because the library is missing. An event is
best effort: a failed write is logged and never stops the plugin.
"""

from __future__ import annotations

import datetime
import enum
import uuid
from typing import Any

import structlog
from kubernetes import client as k8s

from api.constants import DRIVER_NAME
from kubeletplugin.agent.metrics import NodeMetrics
from kubeletplugin.publish.slices import NodeSlices
from kubeletplugin.settings.config import PluginConfig
from kubeletplugin.shared.device import ShareEnforcement

log = structlog.get_logger(__name__)

# Events about cluster-scoped objects (Nodes) live in the default namespace, as kubelet's own do.
EVENT_NAMESPACE = "default"
COMPONENT = f"{DRIVER_NAME}/kubelet-plugin"


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


def node_event_body(
    node_name: str, node_uid: str | None, reason: str, message: str, event_type: EventType
) -> dict[str, object]:
    """A core/v1 Event about the Node (camelCase dict, as the API server takes it)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, str] = {"apiVersion": "v1", "kind": "Node", "name": node_name}
    if node_uid:
        involved["uid"] = node_uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node_name}.{uuid.uuid4().hex[:16]}", "namespace": EVENT_NAMESPACE},
        "involvedObject": involved,
        "reason": reason,
        # The API server caps an event message at 1 KiB.
        "message": message[:1024],
        "type": event_type.value,
        "source": {"component": COMPONENT, "host": node_name},
        "reportingComponent": COMPONENT,
        "reportingInstance": node_name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_node_event(
    api_client: k8s.ApiClient,
    node_name: str,
    node_uid: str | None,
    reason: str,
    message: str,
    event_type: EventType = EventType.WARNING,
) -> bool:
    """Create the event; False (logged) when the API refused it."""
    # The client sends a dict unchanged; its stubs only name the model class.
    body: Any = node_event_body(node_name, node_uid, reason, message, event_type)
    try:
        k8s.CoreV1Api(api_client).create_namespaced_event(EVENT_NAMESPACE, body)
    except Exception as exc:  # an event is informative only
        log.warning("cannot post a Node event", node=node_name, reason=reason, error=str(exc))
        return False
    log.info("posted a Node event", node=node_name, reason=reason, type=event_type.value)
    return True


SHARES_REFUSED_EVENT = "HamiCoreSharesRefused"
SHARES_UNENFORCED_EVENT = "HamiCoreSharesUnenforced"


def share_states(published: NodeSlices) -> dict[ShareEnforcement, list[int]]:
    """GPU indexes of this node's hami-core GPUs by what their share publishes."""
    out: dict[ShareEnforcement, list[int]] = {s: [] for s in ShareEnforcement}
    for g in published.gpus:
        if g.shares is not None:
            out[g.shares].append(g.gpu_index)
    return out


def report_shares(
    api_client: k8s.ApiClient,
    cfg: PluginConfig,
    node_uid: str | None,
    published: NodeSlices,
    metrics: NodeMetrics,
) -> None:
    """Set `flexmig_node_hami_core_gpus{state}` and, when shares are withheld or unenforced because the
    HAMi-core library is missing, say so on the Node (a Warning event naming the GPUs and the fix)."""
    states = share_states(published)
    for state, gpus in states.items():
        metrics.hami_core_gpus.labels(state=state.value).set(len(gpus))
    library = str(cfg.hami_core_library)
    if states[ShareEnforcement.REFUSED]:
        post_node_event(
            api_client,
            cfg.node_name,
            node_uid,
            SHARES_REFUSED_EVENT,
            f"GPU(s) {states[ShareEnforcement.REFUSED]} are in hami-core mode but the HAMi-core library"
            f" {library} is missing, so no share of them is offered (its limits could not be enforced)."
            " Install libvgpu.so there and restart the plugin, or set --unenforced-shares=publish"
            " (chart: kubeletPlugin.hamiCore.unenforcedShares=publish) to offer unenforced shares.",
        )
    if states[ShareEnforcement.UNENFORCED]:
        post_node_event(
            api_client,
            cfg.node_name,
            node_uid,
            SHARES_UNENFORCED_EVENT,
            f"GPU(s) {states[ShareEnforcement.UNENFORCED]} offer HAMi-core shares WITHOUT enforcement:"
            f" the library {library} is missing, so memory and SM limits are advisory only (devices"
            " carry the attribute enforced=false). Install libvgpu.so there to enforce them.",
        )
