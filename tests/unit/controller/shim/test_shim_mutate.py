"""The pod rewrite for every accepted input shape, checked on the pod the patch produces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from shim_helpers import apply_patch, container, legacy_keys_left, mutate, pod

from controller.shim import AdmissionDenied, ShimDefaults, mutate_pod, template_names_used_by

GATE = {"name": "gpu.flexmig.dev/allocation"}


def claim_template(p: Mapping[str, Any], claim: str) -> str:
    [entry] = [c for c in p["spec"]["resourceClaims"] if c["name"] == claim]
    return str(entry["resourceClaimTemplateName"])


@pytest.mark.parametrize("gpumem", ["8000", "8k", 8000, "8e3"])
def test_user_guide_example(gpumem: Any) -> None:
    # The API server hands the webhook canonical quantities: 8000 arrives as "8k".
    p = pod(container("ubuntu-container", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": gpumem}), mode="mig")
    result, out = mutate(p)
    assert result.gated
    [template] = result.templates
    assert (template.namespace, template.name) == ("ns1", "flexmig-mig-2x8000mi-c0-d")
    c = out["spec"]["containers"][0]
    assert c["resources"] == {"claims": [{"name": "ubuntu-container-gpu"}]}
    assert out["spec"]["resourceClaims"] == [
        {"name": "ubuntu-container-gpu", "resourceClaimTemplateName": "flexmig-mig-2x8000mi-c0-d"}
    ]
    assert out["spec"]["schedulingGates"] == [GATE]
    assert out["metadata"] == p["metadata"]  # nothing else touched
    assert c["image"] == "ubuntu:22.04"


def test_limits_and_requests_both_stripped_other_resources_kept() -> None:
    c = container("main")
    c["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4k", "cpu": "2", "memory": "1Gi"},
        "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "cpu": "1"},
        "claims": [{"name": "scratch"}],
    }
    p = pod(c, resourceClaims=[{"name": "scratch", "resourceClaimName": "my-scratch"}])
    result, out = mutate(p)
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "2", "memory": "1Gi"},
        "requests": {"cpu": "1"},
        "claims": [{"name": "scratch"}, {"name": "main-gpu"}],
    }
    assert out["spec"]["resourceClaims"] == [
        {"name": "scratch", "resourceClaimName": "my-scratch"},
        {"name": "main-gpu", "resourceClaimTemplateName": "flexmig-any-1x4000mi-c0"},
    ]
    assert result.templates[0].name == "flexmig-any-1x4000mi-c0"


def test_requests_only_are_read() -> None:
    c = container("main")
    c["resources"] = {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}}
    result, out = mutate(pod(c))
    assert result.templates[0].name == "flexmig-any-1x100pct-c30"
    assert out["spec"]["containers"][0]["resources"] == {"claims": [{"name": "main-gpu"}]}


@pytest.mark.parametrize(
    ("limits", "defaults", "name"),
    [
        # gpumem absent: defaultMemory if > 0, else the whole GPU's memory (100%).
        ({"nvidia.com/gpu": "1"}, ShimDefaults(), "flexmig-any-1x100pct-c0"),
        ({"nvidia.com/gpu": "1"}, ShimDefaults(default_memory_mib=4096), "flexmig-any-1x4096mi-c0"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}, ShimDefaults(), "flexmig-any-1x100pct-c0"),
        (
            {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "0"},
            ShimDefaults(default_memory_mib=20),
            "flexmig-any-3x20mi-c0-d",
        ),
        # gpucores absent: defaultCores.
        ({"nvidia.com/gpu": "1"}, ShimDefaults(default_cores=25), "flexmig-any-1x100pct-c25"),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"},
            ShimDefaults(default_cores=25),
            "flexmig-any-1x100pct-c0",
        ),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}, ShimDefaults(), "flexmig-any-1x100pct-c100"),
        # percentage
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"},
            ShimDefaults(),
            "flexmig-any-2x50pct-c0-d",
        ),
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "1"},
            ShimDefaults(default_memory_mib=9),
            "flexmig-any-1x1pct-c0",
        ),
        # no gpu: HAMi adds defaultGPUNum
        ({"nvidia.com/gpumem": "8000"}, ShimDefaults(), "flexmig-any-1x8000mi-c0"),
        ({"nvidia.com/gpumem-percentage": "25"}, ShimDefaults(default_gpu_num=2), "flexmig-any-2x25pct-c0-d"),
        ({"nvidia.com/gpucores": "40"}, ShimDefaults(), "flexmig-any-1x100pct-c40"),
        ({"nvidia.com/gpu": "32"}, ShimDefaults(), "flexmig-any-32x100pct-c0-d"),
    ],
)
def test_defaults_and_shapes(limits: dict[str, str], defaults: ShimDefaults, name: str) -> None:
    result, out = mutate(pod(container("main", limits)), defaults)
    assert [t.name for t in result.templates] == [name]
    assert claim_template(out, "main-gpu") == name
    assert legacy_keys_left(out) == []


@pytest.mark.parametrize(("mode", "word"), [("mig", "mig"), ("hami-core", "hami-core"), (None, "any")])
def test_vgpu_mode(mode: str | None, word: str) -> None:
    result, _ = mutate(
        pod(container("main", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}), mode=mode)
    )
    assert result.templates[0].name == f"flexmig-{word}-1x1024mi-c0"


def test_multi_container_same_shape_shares_a_template_not_a_claim() -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}
    p = pod(container("a", limits), container("sidecar"), container("b", dict(limits)))
    result, out = mutate(p)
    assert [t.name for t in result.templates] == ["flexmig-any-1x5000mi-c0"]
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["a-gpu", "b-gpu"]
    assert out["spec"]["containers"][1] == container("sidecar")
    assert out["spec"]["containers"][2]["resources"]["claims"] == [{"name": "b-gpu"}]


def test_multi_container_different_shapes() -> None:
    p = pod(
        container("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}),
        container(
            "b", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "30", "nvidia.com/gpucores": "20"}
        ),
        mode="hami-core",
    )
    result, out = mutate(p)
    assert [t.name for t in result.templates] == [
        "flexmig-hami-core-1x5000mi-c0",
        "flexmig-hami-core-2x30pct-c20",
    ]
    assert claim_template(out, "b-gpu") == "flexmig-hami-core-2x30pct-c20"
    assert "a -> claim a-gpu" in result.reason and "b -> claim b-gpu" in result.reason


def test_init_containers_are_rewritten_too() -> None:
    p = pod(
        container("main", {"nvidia.com/gpu": "1"}),
        init=[container("warmup", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}), container("plain")],
    )
    result, out = mutate(p)
    assert {op["path"] for op in result.patch} >= {
        "/spec/initContainers/0/resources",
        "/spec/containers/0/resources",
    }
    assert out["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "warmup-gpu"}]}
    assert out["spec"]["initContainers"][1] == container("plain")
    # init containers first, as HAMi counts them
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["warmup-gpu", "main-gpu"]
    assert legacy_keys_left(out) == []


def test_existing_gates_and_claim_names_are_respected() -> None:
    p = pod(
        container("main", {"nvidia.com/gpu": "1"}),
        schedulingGates=[{"name": "example.com/quota"}],
        resourceClaims=[{"name": "main-gpu", "resourceClaimName": "someone-elses"}],
    )
    _, out = mutate(p)
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["main-gpu", "main-gpu-2"]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "main-gpu-2"}]


def test_empty_lists_get_appended_to() -> None:
    p = pod(container("main", {"nvidia.com/gpu": "1"}), schedulingGates=[], resourceClaims=[])
    _, out = mutate(p)
    assert out["spec"]["schedulingGates"] == [GATE]
    assert len(out["spec"]["resourceClaims"]) == 1


def test_long_and_odd_container_names_give_dns_label_claims() -> None:
    long = "x" * 60 + "-yz"
    p = pod(container(long, {"nvidia.com/gpu": "1"}), container("Main_C", {"nvidia.com/gpu": "1"}))
    _, out = mutate(p)
    names = [c["name"] for c in out["spec"]["resourceClaims"]]
    assert names == ["x" * 59 + "-gpu", "main-c-gpu"]
    assert all(len(n) <= 63 for n in names)


def test_flexmig_claims_get_only_the_gate() -> None:
    claims = [
        {"name": "mine", "resourceClaimTemplateName": "my-mig-template"},
        {"name": "other", "resourceClaimName": "fpga"},
    ]
    c = container("main", {"cpu": "1"})
    c["resources"]["claims"] = [{"name": "mine"}, {"name": "other"}]
    p = pod(c, resourceClaims=claims)
    seen: list[str] = []

    def lookup(entry: Mapping[str, Any]) -> bool | None:
        seen.append(entry["name"])
        return {"mine": True, "other": False}[entry["name"]]

    result = mutate_pod(p, "ns1", ShimDefaults(), lookup)
    assert result.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]
    assert result.gated and result.templates == ()
    assert "mine" in result.reason
    assert seen == ["mine", "other"]


def test_foreign_claims_pass_untouched() -> None:
    p = pod(container("main"), resourceClaims=[{"name": "x", "resourceClaimName": "y"}])
    result = mutate_pod(p, "ns1", ShimDefaults(), lambda _c: False)
    assert (result.patch, result.templates, result.gated) == ([], (), False)


@pytest.mark.parametrize(
    ("field", "kind"),
    [("resourceClaimName", "ResourceClaim"), ("resourceClaimTemplateName", "ResourceClaimTemplate")],
)
def test_missing_claim_or_template_is_denied_retryably(field: str, kind: str) -> None:
    # Admitted ungated, kube-scheduler would allocate flexmig devices once the object appears.
    claims = [{"name": "other", "resourceClaimName": "fpga"}, {"name": "x", field: "later"}]
    p = pod(container("main"), resourceClaims=claims)
    answers = {"other": False, "x": None}
    with pytest.raises(AdmissionDenied) as info:
        mutate_pod(p, "ns1", ShimDefaults(), lambda c: answers[c["name"]])
    message = info.value.message
    assert f"spec.resourceClaims[1].{field}: {kind} 'later' does not exist" in message
    assert "create it before the pod" in message and "resourceClaims[0]" not in message


def test_legacy_and_flexmig_claim_together_one_gate() -> None:
    p = pod(
        container("main", {"nvidia.com/gpu": "1"}),
        resourceClaims=[{"name": "mine", "resourceClaimName": "c"}],
    )
    result, out = mutate(p, lookup=lambda _c: True)
    assert result.gated and "flexmig claim(s) mine" in result.reason
    assert out["spec"]["schedulingGates"] == [GATE]
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["mine", "main-gpu"]


@pytest.mark.parametrize(
    "p",
    [
        pod(container("main")),
        pod(container("main", {"cpu": "1", "memory": "1Gi"})),
        pod(
            container("main", {"example.com/fpga": "1"}), mode="bogus"
        ),  # the annotation only matters for GPU pods
        pod(container("main", {"nvidia.com/gpu": "0"})),
        pod(container("main", {"nvidia.com/gpu": 0}), init=[container("i", {"nvidia.com/gpu": "0"})]),
    ],
)
def test_pods_without_gpu_requests_are_untouched(p: dict[str, Any]) -> None:
    result = mutate_pod(p, "ns1", ShimDefaults(), lambda _c: False)
    assert (result.patch, result.templates, result.gated) == ([], (), False)
    assert result.reason


def test_gpu_zero_container_beside_a_gpu_container_is_left_as_written() -> None:
    p = pod(container("idle", {"nvidia.com/gpu": "0"}), container("busy", {"nvidia.com/gpu": "1"}))
    _, out = mutate(p)
    assert out["spec"]["containers"][0] == container("idle", {"nvidia.com/gpu": "0"})
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["busy-gpu"]


def test_same_shape_same_name_and_body() -> None:
    a, _ = mutate(pod(container("a", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8k"})))
    b, _ = mutate(pod(container("zzz", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"})))
    assert a.templates == b.templates
    other_ns = mutate_pod(
        pod(container("a", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"})),
        "ns2",
        ShimDefaults(),
        lambda _c: False,
    )
    assert other_ns.templates[0].name == a.templates[0].name
    assert other_ns.templates[0].namespace == "ns2" != a.templates[0].namespace


def test_mutating_a_mutated_pod_is_denied_not_doubled() -> None:
    # The webhook sees CREATE only: a gate present on arrival was written by the pod's author.
    _, out = mutate(pod(container("main", {"nvidia.com/gpu": "1"})))
    with pytest.raises(AdmissionDenied, match=r"gpu\.flexmig\.dev/allocation is set by hand"):
        mutate(out)


def test_input_pod_is_not_modified() -> None:
    import copy

    p = pod(container("main", {"nvidia.com/gpu": "1"}), schedulingGates=[{"name": "a/b"}])
    before = copy.deepcopy(p)
    mutate(p)
    assert p == before


def test_node_name_claim_only_pod_is_not_gated() -> None:
    p = pod(
        container("main"), nodeName="n1", resourceClaims=[{"name": "c", "resourceClaimName": "allocated"}]
    )
    result = mutate_pod(p, "ns1", ShimDefaults(), lambda _c: True)
    assert (result.patch, result.gated) == ([], False)
    assert "nodeName" in result.reason


def test_template_names_used_by() -> None:
    _, out = mutate(
        pod(
            container("a", {"nvidia.com/gpu": "1"}),
            resourceClaims=[
                {"name": "x", "resourceClaimName": "y"},
                {"name": "t", "resourceClaimTemplateName": "user-tpl"},
            ],
        )
    )
    assert template_names_used_by(out) == {"user-tpl", "flexmig-any-1x100pct-c0"}
    assert template_names_used_by(pod(container("a"))) == set()
    assert template_names_used_by({}) == set()


def test_patch_is_valid_against_a_strict_applier_for_every_op() -> None:
    p = pod(
        container("a", {"nvidia.com/gpu": "1"}),
        container("b", {"nvidia.com/gpu": "1"}),
        schedulingGates=[{"name": "x/y"}],
        resourceClaims=[],
    )
    result = mutate_pod(p, "ns1", ShimDefaults(), lambda _c: False)
    assert all(op["op"] == "add" for op in result.patch)
    assert apply_patch(p, result.patch)["spec"]["schedulingGates"][-1] == GATE


def test_shim_package_does_no_io() -> None:
    # The webhook owns every API call; the rewrite must stay testable without a cluster.
    import ast
    from pathlib import Path

    import controller.shim

    forbidden = {"kubernetes", "urllib", "http", "socket", "requests", "ssl", "grpc", "subprocess"}
    for path in Path(controller.shim.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for n in names:
                assert n.split(".")[0] not in forbidden, f"{path.name} imports {n}"


@pytest.mark.parametrize("priority", ["0", "1", 1])
def test_priority_is_validated_and_stripped(priority: Any) -> None:
    # Left in place, nvidia.com/priority would keep the ungated pod Pending: no node advertises it.
    c = container("main", {"nvidia.com/gpu": "1", "nvidia.com/priority": priority, "cpu": "1"})
    c["resources"]["requests"] = {"nvidia.com/priority": priority}
    result, out = mutate(pod(c))
    assert result.gated
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"},
        "claims": [{"name": "main-gpu"}],
    }
    assert (
        result.templates[0].name
        == mutate(pod(container("main", {"nvidia.com/gpu": "1"})))[0].templates[0].name
    )
