"""Generated specs for every simulated profile, compared with the checked-in golden files.

Set HOSTAGENT_UPDATE_GOLDEN=1 to rewrite them after an intended change.
"""

import json
import os
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate
from hostagent.cdi.render import render
from hostagent.cdi.spec import SpecOptions
from hostagent.cdi.validate import validate_spec
from hostagent.devices import read_inventory
from hostagent.sim import catalog
from hostagent.sim.driverroot import create_node
from hostagent.sim.files import add_drm_nodes, create_cap_nodes
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.platform import simulated_host


GOLDEN = Path(__file__).parents[2] / "cdi-specs"
MAJORS = (511, 510)     # fixed so the files do not depend on this host's /proc/devices
# dgx-a100-mig: MIG devices beside whole GPUs; t4x2-drm: GPUs with DRM (card and render) nodes.
CASES = catalog.profile_names() + ["dgx-a100-mig", "t4x2-drm"]


def build(root: Path, case: str) -> dict:
    store = create_node(root, case.removesuffix("-mig").removesuffix("-drm"), dynamic_majors=MAJORS)
    host = simulated_host(root)
    if case == "t4x2-drm":
        for card, gpu in enumerate(read_inventory(host).gpus, start=1):
            add_drm_nodes(root, store.facts, gpu.sysfs_bus_id, card)
    if case == "dgx-a100-mig":
        # GPU 0: 7x 1g.5gb; GPU 1: 3g.20gb + 2x 1c.3g.20gb shared GI; the rest whole.
        with store.mutate() as s:
            for gpu in (0, 1):
                s.set_mig_mode(store.facts, gpu, MIG_ENABLE)
                s.reset_gpu(gpu)
            for start in range(7):
                gi = s.create_gi(store.facts, 0, 19, (start, 1))
                s.create_ci(store.facts, 0, gi.id, 0)
            gi = s.create_gi(store.facts, 1, 9, (0, 4))
            s.create_ci(store.facts, 1, gi.id, 2)
            gi = s.create_gi(store.facts, 1, 9, (4, 4))
            s.create_ci(store.facts, 1, gi.id, 0)
            s.create_ci(store.facts, 1, gi.id, 0)
        create_cap_nodes(store.root, store.facts)
    return generate(host, SpecOptions(hook_interpreter="/usr/bin/python3",
                                                         hook_import_path="/usr/lib/python3/dist-packages")).spec


def as_on_real_host(spec: dict, root: Path) -> dict:
    """The spec the same node would get with the host root at /."""
    text = json.dumps(spec).replace(json.dumps(str(root))[1:-1], "")
    spec = json.loads(text)
    for edits in [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"]]:
        for node in edits.get("deviceNodes", []):
            if node.get("hostPath") == node["path"]:
                del node["hostPath"]
        for mount in edits.get("mounts", []):
            mount["hostPath"] = mount["hostPath"] or "/"
    return spec


@pytest.mark.parametrize("case", CASES)
def test_generated_spec_matches_golden(tmp_path, case):
    spec = as_on_real_host(build(tmp_path, case), tmp_path)
    assert validate_spec(spec) == []
    golden = GOLDEN / f"{case}.json"
    text = render(spec)
    if os.environ.get("HOSTAGENT_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.read_text() == text, f"regenerate with HOSTAGENT_UPDATE_GOLDEN=1 if intended: {golden}"


def test_golden_files_exist_for_every_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CASES)
