"""controller/allocation/nodefilter.py: kube-scheduler's NodeUnschedulable, NodeName, TaintToleration and NodeAffinity
filters on camelCase Node/Pod dicts, and the Decider honouring them."""

from __future__ import annotations

from typing import Any

import pytest
from ctl_helpers import CLASSES, claim, decider, mem
from hypothesis import given
from hypothesis import strategies as st

from controller.allocation.nodefilter import (
    Exclusion,
    FilterPlugin,
    NodeFilter,
    PodRules,
    Taint,
    Toleration,
    pinned_nodes,
)


def node(
    name: str = "n",
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


# --- tolerations ---------------------------------------------------------------------------------------

T = Taint("dedicated", "gpu", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint_", "expected"),
    [
        (Toleration("dedicated", "Equal", "gpu", "NoSchedule"), T, True),
        (Toleration("dedicated", "", "gpu", "NoSchedule"), T, True),  # "" operator means Equal
        (Toleration("dedicated", "Equal", "cpu", "NoSchedule"), T, False),
        (Toleration("dedicated", "Equal", "", "NoSchedule"), T, False),
        (Toleration("other", "Equal", "gpu", "NoSchedule"), T, False),
        (Toleration("dedicated", "Exists", "", "NoSchedule"), T, True),
        (Toleration("dedicated", "Exists", "", ""), Taint("dedicated", "x", "NoExecute"), True),
        (Toleration("", "Exists", "", ""), Taint("anything", "at-all", "NoExecute"), True),
        (Toleration("", "Exists", "", "NoExecute"), T, False),  # effect still has to match
        (Toleration("dedicated", "Equal", "gpu", ""), Taint("dedicated", "gpu", "NoExecute"), True),
        (Toleration("dedicated", "Equal", "gpu", "NoExecute"), T, False),
        (Toleration("dedicated", "Equal", "gpu", "PreferNoSchedule"), T, False),
        (Toleration("dedicated", "Foo", "gpu", "NoSchedule"), T, False),  # unknown operator
        # Go's ToleratesTaint skips an empty key also for Equal (the API refuses such a toleration).
        (Toleration("", "Equal", "", ""), Taint("any", "", "NoSchedule"), True),
        (Toleration("", "Equal", "", ""), T, False),
        (Toleration("level", "Lt", "10", "NoSchedule"), Taint("level", "5", "NoSchedule"), False),  # gate off
        (Toleration("level", "Gt", "1", "NoSchedule"), Taint("level", "5", "NoSchedule"), False),
    ],
)
def test_toleration_matches_taint(toleration: Toleration, taint_: Taint, expected: bool) -> None:
    assert toleration.tolerates(taint_) is expected


@pytest.mark.parametrize(
    ("operator", "limit", "value", "expected"),
    [
        ("Lt", "10", "5", True),
        ("Lt", "5", "5", False),
        ("Gt", "1", "5", True),
        ("Gt", "5", "5", False),
        ("Gt", "-3", "-2", True),
        ("Lt", "10", "05", False),  # not a canonical decimal integer
        ("Lt", "10", "+5", False),
        ("Lt", "10", "five", False),
        ("Lt", "1x", "5", False),
        ("Gt", "1", "99999999999999999999", False),  # beyond int64
    ],
)
def test_comparison_tolerations_behind_the_gate(
    operator: str, limit: str, value: str, expected: bool
) -> None:
    tol = Toleration("level", operator, limit, "NoSchedule")
    assert tol.tolerates(Taint("level", value, "NoSchedule"), comparison_operators=True) is expected


# --- whole-node checks ---------------------------------------------------------------------------------

ALL = {"operator": "Exists"}
CASES: list[tuple[str, dict[str, Any], dict[str, Any], FilterPlugin | None]] = [
    ("plain", pod(), node(), None),
    ("cordoned", pod(), node(unschedulable=True), FilterPlugin.NODE_UNSCHEDULABLE),
    (
        "cordon tolerated",
        pod(
            tolerations=[
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
            ]
        ),
        node(unschedulable=True),
        None,
    ),
    ("cordon, tolerate all", pod(tolerations=[ALL]), node(unschedulable=True), None),
    (
        "cordon, wrong value",
        pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "value": "x", "effect": "NoSchedule"}]),
        node(unschedulable=True),
        FilterPlugin.NODE_UNSCHEDULABLE,
    ),
    ("node name", pod(nodeName="other"), node("n"), FilterPlugin.NODE_NAME),
    ("node name matches", pod(nodeName="n"), node("n"), None),
    ("NoSchedule", pod(), node(taints=[taint("a")]), FilterPlugin.TAINT_TOLERATION),
    ("NoExecute", pod(), node(taints=[taint("a", effect="NoExecute")]), FilterPlugin.TAINT_TOLERATION),
    ("PreferNoSchedule ignored", pod(), node(taints=[taint("a", effect="PreferNoSchedule")]), None),
    (
        "one of two tolerated",
        pod(tolerations=[{"key": "a", "operator": "Exists"}]),
        node(taints=[taint("a"), taint("b", "v")]),
        FilterPlugin.TAINT_TOLERATION,
    ),
    (
        "both tolerated",
        pod(tolerations=[{"key": "a", "operator": "Exists"}, {"key": "b", "value": "v"}]),
        node(taints=[taint("a"), taint("b", "v", "NoExecute")]),
        None,
    ),
    ("nodeSelector", pod(nodeSelector={"zone": "x"}), node(labels={"zone": "x"}), None),
    (
        "nodeSelector value",
        pod(nodeSelector={"zone": "x"}),
        node(labels={"zone": "y"}),
        FilterPlugin.NODE_AFFINITY,
    ),
    ("nodeSelector missing", pod(nodeSelector={"zone": ""}), node(), FilterPlugin.NODE_AFFINITY),
    ("nodeSelector empty value", pod(nodeSelector={"zone": ""}), node(labels={"zone": ""}), None),
    (
        "selector and affinity both apply",
        pod(nodeSelector={"zone": "x"}, affinity=affinity({"matchExpressions": [expr("gpu", "Exists")]})),
        node(labels={"zone": "x"}),
        FilterPlugin.NODE_AFFINITY,
    ),
    (
        "taint before affinity",
        pod(nodeSelector={"zone": "x"}),
        node(taints=[taint("a")]),
        FilterPlugin.TAINT_TOLERATION,
    ),
    ("no terms: no node", pod(affinity=affinity()), node(), FilterPlugin.NODE_AFFINITY),
    ("empty term: no node", pod(affinity=affinity({})), node(), FilterPlugin.NODE_AFFINITY),
    ("no required affinity", pod(affinity={"nodeAffinity": {}}), node(), None),
]


@pytest.mark.parametrize(
    ("spec_pod", "spec_node", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_pod_rules_check(
    spec_pod: dict[str, Any], spec_node: dict[str, Any], expected: FilterPlugin | None
) -> None:
    found = PodRules.from_pod(spec_pod).check(spec_node)
    assert (found.plugin if found else None) is expected


def test_untolerated_taint_is_named() -> None:
    rules = PodRules.from_pod(pod(tolerations=[{"key": "a", "operator": "Exists"}]))
    found = rules.check(node(taints=[taint("a"), taint("b", "v", "NoExecute")]))
    assert found == Exclusion(FilterPlugin.TAINT_TOLERATION, "b=v:NoExecute")


LABELS = {"zone": "eu-1", "gpus": "4", "big": "99999999999999999999", "word": "four", "plus": "+7"}
EXPRESSIONS = [
    (expr("zone", "In", "eu-1", "eu-2"), True),
    (expr("zone", "In", "us-1"), False),
    (expr("absent", "In", "x"), False),
    (expr("zone", "NotIn", "us-1"), True),
    (expr("zone", "NotIn", "eu-1"), False),
    (expr("absent", "NotIn", "x"), True),
    (expr("zone", "Exists"), True),
    (expr("absent", "Exists"), False),
    (expr("zone", "DoesNotExist"), False),
    (expr("absent", "DoesNotExist"), True),
    (expr("gpus", "Gt", "3"), True),
    (expr("gpus", "Gt", "4"), False),
    (expr("gpus", "Lt", "5"), True),
    (expr("gpus", "Lt", "4"), False),
    (expr("gpus", "Gt", "-1"), True),
    (expr("plus", "Gt", "6"), True),  # Go's ParseInt accepts a sign
    (expr("word", "Gt", "1"), False),  # not an integer
    (expr("big", "Gt", "1"), False),  # beyond int64
    (expr("absent", "Lt", "100"), False),
    # malformed: the term matches no node
    (expr("zone", "Near", "eu-1"), False),
    (expr("zone", "In"), False),
    (expr("zone", "NotIn"), False),
    (expr("zone", "Exists", "eu-1"), False),
    (expr("absent", "DoesNotExist", "x"), False),
    (expr("gpus", "Gt", "1", "2"), False),
    (expr("gpus", "Lt", "ten"), False),
    (expr("gpus", "Gt"), False),
]


@pytest.mark.parametrize(
    ("requirement", "expected"),
    EXPRESSIONS,
    ids=[f"{e['operator']}-{e['key']}-{e['values']}" for e, _ in EXPRESSIONS],
)
def test_match_expressions(requirement: dict[str, Any], expected: bool) -> None:
    rules = PodRules.from_pod(pod(affinity=affinity({"matchExpressions": [requirement]})))
    assert (rules.check(node("n", labels=LABELS)) is None) is expected


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (expr("metadata.name", "In", "n"), True),
        (expr("metadata.name", "In", "m"), False),
        (expr("metadata.name", "NotIn", "m"), True),
        (expr("metadata.name", "NotIn", "n"), False),
        (expr("metadata.name", "In", "n", "m"), False),  # exactly one value
        (expr("metadata.name", "Exists"), False),  # only In / NotIn
        (expr("metadata.uid", "In", "n"), False),  # only metadata.name has a value
    ],
)
def test_match_fields(field: dict[str, Any], expected: bool) -> None:
    rules = PodRules.from_pod(pod(affinity=affinity({"matchFields": [field]})))
    assert (rules.check(node("n")) is None) is expected


def test_terms_are_ored_and_requirements_anded() -> None:
    both = {
        "matchExpressions": [expr("zone", "In", "eu-1")],
        "matchFields": [expr("metadata.name", "In", "m")],
    }
    other = {"matchExpressions": [expr("gpus", "Gt", "2"), expr("zone", "Exists")]}
    assert PodRules.from_pod(pod(affinity=affinity(both))).check(node("n", labels=LABELS)) is not None
    assert PodRules.from_pod(pod(affinity=affinity(both, other))).check(node("n", labels=LABELS)) is None
    anded = {"matchExpressions": [expr("gpus", "Gt", "2"), expr("zone", "DoesNotExist")]}
    assert PodRules.from_pod(pod(affinity=affinity(anded))).check(node("n", labels=LABELS)) is not None


def test_malformed_term_is_reported_and_others_still_match() -> None:
    bad = {"matchExpressions": [expr("zone", "Near", "eu-1")]}
    good = {"matchExpressions": [expr("zone", "In", "eu-1")]}
    rules = PodRules.from_pod(pod(affinity=affinity(bad, good)))
    assert rules.check(node("n", labels=LABELS)) is None
    (problem,) = rules.problems
    assert "nodeSelectorTerms[0].matchExpressions[0].operator 'Near' is not supported" in problem
    assert "In, NotIn, Exists, DoesNotExist, Gt, Lt" in problem


def test_unknown_toleration_operator_is_reported() -> None:
    rules = PodRules.from_pod(pod(tolerations=[{"key": "level", "operator": "Gt", "value": "1"}]))
    assert rules.check(node(taints=[taint("level", "5")])) == Exclusion(
        FilterPlugin.TAINT_TOLERATION, "level=5:NoSchedule"
    )
    (problem,) = rules.problems
    assert "spec.tolerations[0].operator 'Gt' is not supported (allowed: Equal, Exists)" in problem
    gated = PodRules.from_pod(
        pod(tolerations=[{"key": "level", "operator": "Gt", "value": "1"}]), comparison_operators=True
    )
    assert gated.problems == () and gated.check(node(taints=[taint("level", "5")])) is None


# --- NodeFilter and pinned nodes -----------------------------------------------------------------------


def allocated_on(*names: str) -> dict[str, Any]:
    """An allocation available on any of `names` (one term each: matchFields takes exactly one value)."""
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in names]
    return {"status": {"allocation": {"nodeSelector": {"nodeSelectorTerms": terms}}}}


def allowed(pins: Any, names: str = "abc", labels: dict[str, str] | None = None) -> set[str]:
    return {n for n in names if pins.allows(labels or {}, n)}


def test_pinned_nodes_intersect() -> None:
    assert pinned_nodes([]) is None
    assert pinned_nodes([{"status": {"allocation": {}}}]) is None
    assert allowed(pinned_nodes([allocated_on("a", "b"), allocated_on("b", "c")])) == {"b"}
    assert allowed(pinned_nodes([allocated_on("a"), allocated_on("c")])) == set()
    assert pinned_nodes([allocated_on("a"), allocated_on("c")]).description == "on a; on c"
    # matchFields with two values is invalid (the API allows exactly one): it selects no node.
    two_values = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}
    invalid = {"status": {"allocation": {"nodeSelector": {"nodeSelectorTerms": [two_values]}}}}
    assert allowed(pinned_nodes([invalid])) == set()


def test_pinned_terms_are_ored_and_labels_count() -> None:
    # One selector with two terms (a OR c); another claim's selector by label.
    two_terms = {
        "status": {
            "allocation": {
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]},
                    ]
                }
            }
        }
    }
    assert allowed(pinned_nodes([two_terms])) == {"a", "c"}
    by_label = {
        "status": {
            "allocation": {
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                    ]
                }
            }
        }
    }
    pins = pinned_nodes([two_terms, by_label])
    assert allowed(pins, labels={"zone": "z1"}) == {"a", "c"}
    assert allowed(pins, labels={"zone": "z2"}) == set()


def test_node_filter_reasons_and_summary() -> None:
    nodes = {
        "a": node("a"),
        "b": node("b", taints=[taint("dedicated", "gpu")]),
        "c": node("c", unschedulable=True),
        **{f"z{i}": node(f"z{i}", labels={"zone": "z"}) for i in range(5)},
    }
    filt = NodeFilter(
        PodRules.from_pod(pod(affinity=affinity({"matchExpressions": [expr("zone", "DoesNotExist")]}))), nodes
    )
    assert [n for n in ["a", "b", "c", "ghost", *sorted(nodes)[3:]] if filt(n)] == ["a"]
    assert filt.excluded["ghost"].plugin is FilterPlugin.NODE_UNKNOWN
    assert filt.summary() == (
        "1 node(s) had no Node object (ghost), 1 node(s) were unschedulable (c), "
        "1 node(s) had untolerated taint(s) (b: dedicated=gpu:NoSchedule), "
        "5 node(s) didn't match Pod's node affinity/selector (z0: required node affinity; "
        "z1: required node affinity; z2: required node affinity, +2 more)"
    )
    assert NodeFilter(PodRules(), nodes).summary() == ""


def test_node_filter_pins_and_asks_each_node_once() -> None:
    calls: list[str] = []

    class Nodes(dict[str, dict[str, Any]]):
        def get(self, key: str, default: Any = None) -> Any:
            calls.append(key)
            return super().get(key, default)

    filt = NodeFilter(PodRules(), Nodes({"a": node("a"), "b": node("b")}), pinned_nodes([allocated_on("b")]))
    assert [filt(n) for n in ("a", "b", "a", "b")] == [False, True, False, True]
    assert calls == ["a", "b"]
    assert filt.summary() == "1 node(s) were not the node the pod's allocated claims are on (a: on b)"


def test_summary_names_unsupported_rules() -> None:
    rules = PodRules.from_pod(pod(affinity=affinity({"matchFields": [expr("metadata.name", "Exists")]})))
    filt = NodeFilter(rules, {"a": node("a")})
    assert not filt("a")
    assert (
        "unsupported pod rules" in filt.summary()
        and "'Exists' is not supported (allowed: In, NotIn)" in filt.summary()
    )


# --- the Decider with a NodeFilter ----------------------------------------------------------------------


def test_decider_avoids_the_tainted_node_and_says_why_it_waits() -> None:
    # 4000 MiB: the A100's 1g.5gb wastes least, so the A100 node wins unless it is excluded.
    d = decider({"a100": ("A100-40GB", 1), "h100": ("H100-80GB", 1)})
    nodes = {"a100": node("a100", taints=[taint("dedicated", "gpu")]), "h100": node("h100")}
    assert (
        d.decide(
            [claim("free", mem(4000))],
            CLASSES,
            node_ok=NodeFilter(PodRules(), {"a100": node("a100"), "h100": node("h100")}),
        ).node
        == "a100"
    )
    assert d.decide([claim("c", mem(4000))], CLASSES, node_ok=NodeFilter(PodRules(), nodes)).node == "h100"
    tolerant = PodRules.from_pod(
        pod(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
    )
    assert d.decide([claim("c", mem(4000))], CLASSES, node_ok=NodeFilter(tolerant, nodes)).node == "a100"
    only_a100 = 'device.attributes["gpu.flexmig.dev"].model == "A100-40GB"'
    filt = NodeFilter(PodRules(), nodes)
    decision = d.decide([claim("c", only_a100)], CLASSES, node_ok=filt)
    assert not decision.ok
    assert filt.summary() == "1 node(s) had untolerated taint(s) (a100: dedicated=gpu:NoSchedule)"


# --- properties -----------------------------------------------------------------------------------------

words = st.text(alphabet="abcxyz/.-", min_size=0, max_size=6)
keys = st.text(alphabet="abcxyz/.-", min_size=1, max_size=6)  # the API requires a taint key
effects = st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])
taints = st.lists(st.builds(lambda k, v, e: taint(k, v, e), keys, words, effects), max_size=6)


@given(taints, st.booleans())
def test_tolerating_everything_passes_every_taint_set(
    node_taints: list[dict[str, str]], cordoned: bool
) -> None:
    rules = PodRules.from_pod(pod(tolerations=[ALL]))
    assert rules.check(node(taints=node_taints, unschedulable=cordoned)) is None


@given(taints, st.data())
def test_exact_tolerations_pass_and_dropping_one_fails(
    node_taints: list[dict[str, str]], data: st.DataObject
) -> None:
    exact = [
        {"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}
        for t in node_taints
    ]
    assert PodRules.from_pod(pod(tolerations=exact)).check(node(taints=node_taints)) is None
    blocking = [t for t in node_taints if t["effect"] != "PreferNoSchedule"]
    if not blocking:
        return
    dropped = data.draw(st.sampled_from(blocking))
    rest = [
        t
        for t in exact
        if (t["key"], t["value"], t["effect"]) != (dropped["key"], dropped["value"], dropped["effect"])
    ]
    found = PodRules.from_pod(pod(tolerations=rest)).check(node(taints=node_taints))
    assert found is not None and found.plugin is FilterPlugin.TAINT_TOLERATION


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), words, max_size=3),
    st.sampled_from(["a", "b", "c"]),
    st.lists(words, min_size=1, max_size=3),
)
def test_not_in_and_does_not_exist_are_complements(
    labels: dict[str, str], key: str, values: list[str]
) -> None:
    def matches(op: str, *vals: str) -> bool:
        return (
            PodRules.from_pod(pod(affinity=affinity({"matchExpressions": [expr(key, op, *vals)]}))).check(
                node(labels=labels)
            )
            is None
        )

    assert matches("In", *values) != matches("NotIn", *values)
    assert matches("Exists") != matches("DoesNotExist")
