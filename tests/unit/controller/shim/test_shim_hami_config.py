"""HAMi v2.10's device config as written: custom resource names and memoryFactor in the shim."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from shim_helpers import container, mutate, pod

from controller.shim import AdmissionDenied, ShimConfigError, ShimDefaults, parse_shim_defaults
from controller.shim.defaults import ResourceNames
from driver import hamiconfig

DATA = Path(__file__).resolve().parents[3] / "data" / "hami-v2.10"


def _hami_doc() -> dict[str, object]:
    return hamiconfig.device_config_document(yaml.safe_load((DATA / "device-config.yaml").read_text()))


def test_hami_v210_device_config_gives_hami_defaults() -> None:
    d = parse_shim_defaults(_hami_doc())
    # HAMi's chart renders HAMi's defaults: nothing changes but the allowlist, which is read as given.
    assert replace(d, allowlist=ShimDefaults().allowlist) == ShimDefaults()
    assert d.allowlist.to_data() == _hami_doc()["nvidia"]["migProfileAllowlist"]
    assert hamiconfig.unused_keys(_hami_doc()) == ["cambricon", "hygon", "nvidia.overwriteEnv"]


def test_configmap_and_its_data_are_the_same_document() -> None:
    text = (DATA / "device-config.yaml").read_text()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"device-config.yaml": text}}
    assert hamiconfig.device_config_document(cm) == _hami_doc()
    assert hamiconfig.device_config_document(cm["data"]) == _hami_doc()


CUSTOM = {
    "nvidia": {
        "resourceCountName": "example.com/vgpu",
        "resourceMemoryName": "example.com/vgpu-memory",
        "resourceMemoryPercentageName": "example.com/vgpu-memory-percentage",
        "resourceCoreName": "example.com/vgpu-cores",
        "resourcePriorityName": "example.com/vgpu-priority",
        "memoryFactor": 1024,
    }
}


def test_custom_resource_names_and_memory_factor_are_honoured() -> None:
    defaults = parse_shim_defaults(CUSTOM)
    assert defaults.names.count == "example.com/vgpu" and defaults.memory_factor == 1024
    # gpumem 8 in units of 1024 MiB is 8192 MiB.
    p = pod(container("c", {"example.com/vgpu": "1", "example.com/vgpu-memory": "8"}), mode="mig")
    result, out = mutate(p, defaults)
    [template] = result.templates
    assert template.name == "flexmig-mig-1x8192mi-c0"
    assert out["spec"]["containers"][0]["resources"] == {"claims": [{"name": "c-gpu"}]}
    # HAMi's default names are not the shim's any more: such a container is left alone.
    plain = pod(container("c", {"nvidia.com/gpu": "1"}))
    result, out = mutate(plain, defaults)
    assert result.patch == [] and not result.gated


def test_custom_names_denials_name_the_custom_resource() -> None:
    defaults = parse_shim_defaults(CUSTOM)
    p = pod(container("c", {"example.com/vgpu": "1", "example.com/vgpu-typo": "3"}))
    with pytest.raises(
        AdmissionDenied, match=r"example.com/vgpu-typo cannot be combined with example.com/vgpu"
    ):
        mutate(p, defaults)
    p = pod(container("c", {"example.com/vgpu": "1", "example.com/vgpu-cores": "300"}))
    with pytest.raises(AdmissionDenied, match=r"example.com/vgpu-cores='300' in limits is out of range"):
        mutate(p, defaults)


@pytest.mark.parametrize(
    ("nvidia", "needle"),
    [
        ({"resourceCountName": "gpu"}, r"nvidia.resourceCountName: 'gpu' is not an extended resource name"),
        ({"resourceMemoryName": 5}, r"nvidia.resourceMemoryName: 5"),
        ({"resourceCoreName": "kubernetes.io/cores"}, r"nvidia.resourceCoreName"),
        ({"resourceCoreName": "nvidia.com/gpu"}, r"two roles share one name"),
        ({"memoryFactor": 0}, r"nvidia.memoryFactor: 0 is not allowed \(allowed: an integer 1\.\."),
        ({"memoryFactor": "2"}, r"nvidia.memoryFactor: '2'"),
        ({"memoryFactor": True}, r"nvidia.memoryFactor: True"),
    ],
)
def test_bad_names_and_factors_are_refused_naming_the_key(nvidia: dict[str, object], needle: str) -> None:
    with pytest.raises(ShimConfigError, match=needle):
        parse_shim_defaults({"nvidia": nvidia})


def test_empty_name_is_hamis_default() -> None:
    # HAMi's chart renders an unset value as an empty string.
    assert parse_shim_defaults({"nvidia": {"resourceCountName": ""}}).names == ResourceNames()


def test_memory_factor_overflow_is_denied() -> None:
    defaults = parse_shim_defaults({"nvidia": {"memoryFactor": 2**20}})
    p = pod(container("c", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}))
    with pytest.raises(AdmissionDenied, match=r"memoryFactor 1048576 is .* MiB, above"):
        mutate(p, defaults)
