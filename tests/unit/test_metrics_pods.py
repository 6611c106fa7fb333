"""Pod attribution's pure part: which labels each device gets from what the kubelet reports."""

from hostagent.metrics.labels import merged
from hostagent.metrics.pods import attribute, uuid_resolver
from hostagent.plugins.podresources import Claim, Holding

GPU, MIG = "GPU-aaaa", "MIG-bbbb"
RESOLVE = uuid_resolver({GPU: (GPU,), MIG: (MIG,), "nvidia.com/gpu=0": (GPU,),
                         "hostagent.io/allocation=a-mig0:1": (MIG,)})


def test_device_plugin_ids_and_replicas():
    got = attribute([Holding("p1", "ns1", "c1", (GPU,)), Holding("p2", "ns2", "c2", (f"{MIG}::4",)),
                     Holding("nic", "net", "c", ("0000:3b:00.1", "0", "GPU-unknown"))], RESOLVE)
    assert got == {GPU: {"pod": "p1", "namespace": "ns1", "container": "c1"},
                   MIG: {"pod": "p2", "namespace": "ns2", "container": "c2"}}


def test_shared_devices_list_each_distinct_value():
    got = attribute([Holding("a", "ml", "main", (f"{GPU}::0",)), Holding("b", "ml", "main", (f"{GPU}::1",)),
                     Holding("c", "web", "side", (f"{GPU}::2",))], RESOLVE)
    assert got[GPU] == {"pod": "a,b,c", "namespace": "ml,web", "container": "main,side"}


def test_dra_claims_by_cdi_name():
    claim = Claim("big", "team", "gpu.nvidia.com", "node-1", "gpu-0", ("nvidia.com/gpu=0", "vendor.com/x=1"))
    lost = Claim("gone", "team", "gpu.nvidia.com", "node-1", "gpu-7", ("vendor.com/x=2",))
    mig = Claim("small", "team", "gpu.nvidia.com", "node-1", "gpu-0-mig-1", ("hostagent.io/allocation=a-mig0:1",))
    got = attribute([Holding("p", "team", "c", (), (claim, lost, mig))], RESOLVE)
    assert got[GPU] == {"pod": "p", "namespace": "team", "container": "c", "dra_claim_name": "big",
                        "dra_claim_namespace": "team", "dra_driver_name": "gpu.nvidia.com",
                        "dra_pool_name": "node-1", "dra_device_name": "gpu-0"}
    assert got[MIG]["dra_claim_name"] == "small" and set(got) == {GPU, MIG}


def test_merged_label_hooks():
    hook = merged(lambda: {GPU: {"allocation": "x"}}, None, lambda: {GPU: {"pod": "p"}, MIG: {"pod": "q"}})
    assert hook() == {GPU: {"allocation": "x", "pod": "p"}, MIG: {"pod": "q"}}
    one = lambda: {}  # noqa: E731
    assert merged(None, one) is one and merged(None) is None
