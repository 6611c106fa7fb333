"""Nodes with another driver than their profile's: what a driver branch changes (a GPU's
memory, which MIG profiles exist, the CUDA version) and what it must not change for
hostagent (profile names, the bundled and mig-parted configs)."""

import contextlib
import io

import pytest

from hostagent.cli.main import main
from hostagent.devices import read_inventory
from hostagent.mig import service
from hostagent.mig.planner import PlanError
from hostagent.mig.spec import parse_spec
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host
from tests.rootneeds import GPU_CHANGES

pytestmark = GPU_CHANGES

OLD = "495.29.05"


def node(tmp_path, profile, version=None):
    root = tmp_path / f"{profile}-{version or 'default'}"
    create_node(root, profile, driver_version=version)
    return simulated_host(root)


def test_an_older_branch_reports_other_memory_and_profiles_under_the_same_names(tmp_path):
    new, old = (read_inventory(node(tmp_path, "mixed", v)) for v in (None, OLD))
    assert (old.driver_version, old.cuda_driver_version) == (OLD, "11.5")
    a100_new, a100_old = new.gpus[0], old.gpus[0]
    # nvidia-smi shows an A100-SXM4-80GB with 81920 MiB on R535+, 81251 MiB on 495.29.05.
    assert (a100_new.memory_mib, a100_old.memory_mib) == (81920, 81251)
    names_new = [p.name for p in a100_new.mig.profiles]
    names_old = [p.name for p in a100_old.mig.profiles]
    # mig-parted's names for this GPU on both (3g.40gb, where Slurm's floor of 40192 MiB
    # says 3g.39gb); 1g.20gb only from R525.
    assert names_new == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert names_old == [n for n in names_new if n != "1g.20gb"]


@pytest.mark.parametrize("version", [None, OLD])
def test_bundled_and_mig_parted_configs_apply_on_either_branch(tmp_path, version):
    host = node(tmp_path, "mixed", version)
    service.apply(host, None, "all-balanced")
    counts = {g.index: g for g in read_inventory(host).gpus if g.mig_enabled}
    assert [len(g.mig.devices) for g in counts.values()] == [4, 4]
    parted = parse_spec("version: v1\nmig-configs:\n  all-3g.40gb:\n    - devices: [0, 1]\n"
                        "      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 2}\n")
    service.apply(host, parted, "all-3g.40gb")
    service.check(host, parted, "all-3g.40gb")
    later = parse_spec("version: v1\nmig-configs:\n  c:\n    - devices: [0]\n      mig-enabled: true\n"
                       "      mig-devices: {\"1g.20gb\": 1}\n")
    if version == OLD:                       # a profile the branch does not have is named
        with pytest.raises(PlanError, match="no MIG profile '1g.20gb'"):
            service.plan(host, later, "c")
    else:
        service.apply(host, later, "c")


def test_a30_media_profiles_follow_the_branch(tmp_path):
    names = {v: [p.name for p in read_inventory(node(tmp_path, "a30x4", v)).gpus[0].mig.profiles]
             for v in ("460.32.03", "470.57.02", None)}
    assert names["460.32.03"] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert names["470.57.02"] == ["1g.6gb", "1g.6gb+me", "2g.12gb", "4g.24gb"]       # +me from R470
    assert names[None] == ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]  # 2g +me from R525
    host = node(tmp_path, "a30x4")
    spec = parse_spec("version: v1\nmig-configs:\n  c:\n    - devices: all\n      mig-enabled: true\n"
                      "      mig-devices: {\"2g.12gb+me\": 1, \"2g.12gb\": 1}\n")
    service.apply(host, spec, "c")
    dev = next(d for d in read_inventory(host).gpus[0].mig.devices if d.profile == "2g.12gb+me")
    assert (dev.memory_mib, dev.multiprocessors, dev.decoders, dev.jpegs, dev.ofas) == (11968, 28, 2, 1, 1)


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_sim_create_with_a_driver_version(tmp_path):
    code, out, err = cli("sim", "create", "--profile", "dgx-a100", "--root", str(tmp_path / "n"),
                         "--driver-version", OLD)
    assert code == 0 and f"(driver {OLD})" in out, err
    root = tmp_path / "n"
    assert (root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{OLD}").is_file()
    assert f"Kernel Module  {OLD}" in (root / "proc/driver/nvidia/version").read_text()
    code, out, _ = cli("--simulate", str(root), "node", "-o", "json")
    assert code == 0 and f'"driver_version": "{OLD}"' in out and '"cuda_driver_version": "11.5"' in out
    for bad, says in (("5.1", "is not an NVIDIA driver version"), ("440.100", "older than R450")):
        code, _, err = cli("sim", "create", "--root", str(tmp_path / bad), "--driver-version", bad)
        assert code == 2 and says in err and not (tmp_path / bad).exists()
