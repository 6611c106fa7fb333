"""How the installer runs the host's programs: as they are on /, chrooted into another root,
directly for a simulated node's own tools, and never a chrooted modprobe for a simulated node."""

import pytest

from hostagent.driver.system import Runner
from hostagent.errors import HostagentError, NotFoundError
from hostagent.hostroot import HostRoot
from hostagent.sim.platform import simulated_host


def program(root, rel, text="#!/bin/sh\n"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def test_commands_run_in_the_host_root(tmp_path):
    program(tmp_path, "usr/bin/apt-get")
    program(tmp_path, "usr/bin/nvidia-smi", "#!/usr/bin/python3\n# Stand-in for the NVIDIA tool of this "
            "name, backed by the simulated node.\n")
    program(tmp_path, "usr/sbin/modprobe")
    real = Runner(HostRoot(root=tmp_path))                       # a host mounted elsewhere
    assert real.argv(["apt-get", "install", "x"]) == ["chroot", str(tmp_path), "/usr/bin/apt-get", "install", "x"]
    assert real.argv(["modprobe", "nvidia"]) == ["chroot", str(tmp_path), "/usr/sbin/modprobe", "nvidia"]
    sim = Runner(simulated_host(tmp_path))
    assert sim.argv(["nvidia-smi", "-L"]) == [str(tmp_path / "usr/bin/nvidia-smi"), "-L"]
    assert sim.argv(["apt-get", "update"])[:2] == ["chroot", str(tmp_path)]
    with pytest.raises(HostagentError, match="has no modprobe of its own"):
        sim.argv(["modprobe", "nvidia"])                         # not the simulator's: refused
    with pytest.raises(NotFoundError, match="dnf not found on the host"):
        sim.argv(["dnf", "install"])


def test_on_the_real_root_programs_run_as_they_are():
    runner = Runner(HostRoot())
    sh = runner.find("sh")
    assert sh is not None and runner.argv(["sh", "-c", "true"]) == [sh, "-c", "true"]
    result = runner.run(["sh", "-c", "echo out; echo err >&2; exit 3"], check=False)
    assert (result.code, result.out, result.err, result.last_line()) == (3, "out\n", "err\n", "err")
