"""hooks/50-hostagent.json: podman runs hostagent's hook from a hooks directory for a
container that got the driver's files without CDI (bind mounts given by hand, as a device
plugin's mount list gives them), and only when the container asks for it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hostagent.cdi.refresh import generate
from hostagent.cdi.render import render
from hostagent.cdi.spec import SpecOptions
from hostagent.sim.driverroot import create_node
from hostagent.sim.platform import simulated_host

from .conftest import podman_run

HOOK = Path(__file__).resolve().parents[2] / "hooks" / "50-hostagent.json"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def spec_and_hooks_dir(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("container engines need root here")
    root = tmp_path_factory.mktemp("node")
    create_node(root, "t4x2")
    spec = generate(simulated_host(root), SpecOptions()).spec
    spec_path = root / "nvidia.com-gpu.json"
    spec_path.write_text(render(spec))
    spec_path.chmod(0o644)
    # The packaged entry, pointed at this checkout's interpreter and the test's spec.
    entry = json.loads(HOOK.read_text())
    args = entry["hook"]["args"]
    entry["hook"]["path"] = args[0] = sys.executable
    args[args.index("--from-spec") + 1] = str(spec_path)
    hooks_dir = tmp_path_factory.mktemp("hooks.d")
    (hooks_dir / HOOK.name).write_text(json.dumps(entry))
    return spec, hooks_dir


def mounts(spec) -> list[str]:
    flags = []
    for m in spec["containerEdits"]["mounts"]:
        flags += ["-v", f"{m['hostPath']}:{m['containerPath']}:ro"]
    return flags


def test_packaged_entry_is_a_version_1_hook_for_annotated_containers_only():
    entry = json.loads(HOOK.read_text())
    assert entry["version"] == "1.0.0" and entry["stages"] == ["createContainer"]
    assert entry["when"] == {"annotations": {r"^hostagent\.io/hook$": "^prepare$"}}
    hook = entry["hook"]
    assert hook["path"] == hook["args"][0] == "/opt/hostagent/bin/python" and "-I" in hook["args"]
    assert hook["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    assert 0 < hook["timeout"] <= 60


def test_annotated_container_gets_the_specs_links_and_cache(podman_image, spec_and_hooks_dir):
    spec, hooks_dir = spec_and_hooks_dir
    probe = f"readlink {LIBDIR}/libcuda.so.1; ldconfig -p | grep -c libcuda.so.1 || true"
    flags = ["--hooks-dir", str(hooks_dir), *mounts(spec)]
    annotated = podman_run(podman_image, "sh", "-c", probe,
                           flags=[*flags, "--annotation", "hostagent.io/hook=prepare"]).stdout.split()
    driver = next(m["containerPath"] for m in spec["containerEdits"]["mounts"] if "/libcuda.so." in m["containerPath"])
    assert annotated == [Path(driver).name, "1"]
    plain = podman_run(podman_image, "sh", "-c", probe, flags=flags).stdout.split()
    assert plain == ["0"]                      # no link, nothing cached: the hook did not run
