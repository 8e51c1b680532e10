"""Wire contract of the generated kubelet APIs: packages, services, full method names, fields.

kubelet matches on full method names and field numbers only, so these are checked against the
upstream definitions (kubelet's api.proto files under k8s.io/kubelet/pkg/apis/: dra/v1, dra/v1beta1,
pluginregistration/v1, dra-health) rather than trusted.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf.descriptor import FieldDescriptor

from api.gen.dra_health_v1 import api_pb2 as h1
from api.gen.dra_health_v1alpha1 import api_pb2 as h1a1
from api.gen.dra_v1 import api_pb2 as dra_v1
from api.gen.dra_v1beta1 import api_pb2 as dra_v1beta1
from api.gen.pluginregistration_v1 import api_pb2 as reg

REPEATED = "repeated"


def _fields(pb: ModuleType, message: str) -> dict[str, tuple[int, str]]:
    desc = pb.DESCRIPTOR.message_types_by_name[message]
    out = {}
    for f in desc.fields:
        label = REPEATED if f.is_repeated else "single"
        out[f.name] = (f.number, label)
    return out


def _methods(pb: ModuleType, service: str) -> dict[str, tuple[str, str, bool]]:
    svc = pb.DESCRIPTOR.services_by_name[service]
    return {
        m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming) for m in svc.methods
    }


@pytest.mark.parametrize(("pb", "pkg"), [(dra_v1, "v1"), (dra_v1beta1, "v1beta1")])
def test_dra_plugin(pb: ModuleType, pkg: str) -> None:
    package = f"k8s.io.kubelet.pkg.apis.dra.{pkg}"
    assert pb.DESCRIPTOR.package == package
    assert pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == f"{package}.DRAPlugin"
    assert _methods(pb, "DRAPlugin") == {
        "NodePrepareResources": (
            f"{package}.NodePrepareResourcesRequest",
            f"{package}.NodePrepareResourcesResponse",
            False,
        ),
        "NodeUnprepareResources": (
            f"{package}.NodeUnprepareResourcesRequest",
            f"{package}.NodeUnprepareResourcesResponse",
            False,
        ),
    }
    assert _fields(pb, "Claim") == {"namespace": (1, "single"), "uid": (2, "single"), "name": (3, "single")}
    assert _fields(pb, "NodePrepareResourcesRequest") == {"claims": (1, REPEATED)}
    assert _fields(pb, "NodeUnprepareResourcesRequest") == {"claims": (1, REPEATED)}
    assert _fields(pb, "NodePrepareResourceResponse") == {"devices": (1, REPEATED), "error": (2, "single")}
    assert _fields(pb, "NodeUnprepareResourceResponse") == {"error": (1, "single")}
    assert _fields(pb, "Device") == {
        "request_names": (1, REPEATED),
        "pool_name": (2, "single"),
        "device_name": (3, "single"),
        "cdi_device_ids": (4, REPEATED),
    }
    for resp, value in [
        ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
    ]:
        field = pb.DESCRIPTOR.message_types_by_name[resp].fields_by_name["claims"]
        assert field.number == 1
        assert field.message_type.GetOptions().map_entry
        key, val = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        assert key.type == FieldDescriptor.TYPE_STRING
        assert val.message_type.full_name == f"{package}.{value}"


def test_plugin_registration() -> None:
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert _methods(reg, "Registration") == {
        "GetInfo": ("pluginregistration.InfoRequest", "pluginregistration.PluginInfo", False),
        "NotifyRegistrationStatus": (
            "pluginregistration.RegistrationStatus",
            "pluginregistration.RegistrationStatusResponse",
            False,
        ),
    }
    assert _fields(reg, "PluginInfo") == {
        "type": (1, "single"),
        "name": (2, "single"),
        "endpoint": (3, "single"),
        "supported_versions": (4, REPEATED),
    }
    assert _fields(reg, "RegistrationStatus") == {"plugin_registered": (1, "single"), "error": (2, "single")}
    assert _fields(reg, "InfoRequest") == {}
    assert _fields(reg, "RegistrationStatusResponse") == {}


@pytest.mark.parametrize(("pb", "pkg"), [(h1, "v1"), (h1a1, "v1alpha1")])
def test_dra_health(pb: ModuleType, pkg: str) -> None:
    assert pb.DESCRIPTOR.package == pkg
    assert _methods(pb, "DRAResourceHealth") == {
        "NodeWatchResources": (f"{pkg}.NodeWatchResourcesRequest", f"{pkg}.NodeWatchResourcesResponse", True)
    }
    assert {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
    assert _fields(pb, "DeviceIdentifier") == {"pool_name": (1, "single"), "device_name": (2, "single")}
    assert _fields(pb, "DeviceHealth") == {
        "device": (1, "single"),
        "health": (2, "single"),
        "last_updated_time": (3, "single"),
        "health_check_timeout_seconds": (4, "single"),
        "message": (5, "single"),
    }
    assert (
        pb.DESCRIPTOR.message_types_by_name["DeviceHealth"].fields_by_name["last_updated_time"].type
        == FieldDescriptor.TYPE_INT64
    )
    assert _fields(pb, "NodeWatchResourcesResponse") == {"devices": (1, REPEATED)}


def test_descriptor_file_names_are_distinct() -> None:
    names = {m.DESCRIPTOR.name for m in (dra_v1, dra_v1beta1, reg, h1, h1a1)}
    assert len(names) == 5
