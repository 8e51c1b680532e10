"""Defaults that deliver dynamic MIG (issue 13): an unlisted node decides per GPU (`auto`), and a
hami-core GPU whose HAMi-core library is missing withholds its share unless the admin allows it."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_kp_slices import NODE, catalogs_for

from driver.catalog.types import GpuCatalog
from kubeletplugin.publish.slices import SHARES_REFUSED_REASON, NodeSlices, build_node_slices
from kubeletplugin.settings.nodeconfig import NodeConfig, OperatingMode
from kubeletplugin.shared.device import ShareEnforcement

AUTO = NodeConfig(NODE, OperatingMode.AUTO)
HAMI = NodeConfig(NODE, OperatingMode.HAMI_CORE)


def _not_mig_capable(cat: GpuCatalog) -> GpuCatalog:
    return dataclasses.replace(cat, gpu=dataclasses.replace(cat.gpu, mig_capable=False), profiles=())


def _build(
    cats: list[GpuCatalog], node: NodeConfig, shares: ShareEnforcement = ShareEnforcement.ENFORCED
) -> NodeSlices:
    return build_node_slices(cats, NODE, 1, node, {}, shares=shares)


def _devices(ns: NodeSlices) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in ns.slices for d in s.body["spec"].get("devices", [])}


def test_auto_gives_a_mig_capable_gpu_mig_devices() -> None:
    # Hopper, MIG off: whole GPU plus MIG devices, exactly what an explicit mig node publishes.
    cats = catalogs_for("H100-80GB", 2, every_profile=False)
    auto = _build(cats, AUTO)
    mig = _build(cats, NodeConfig(NODE, OperatingMode.MIG))
    assert _devices(auto) == _devices(mig)
    names = _devices(auto)
    assert any("-mig-" in n for n in names) and "gpu-0" in names and "gpu-0-shared" not in names
    assert all(g.shares is None for g in auto.gpus)


def test_auto_shares_a_gpu_that_cannot_do_mig_when_enforced() -> None:
    cats = [*catalogs_for("H100-80GB", 1, every_profile=False)]
    cats.append(dataclasses.replace(_not_mig_capable(catalogs_for("H100-80GB", 2)[1])))
    ns = _build(cats, AUTO)
    names = _devices(ns)
    assert "gpu-1-shared" in names and not any(n.startswith("gpu-1-mig") for n in names)
    assert names["gpu-1-shared"]["attributes"]["enforced"] == {"bool": True}
    assert [g.shares for g in ns.gpus] == [None, ShareEnforcement.ENFORCED]


def test_auto_offers_whole_gpu_when_a_share_could_not_be_enforced() -> None:
    cat = _not_mig_capable(catalogs_for("H100-80GB", 1)[0])
    ns = _build([cat], AUTO, ShareEnforcement.REFUSED)
    assert set(_devices(ns)) == {"gpu-0"}
    [g] = ns.gpus
    assert g.whole and not g.shared and g.shares is ShareEnforcement.REFUSED
    assert SHARES_REFUSED_REASON in g.reason


def test_hami_core_node_without_library_refuses_shares() -> None:
    cats = catalogs_for("H100-80GB", 2, every_profile=False)
    ns = _build(cats, HAMI, ShareEnforcement.REFUSED)
    assert _devices(ns) == {}
    assert all(g.shares is ShareEnforcement.REFUSED and not g.shared for g in ns.gpus)
    assert all(g.reason == SHARES_REFUSED_REASON for g in ns.gpus)


def test_unenforced_shares_are_published_marked() -> None:
    cats = catalogs_for("H100-80GB", 1, every_profile=False)
    ns = _build(cats, HAMI, ShareEnforcement.UNENFORCED)
    dev = _devices(ns)["gpu-0-shared"]
    assert dev["attributes"]["enforced"] == {"bool": False}
    [g] = ns.gpus
    assert g.shared and g.shares is ShareEnforcement.UNENFORCED and "unenforced" in g.reason


def test_filtered_or_mig_on_gpu_reports_no_share_state() -> None:
    cats = catalogs_for("H100-80GB", 2, every_profile=False)
    node = dataclasses.replace(HAMI, filter_indexes=frozenset({0}))
    ns = build_node_slices(cats, NODE, 1, node, {1: True}, shares=ShareEnforcement.REFUSED)
    assert [g.shares for g in ns.gpus] == [None, None]
