"""Each profile's topology against its cited matrix, as NVML answers it (hostagent topo) and
as the nvidia-smi stand-in prints it; and the daemon's topology, preferred allocations and
topology constraints on the DGX-1's hybrid cube-mesh.

Sources (docs/topology.md): DGX-1 rows 0-4 from the gist ashwin/e139748bdba15f5af63f0146d01ee4c3
(SOC printed as SYS since), the rest and the PCIe levels from go-gpuallocator's
NewDGX1VoltaNode; DGX A100 from NVIDIA/DCGM #149 and NVIDIA/nccl #1505 (GPUs 6-7 inferred);
HGX H100 from sgl-project/sglang #10070 and the kubernetes.recipes DGX H100 page.
"""

import os
import subprocess

import pynvml as N
import pytest

from hostagent.client import Request
from hostagent.devices import nvml_session, read_inventory
from hostagent.errors import ConflictError, UsageError
from hostagent.sim import control
from hostagent.sim.store import SimStore
from hostagent.devices.topology import bits, cpu_text
from hostagent.topology.matrix import text


from ..programs import script
from .agentd import make_root, running_agent

EXPECTED = {
    # rows of nvidia-smi topo -m, then each GPU's CPU Affinity and NUMA Affinity
    "dgx1-v100": ("""X   NV1 NV1 NV2 NV2 SYS SYS SYS
                     NV1 X   NV2 NV1 SYS NV2 SYS SYS
                     NV1 NV2 X   NV2 SYS SYS NV1 SYS
                     NV2 NV1 NV2 X   SYS SYS SYS NV1
                     NV2 SYS SYS SYS X   NV1 NV1 NV2
                     SYS NV2 SYS SYS NV1 X   NV2 NV1
                     SYS SYS NV1 SYS NV1 NV2 X   NV2
                     SYS SYS SYS NV1 NV2 NV1 NV2 X""",
                  ["0-19,40-59"] * 4 + ["20-39,60-79"] * 4, "00001111"),
    "dgx-a100": ("\n".join(" ".join("X" if a == b else "NV12" for b in range(8)) for a in range(8)),
                 ["48-63,176-191"] * 2 + ["16-31,144-159"] * 2 + ["112-127,240-255"] * 2 + ["80-95,208-223"] * 2,
                 "33117755"),
    "hgx-h100": ("\n".join(" ".join("X" if a == b else "NV18" for b in range(8)) for a in range(8)),
                 ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4, "00001111"),
    "hgx-h200": ("\n".join(" ".join("X" if a == b else "NV18" for b in range(8)) for a in range(8)),
                 ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4, "00001111"),
    "a30x4": ("X NV4 SYS SYS\nNV4 X SYS SYS\nSYS SYS X NV4\nSYS SYS NV4 X", ["0-31,64-95"] * 2 + ["32-63,96-127"] * 2,
              "0011"),
    "t4x2": ("X SYS\nSYS X", ["0-15,32-47", "16-31,48-63"], "01"),
    "mixed": ("X NV4 SYS\nNV4 X SYS\nSYS SYS X", ["0-35,72-107"] * 2 + ["36-71,108-143"], "001"),
    "l40s-pcie": ("""X    PIX  PXB  PXB  SYS  SYS  SYS  SYS
                     PIX  X    PXB  PXB  SYS  SYS  SYS  SYS
                     PXB  PXB  X    PIX  SYS  SYS  SYS  SYS
                     PXB  PXB  PIX  X    SYS  SYS  SYS  SYS
                     SYS  SYS  SYS  SYS  X    PIX  NODE NODE
                     SYS  SYS  SYS  SYS  PIX  X    NODE NODE
                     SYS  SYS  SYS  SYS  NODE NODE X    PIX
                     SYS  SYS  SYS  SYS  NODE NODE PIX  X""", ["0-31,64-95"] * 4 + ["32-63,96-127"] * 4, "00001111"),
}
# The PCIe levels under the NVLinks (topo -mp): go-gpuallocator's DGX-1 fixture; the DGX A100's
# GPU pairs share a switch with their NICs (GPU-NIC PXB in the listings).
PCIE = {
    "dgx1-v100": """X   PIX PHB PHB SYS SYS SYS SYS
                    PIX X   PHB PHB SYS SYS SYS SYS
                    PHB PHB X   PIX SYS SYS SYS SYS
                    PHB PHB PIX X   SYS SYS SYS SYS
                    SYS SYS SYS SYS X   PIX PHB PHB
                    SYS SYS SYS SYS PIX X   PHB PHB
                    SYS SYS SYS SYS PHB PHB X   PIX
                    SYS SYS SYS SYS PHB PHB PIX X""",
    "dgx-a100": "\n".join(" ".join("X" if a == b else "PXB" if a // 2 == b // 2 else "SYS" for b in range(8))
                          for a in range(8)),
}


def hostagent(*args):
    return subprocess.run([script("hostagent"), *map(str, args)], capture_output=True, text=True)


def cells(matrix: str) -> list[list[str]]:
    """The GPU rows of a topo -m listing (or of an expectation), cell by cell."""
    rows = [line.split("\t")[1:] if "\t" in line else line.split() for line in matrix.strip().splitlines()]
    return [[c.strip() for c in row] for row in rows]


def gpu_rows(listing: str) -> list[str]:
    return [line for line in listing.splitlines() if line.startswith("GPU")]


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_each_profile_answers_its_cited_matrix(make_node, profile):
    host, _ = make_node(profile)
    links, cpus, numa = EXPECTED[profile]
    ours = text(read_inventory(host), list(range(len(cpus))))
    smi = subprocess.run([str(host.root / "usr/bin/nvidia-smi"), "topo", "-m"], capture_output=True, text=True,
                         check=True).stdout
    assert smi == ours                          # what NVML says, as nvidia-smi prints it
    rows = [row.split("\t") for row in gpu_rows(ours)]
    n = len(cpus)
    assert [r[1:n + 1] for r in rows] == [[" X " if c == "X" else c for c in row] for row in cells(links)]
    assert [r[n + 1] for r in rows] == cpus and "".join(r[n + 2] for r in rows) == numa
    if profile in PCIE:
        pci = subprocess.run([str(host.root / "usr/bin/nvidia-smi"), "topo", "-mp"], capture_output=True,
                             text=True, check=True).stdout
        assert [r.split("\t")[1:n + 1] for r in gpu_rows(pci)] == \
            [[" X " if c == "X" else c for c in row] for row in cells(PCIE[profile])]


def test_nvlinks_lead_to_gpus_or_to_nvswitches_as_nvml_reports_them(make_node):
    host, _ = make_node("dgx1-v100")
    with nvml_session(host):
        h = [N.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        buses = [N.nvmlDeviceGetPciInfo_v3(x).busId for x in h]
        far = [N.nvmlDeviceGetNvLinkRemotePciInfo(h[0], link).busId for link in range(6)]
        assert far == [buses[1], buses[2], buses[3], buses[3], buses[4], buses[4]]   # NV1, NV1, NV2, NV2
        assert {N.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], link) for link in range(6)} == {N.NVML_NVLINK_DEVICE_TYPE_GPU}
        assert N.nvmlDeviceGetNvLinkVersion(h[0], 0) == N.NVML_NVLINK_VERSION_2_0
        with pytest.raises(N.NVMLError_InvalidArgument):
            N.nvmlDeviceGetNvLinkState(h[0], 6)                                   # V100: six links
        assert N.nvmlDeviceGetTopologyCommonAncestor(h[0], h[2]) == N.NVML_TOPOLOGY_HOSTBRIDGE
        assert len(N.nvmlDeviceGetTopologyNearestGpus(h[0], N.NVML_TOPOLOGY_SINGLE)) == 1
        assert len(N.nvmlSystemGetTopologyGpuSet(20)) == 4                        # CPU 20: socket 1
        assert N.nvmlDeviceGetP2PStatus(h[0], h[5], N.NVML_P2P_CAPS_INDEX_NVLINK) == N.NVML_P2P_STATUS_NOT_SUPPORTED
        assert N.nvmlDeviceGetP2PStatus(h[0], h[5], 0) == N.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        assert N.nvmlDeviceGetP2PStatus(h[0], h[4], N.NVML_P2P_CAPS_INDEX_ATOMICS) == N.NVML_P2P_STATUS_OK
    host, _ = make_node("hgx-h100")
    switches = sorted(p.name for p in host.proc("driver/nvidia-nvswitch/devices").iterdir())
    with nvml_session(host):
        h0 = N.nvmlDeviceGetHandleByIndex(0)
        kinds = {N.nvmlDeviceGetNvLinkRemoteDeviceType(h0, link) for link in range(18)}
        far = [N.nvmlDeviceGetNvLinkRemotePciInfo(h0, link).busId.lower() for link in range(18)]
        assert kinds == {N.NVML_NVLINK_DEVICE_TYPE_SWITCH}
        assert [far.count(f"0000{s}") for s in switches] == [5, 4, 4, 5]          # 18 links to 4 NVSwitches
        socket = N.nvmlDeviceGetCpuAffinityWithinScope(h0, 4, N.NVML_AFFINITY_SCOPE_SOCKET)
        assert cpu_text(bits(socket)) == "0-55,112-167"                          # one NUMA node a socket
    host, _ = make_node("t4x2")
    with nvml_session(host):
        with pytest.raises(N.NVMLError_NotSupported):
            N.nvmlDeviceGetNvLinkState(N.nvmlDeviceGetHandleByIndex(0), 0)


def test_the_pcie_root_is_read_as_kubernetes_derives_it(make_node):
    host, _ = make_node("t4x2")
    assert [g.pcie_root for g in read_inventory(host).gpus] == ["pci0000:3a", "pci0000:d7"]
    link = host.sys("bus/pci/devices") / "0000:3b:00.0"
    assert os.readlink(link) == "../../../devices/pci0000:3a/0000:3a:01.0/0000:3b:00.0"
    assert (link / "driver").resolve().name == "nvidia" and (link / "numa_node").read_text() == "0\n"


def test_a_gpu_whose_topology_nvml_refuses_has_unknown_links(make_node):
    host, store = make_node("l40s-pcie")
    control.set_topology_support(store, 5, False)
    topology = read_inventory(host).topology
    assert topology.gpu(5).error == "nvmlDeviceGetTopologyCommonAncestor: Not Supported"
    assert topology.gpu(5).nvlinks is None and topology.gpu(4).error is None
    assert {link.pcie for link in topology.links if 5 in link.gpus} == {"unknown"}
    assert topology.link(4, 6).code == "NODE"
    r = hostagent("--simulate", host.root, "topo", "4", "5", "6")
    assert r.returncode == 0 and "GPU 5's links are unknown (nvmlDeviceGetTopologyCommonAncestor" in r.stderr
    assert gpu_rows(r.stdout)[0].split("\t")[1:4] == [" X ", "N/A", "NODE"]
    r = hostagent("--simulate", host.root, "topo", "8")
    assert r.returncode == 2 and "no GPU '8' on this node" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def dgx1():
    with running_agent(make_root("dgx1-v100")) as agent:
        yield agent


def test_the_daemon_serves_the_topology_and_refuses_unknown_gpus(dgx1):
    with dgx1.client() as c:
        doc = c.topology()
        assert len(doc["gpus"]) == 8 and len(doc["pairs"]) == 28 and doc["legend"]["NV#"]
        assert {tuple(p["gpus"]): (p["link"], p["nvlinks"], p["pcie"]) for p in doc["pairs"]}[0, 3] == ("NV2", 2, "PHB")
        assert [g["pcie_root"] for g in c.topology([4, c.devices()["gpus"][7]["uuid"]])["gpus"]] == ["pci0000:80"] * 2
        with pytest.raises(UsageError) as e:
            c.topology([0, 9])
        assert e.value.code == "unknown_device" and e.value.details["device"] == "9"
        response = dgx1.client().transport.handle_request(Request("GET", "/v1/topology?gpus=nope", None, {}))
        assert response.status == 422 and response.json()["code"] == "unknown_device"


def test_preferred_allocations_and_constraints_follow_the_cube_mesh(dgx1):
    with dgx1.client() as c:
        uuid = [g["uuid"] for g in c.devices()["gpus"]]
        # go-gpuallocator's "Prefer dual NVLINK cross socket": 0 and 4 (NV2), not 0 and 1 (NV1).
        assert sorted(c.preferred_allocation([uuid[i] for i in (0, 1, 4)], 2)) == sorted([uuid[0], uuid[4]])
        with pytest.raises(ConflictError) as e:     # the cube-mesh's NVLink cliques are of four
            c.allocate("five", [{"constraints": {"type": "gpu", "links": "nvlink"}, "count": 5}])
        assert e.value.code == "insufficient_devices" and len(e.value.details["best"]) == 5
        assert "SYS" in e.value.message and "links: nvlink" in e.value.message
        a = c.allocate("clique", [{"constraints": {"type": "gpu", "links": "nvlink"}, "count": 4}])
        got = sorted(uuid.index(u) for u in a["devices"])
        assert got in ([0, 1, 2, 3], [4, 5, 6, 7])
        b = c.allocate("root", [{"constraints": {"type": "gpu", "pcie_root": "same"}, "count": 2}])
        rest = sorted(uuid.index(u) for u in b["devices"])
        assert rest[0] // 4 == rest[1] // 4 and not set(rest) & set(got)
        for alloc in ("clique", "root"):
            c.release(alloc)


def test_a_gpu_of_unknown_topology_makes_the_daemon_prefer_by_numa_and_say_why(dgx1):
    store = SimStore(dgx1.root)
    control.set_topology_support(store, 4, False)
    try:
        with dgx1.client() as c:
            c.refresh()
            uuid = [g["uuid"] for g in c.devices()["gpus"]]
            assert sorted(c.preferred_allocation([uuid[i] for i in (0, 1, 4)], 2)) == sorted([uuid[0], uuid[1]])
            assert "GPU topology unknown (GPU 4: nvmlDeviceGetTopologyCommonAncestor: Not Supported)" in dgx1.log()
            gpu4 = c.device(uuid[4])["topology"]
            assert gpu4["error"] == "nvmlDeviceGetTopologyCommonAncestor: Not Supported" and gpu4["nvlinks"] is None
            assert {(p["link"], p["nvlinks"]) for p in gpu4["peers"]} == {("unknown", None)}
            assert c.device(uuid[0])["topology"]["peers"][3] == {
                "index": 4, "uuid": uuid[4], "link": "unknown", "nvlinks": None, "pcie": "unknown"}
            # Free: 0, 4 and 5. NVLink joins 0-4 (NV2) and 4-5 (NV1), but GPU 4's links are
            # not known now: no pair qualifies.
            c.allocate("others", [{"device": str(i)} for i in (1, 2, 3, 6, 7)])
            try:
                with pytest.raises(ConflictError) as e:
                    c.allocate("pair", [{"constraints": {"type": "gpu", "links": "nvlink"}, "count": 2}])
                assert e.value.code == "insufficient_devices" and "(0-5 SYS)" in e.value.message
            finally:
                c.release("others")
    finally:
        control.set_topology_support(store, 4, True)
        with dgx1.client() as c:
            c.refresh()
