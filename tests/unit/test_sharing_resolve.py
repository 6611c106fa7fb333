"""The sharing configuration against a node's devices: what is shared how, and every input
the node cannot honour refused before anything changes."""

import dataclasses

import pytest

from hostagent.devices.records import MigDevice, Placement
from hostagent.errors import ConfigError
from hostagent.sharing.config import parse
from hostagent.sharing.resolve import max_clients, replica_ids, resolve

from .mig_records import A100, T4, gpu, inventory


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def mig(parent, index: int, profile: str, gi: int, memory: int) -> MigDevice:
    return MigDevice(uuid=f"MIG-{parent.index:04d}{index:04d}-0000-0000-0000-000000000000", parent_index=parent.index,
                     parent_uuid=parent.uuid, parent_minor=parent.minor, index=index, gi=gi, ci=0,
                     profile=profile, gi_profile_id=19, ci_profile_id=0, placement=Placement(index, 1),
                     ci_placement=Placement(0, 1), memory_mib=memory, multiprocessors=14, copy_engines=1,
                     decoders=0, encoders=0, jpegs=0, ofas=0)


def node():
    """Four A100s; GPU 3 has MIG enabled with two 1g.5gb devices."""
    gpus = [dataclasses.replace(gpu(i, A100), uuid=uuid(i)) for i in range(3)]
    g3 = dataclasses.replace(gpu(3, A100, enabled=True), uuid=uuid(3))
    g3 = dataclasses.replace(g3, mig=dataclasses.replace(g3.mig, devices=(mig(g3, 0, "1g.5gb", 13, 4864),
                                                                       mig(g3, 1, "1g.5gb", 14, 4864))))
    return inventory(*gpus, g3)


def config(mps=None, ts=None, **flags):
    sharing = {}
    if mps is not None:
        sharing["mps"] = {"resources": mps}
    if ts is not None:
        sharing["timeSlicing"] = {"resources": ts}
    return parse({"version": "v1", "sharing": sharing, **({"flags": flags} if flags else {})}, "s.yaml")


def test_gpu_resource_is_the_gpus_without_mig_with_the_device_plugins_defaults():
    d = resolve(node(), config(mps=[{"name": "nvidia.com/gpu", "replicas": 3}]))
    assert sorted(x.name for x in d.devices.values()) == ["0", "1", "2"]
    x = d.devices[uuid(1)]
    assert (x.strategy, x.replicas, x.active_thread_percentage, x.pinned_memory_limit_mib) == ("mps", 3, 33, 40960 // 3)
    assert x.replica_ids == tuple(f"{uuid(1)}::{i}" for i in range(3))
    assert {g.compute_mode for g in d.gpus.values()} == {"EXCLUSIVE_PROCESS"} and len(d.daemons) == 3
    one = resolve(node(), config(mps=[{"name": "gpu", "replicas": 1, "devices": [0]}]))
    assert one.devices[uuid(0)].replica_ids == (uuid(0),)        # one replica: the device itself
    assert one.devices[uuid(0)].active_thread_percentage == 100


def test_mps_on_mig_devices_sets_the_parents_mode():
    d = resolve(node(), config(mps=[{"name": "nvidia.com/mig-1g.5gb", "replicas": 2, "pinnedMemoryLimit": "1Gi"}]))
    assert sorted(x.name for x in d.devices.values()) == ["3:0", "3:1"]
    assert list(d.gpus) == [uuid(3)] and d.gpus[uuid(3)].compute_mode == "EXCLUSIVE_PROCESS"
    assert {x.pinned_memory_limit_mib for x in d.devices.values()} == {1024}
    single = resolve(node(), config(ts=[{"name": "gpu", "replicas": 2}], migStrategy="single"))
    assert sorted(x.name for x in single.devices.values()) == ["0", "1", "2", "3:0", "3:1"]


def test_device_lists_counts_and_legacy_mig_uuids():
    d = resolve(node(), config(ts=[{"name": "gpu", "replicas": 2, "devices": [2, uuid(0)], "interval": "Medium"}]))
    assert sorted(x.name for x in d.devices.values()) == ["0", "2"] and d.gpus[uuid(2)].interval == "Medium"
    assert sorted(x.name for x in resolve(node(), config(ts=[{"name": "gpu", "replicas": 2, "devices": 2}])
                                          ).devices.values()) == ["0", "1"]
    legacy = f"MIG-{uuid(3)}/14/0"
    d = resolve(node(), config(mps=[{"name": "mig-1g.5gb", "replicas": 2, "devices": [legacy]}]))
    assert [x.name for x in d.devices.values()] == ["3:1"]


@pytest.mark.parametrize("kw, says", [
    (dict(mps=[{"name": "nvidia.com/foo", "replicas": 2}]),
     "sharing.mps.resources[0].name: no resource 'nvidia.com/foo' on this node (it offers nvidia.com/gpu, "
     "nvidia.com/mig-1g.10gb"),
    (dict(mps=[{"name": "nvidia.com/mig-9g.99gb", "replicas": 2}]), "no resource 'nvidia.com/mig-9g.99gb'"),
    (dict(mps=[{"name": "gpu", "replicas": 49}]),
     "sharing.mps.resources[0].replicas: 49 replicas is more than the 48 MPS clients GPU 0"),
    (dict(mps=[{"name": "gpu", "replicas": 2, "devices": [3]}]),
     "GPU 3 (3) is not a nvidia.com/gpu device (MIG is enabled on it: share its MIG devices"),
    (dict(mps=[{"name": "gpu", "replicas": 2, "devices": [7]}]), "devices: no device '7' on this node"),
    (dict(mps=[{"name": "gpu", "replicas": 2, "devices": 4}]), "asks for the first 4 device(s) of nvidia.com/gpu, which has 3"),
    (dict(mps=[{"name": "gpu", "replicas": 2, "devices": [1]}], ts=[{"name": "gpu", "replicas": 2, "devices": [1]}]),
     "GPU 1 (" + uuid(1) + ") is shared with both MPS and time-slicing (sharing.mps.resources[0], "
     "sharing.timeSlicing.resources[0])"),
    (dict(ts=[{"name": "gpu", "replicas": 2}, {"name": "gpu", "replicas": 4, "devices": [0]}]),
     "GPU 0 (" + uuid(0) + ") is in two resources"),
    (dict(mps=[{"name": "mig-1g.5gb", "replicas": 2, "devices": ["3:0"]}],
          ts=[{"name": "mig-1g.5gb", "replicas": 2, "devices": ["3:1"]}]),
     "GPU 3: MIG device 3:0 is shared with mps and MIG device 3:1 with time-slicing; they need different "
     "compute modes"),
    (dict(ts=[{"name": "mig-1g.5gb", "replicas": 2, "interval": "Short"}]),
     "sharing.timeSlicing.resources[0].interval: MIG device 3:0 (NVIDIA A100-SXM4-40GB, compute capability 8.0) "
     "is a MIG device"),
    (dict(mps=[{"name": "gpu", "replicas": 2, "pinnedMemoryLimit": "41Gi"}]),
     "pinnedMemoryLimit: 41984 MiB is more than the 40960 MiB of GPU 0"),
])
def test_what_the_node_cannot_honour_is_refused(kw, says):
    with pytest.raises(ConfigError) as e:
        resolve(node(), config(**kw))
    assert says in e.value.message, e.value.message
    assert e.value.message.startswith("s.yaml: ")


def test_mps_support_and_client_limits_follow_the_compute_capability():
    assert max_clients("7.5") == 48 and max_clients("8.0") == 48 and max_clients("7.0") == 16
    old = inventory(dataclasses.replace(gpu(0, T4), compute_capability="3.0"))
    with pytest.raises(ConfigError) as e:
        resolve(old, config(mps=[{"name": "gpu", "replicas": 2}]))
    assert "does not support MPS (compute capability 3.5 or newer is needed)" in e.value.message
    volta = inventory(dataclasses.replace(gpu(0, T4), compute_capability="7.0"))
    with pytest.raises(ConfigError) as e:
        resolve(volta, config(mps=[{"name": "gpu", "replicas": 17}]))
    assert "more than the 16 MPS clients" in e.value.message
    assert resolve(volta, config(ts=[{"name": "gpu", "replicas": 100}])).devices   # time-slicing has no such limit


def test_replica_ids():
    assert replica_ids("GPU-a", 1) == ("GPU-a",) and replica_ids("GPU-a", 2) == ("GPU-a::0", "GPU-a::1")


def test_the_configuration_in_force_survives_devices_that_went_away():
    """A reconcile (strict=False) leaves out what the node lacks now and says so."""
    c = config(mps=[{"name": "mig-1g.5gb", "replicas": 2, "devices": ["3:0", "3:9"]}],
               ts=[{"name": "mig-3g.20gb", "replicas": 2}, {"name": "gpu", "replicas": 2, "devices": 5}])
    with pytest.raises(ConfigError):
        resolve(node(), c)
    d = resolve(node(), c, strict=False)
    assert sorted(x.name for x in d.devices.values()) == ["0", "1", "2", "3:0"]
    assert d.problems == ("sharing.mps.resources[0].devices: no device '3:9' on this node",
                          "sharing.timeSlicing.resources[1].devices: asks for the first 5 device(s) of "
                          "nvidia.com/gpu, which has 3")
