"""One device model: ``hostagent devices|node -o json`` without a daemon and ``GET
/v1/devices|node`` from one say the same of every simulated profile, in the same words, and
both are what the API's components describe; each GPU's topology is the node's (``hostagent
topo``), seen from that GPU."""

import json

import pytest

from hostagent import model
from hostagent.api.schema import document
from hostagent.cli.main import main
from hostagent.schemas import Draft202012
from hostagent.sim import catalog
from hostagent.sim.node import MIG_ENABLE

from .agentd import AgentProcess, make_root

NODE_DAEMON_FIELDS = ("revision", "inventory", "driver", "cdi", "agent", "checkpoint", "vfio")


def validator(component: str):
    doc = document()
    root = {"$schema": doc["jsonSchemaDialect"], "components": doc["components"],
            "$ref": f"#/components/schemas/{component}"}
    return Draft202012(root)


def give_mig_devices(store) -> None:
    """The first MIG-capable GPU gets MIG with a plain instance, a compute instance smaller
    than its GPU instance and a GPU instance without any; the second, MIG and no instance."""
    facts = store.facts
    capable = [i for i, g in enumerate(store.read().gpus) if facts.skus[g.sku].mig is not None]
    with store.mutate() as s:
        for i in capable[:2]:
            s.set_mig_mode(facts, i, MIG_ENABLE)
            if s.gpus[i].mig_current != MIG_ENABLE:
                s.reset_gpu(i)
        if not capable:
            return
        i = capable[0]
        profiles = facts.skus[s.gpus[i].sku].mig.gi_profiles
        half = next(p for p in profiles if p.slices == 2 and len(p.ci_profiles) > 1)
        small = next(p for p in profiles if p.slices == 1)
        gi = s.create_gi(facts, i, half.id)
        s.create_ci(facts, i, gi.id, half.ci_profiles[0].id)
        gi = s.create_gi(facts, i, small.id)
        s.create_ci(facts, i, gi.id, small.ci_profiles[0].id)
        s.create_gi(facts, i, small.id)


def cli_json(capsys, root, *argv) -> dict:
    capsys.readouterr()
    assert main(["--simulate", str(root), *argv, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("profile", catalog.profile_names())
def test_cli_and_api_render_every_profile_alike_and_as_the_schema_says(profile, capsys):
    root = make_root(profile)
    from hostagent.sim.store import SimStore
    give_mig_devices(SimStore(root))
    cli_devices = cli_json(capsys, root, "devices", "--profiles")
    cli_node = cli_json(capsys, root, "node")
    cli_topology = cli_json(capsys, root, "topo")
    agent = AgentProcess(root).start()
    try:
        with agent.client() as c:
            api_devices = c.devices(profiles=True)
            api_node = c.node()
    finally:
        agent.stop()
        agent.cleanup()

    validator("DeviceList").validate(cli_devices)
    validator("DeviceList").validate(api_devices)
    validator("Node").validate(cli_node)
    validator("Node").validate(api_node)
    if any(g.sku.mig for g in catalog.load_profile(profile).gpus):
        assert cli_devices["mig_devices"], "the layout gave MIG devices"

    # Without a daemon, what only it knows is absent (never renamed), and health unknown.
    devices = [*cli_devices["gpus"], *cli_devices["mig_devices"]]
    assert "revision" not in cli_devices
    assert all(d["health"] == model.UNKNOWN_HEALTH for d in devices)
    assert not any(set(model.DAEMON_FIELDS) & set(d) for d in devices)
    served = [*api_devices["gpus"], *api_devices["mig_devices"]]
    assert all(set(model.DAEMON_FIELDS) <= set(d) for d in served)
    assert all(d["health"]["state"] == "healthy" for d in served)

    def inventory_part(listing):
        strip = (*model.DAEMON_FIELDS, "health")
        return {"gpus": [{k: v for k, v in d.items() if k not in strip} for d in listing["gpus"]],
                "mig_devices": [{k: v for k, v in d.items() if k not in strip} for d in listing["mig_devices"]],
                "unreadable": listing["unreadable"], "unread": listing["unread"]}
    assert inventory_part(cli_devices) == inventory_part(api_devices)
    assert {k: v for k, v in api_node.items() if k not in NODE_DAEMON_FIELDS} == cli_node
    assert set(NODE_DAEMON_FIELDS) <= set(api_node)
    same_topology_as_the_matrix(cli_devices, cli_topology)


def same_topology_as_the_matrix(listing, matrix) -> None:
    """Each GPU's ``topology`` is its row of ``hostagent topo -o json``: its place, and each
    pair it is in, seen from it; a MIG device sits where its GPU does."""
    gpus = {g["index"]: g for g in listing["gpus"]}
    pairs = {tuple(p["gpus"]): p for p in matrix["pairs"]}
    for row in matrix["gpus"]:
        gpu = gpus[row["index"]]
        assert gpu["pcie_root"] == row["pcie_root"] and gpu["numa_node"] == row["numa_node"]
        assert {k: v for k, v in gpu["topology"].items() if k != "peers"} == \
            {k: row[k] for k in ("cpu_affinity", "numa_affinity", "nvlinks", "nvswitch_links", "error")}
        peers = gpu["topology"]["peers"]
        assert [p["index"] for p in peers] == sorted(set(gpus) - {gpu["index"]})
        for p in peers:
            pair = pairs[min(gpu["index"], p["index"]), max(gpu["index"], p["index"])]
            assert (p["link"], p["nvlinks"], p["pcie"]) == (pair["link"], pair["nvlinks"], pair["pcie"])
            assert p["uuid"] == gpus[p["index"]]["uuid"]
    for d in listing["mig_devices"]:
        parent = gpus[d["parent_index"]]
        assert (d["numa_node"], d["pcie_root"]) == (parent["numa_node"], parent["pcie_root"])


def test_a_gpus_document_names_its_nvlink_peers_and_pcie_paths_as_published(make_node, capsys):
    """The DGX-1's GPU 0 (the gist ashwin/e139748bdba15f5af63f0146d01ee4c3, SOC printed as SYS
    since; PCIe levels from go-gpuallocator's NewDGX1VoltaNode)."""
    host, _ = make_node("dgx1-v100")
    gpu0 = cli_json(capsys, host.root, "devices")["gpus"][0]
    assert gpu0["numa_node"] == 0 and gpu0["pcie_root"] and gpu0["topology"]["cpu_affinity"] == "0-19,40-59"
    peers = gpu0["topology"]["peers"]
    assert {p["index"]: p["nvlinks"] for p in peers if p["nvlinks"]} == {1: 1, 2: 1, 3: 2, 4: 2}
    assert [p["link"] for p in peers] == ["NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert [p["pcie"] for p in peers] == ["PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]
    assert gpu0["topology"]["nvlinks"] == 6 and gpu0["topology"]["error"] is None
