"""The checked-in kubelet API code is what its .proto files generate, and Allocate's answer
maps an agent allocation the way each device list strategy says."""

import ast
import importlib
import subprocess
import sys

import pytest

from hostagent.plugins.allocations import container_response
from hostagent.plugins.kubelet import generate


def serialized(source: str) -> bytes:
    """The descriptor a generated module adds to the pool (``AddSerializedFile(b'...')``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return node.args[0].value
    raise AssertionError("no AddSerializedFile call")


@pytest.mark.parametrize("name", [p.removesuffix(".proto") for p in generate.PROTOS])
def test_generated_code_matches_the_proto(tmp_path, name):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install '.[test]')")
    args = generate.protoc_args(tmp_path, [f"{name}.proto"])
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fresh = (tmp_path / "hostagent/plugins/kubelet" / f"{name}_pb2.py").read_text()
    checked_in = importlib.import_module(f"hostagent.plugins.kubelet.{name}_pb2")
    # The serialized descriptor is the whole API (messages, fields, numbers, services).
    assert serialized(fresh) == checked_in.DESCRIPTOR.serialized_pb, \
        f"{name}_pb2.py is stale: run python -m hostagent.plugins.kubelet.generate"
    grpc_fresh = (tmp_path / "hostagent/plugins/kubelet" / f"{name}_pb2_grpc.py").read_text()
    grpc_checked_in = (generate.HERE / f"{name}_pb2_grpc.py").read_text()
    strip = lambda text: [line for line in text.splitlines() if "GENERATED_VERSION =" not in line]  # noqa: E731
    assert strip(grpc_fresh) == strip(grpc_checked_in)


def test_wire_names_are_the_kubelets():
    from hostagent.plugins.kubelet import deviceplugin_pb2, podresources_pb2
    services = deviceplugin_pb2.DESCRIPTOR.services_by_name
    assert services["DevicePlugin"].full_name == "v1beta1.DevicePlugin"
    assert services["Registration"].full_name == "v1beta1.Registration"
    assert podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"].full_name == "v1.PodResourcesLister"


def test_dra_wire_names_are_the_kubelets():
    """The kubelet calls the DRA services by these full names, and matches a registration's
    supported versions against the short forms (``<package's last part>.<service>``)."""
    from hostagent.plugins.kubelet import (dra_v1_pb2, dra_v1beta1_pb2, drahealth_v1_pb2, drahealth_v1alpha1_pb2,
                                           pluginregistration_pb2)
    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == \
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    assert drahealth_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == "v1.DRAResourceHealth"
    assert drahealth_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == \
        "v1alpha1.DRAResourceHealth"
    assert pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == \
        "pluginregistration.Registration"
    # v1 added share_id (field 5) to a prepared device; v1beta1 has none.
    assert dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    assert drahealth_v1_pb2.HealthStatus.Value("UNHEALTHY") == 2


ALLOC = {"devices": ["GPU-a", "GPU-b"], "visible_devices": "GPU-a,GPU-b",
         "cdi_devices": ["hostagent.io/allocation=x-0", "hostagent.io/allocation=x-1"],
         "container_edits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "A=b=c"],
                             "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidiactl", "hostPath": "/h/ctl",
                                                                        "permissions": "rw"}],
                             "mounts": [{"hostPath": "/h/lib.so", "containerPath": "/lib.so", "options": ["ro", "bind"]},
                                        {"hostPath": "/h/d", "containerPath": "/d", "options": ["bind"]}]}}
VIEWS = {"GPU-a": {"uuid": "GPU-a", "cdi_devices": ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-a"]},
         "GPU-b": {"uuid": "GPU-b", "cdi_devices": ["nvidia.com/gpu=1", "nvidia.com/gpu=GPU-b"]}}


def test_allocate_answers_per_strategy():
    r = container_response(ALLOC, VIEWS, ("cdi-cri", "envvar"), "node")
    assert [d.name for d in r.cdi_devices] == ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
    assert dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"} and not r.mounts and not r.devices
    assert not r.annotations                     # CDI's spec (or the legacy NVIDIA hook) does the work
    r = container_response(ALLOC, VIEWS, ("cdi-cri",), "allocation")
    assert [d.name for d in r.cdi_devices] == ALLOC["cdi_devices"] and not r.envs
    # A device the view no longer has: the allocation's names, which still resolve.
    r = container_response(ALLOC, {}, ("cdi-cri",), "node")
    assert [d.name for d in r.cdi_devices] == ALLOC["cdi_devices"]
    r = container_response(ALLOC, VIEWS, ("edits",), "node")
    assert not r.cdi_devices and dict(r.envs) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "A": "b=c"}
    assert [(d.container_path, d.host_path, d.permissions) for d in r.devices] == [
        ("/dev/nvidia0", "/dev/nvidia0", "rw"), ("/dev/nvidiactl", "/h/ctl", "rw")]
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == [
        ("/lib.so", "/h/lib.so", True), ("/d", "/h/d", False)]
    # Plain edits carry no hook: the annotation the packaged hooks.d entry waits for.
    assert dict(r.annotations) == {"hostagent.io/hook": "prepare"}


def test_the_edits_annotation_is_the_one_the_hooks_dir_entry_matches():
    import json
    import re
    from pathlib import Path
    from hostagent.plugins.allocations import HOOK_ANNOTATION
    entry = json.loads((Path(__file__).parents[2] / "hooks/50-hostagent.json").read_text())
    key, value = HOOK_ANNOTATION
    ((key_re, value_re),) = entry["when"]["annotations"].items()
    assert re.search(key_re, key) and re.search(value_re, value)


def test_kubelet_ids_of_an_allocation():
    from hostagent.plugins.allocations import allocation_id, kubelet_ids
    assert kubelet_ids({"devices": ["GPU-a", "MIG-b"]}) == {"GPU-a", "MIG-b"}
    assert kubelet_ids({"devices": ["GPU-a", "GPU-c"], "replicas": ["GPU-a::1", "GPU-a::3"]}) == {
        "GPU-a::1", "GPU-a::3", "GPU-c"}
    # The same set however the kubelet orders it; another resource, another allocation.
    assert allocation_id("nvidia.com/gpu", ["b", "a"]) == allocation_id("nvidia.com/gpu", ["a", "b"])
    assert allocation_id("nvidia.com/gpu", ["a"]) != allocation_id("nvidia.com/gpu.shared", ["a"])
