"""Spec files hostagent did not write, however broken, are skipped with a warning naming
them, as the engines' CDI caches skip them: ``cdi list`` lists the rest, ``cdi validate``
gives every file its verdict, and the runtime shim still injects devices from the good
files. Never a traceback, never a hang."""

import json
import os
import subprocess
import sys

import pytest

from .test_runtime_shim import bundle, called, run, shim  # noqa: F401 - the fixture

GOOD = {"cdiVersion": "0.5.0", "kind": "acme.com/nic",
        "devices": [{"name": "n0", "containerEdits": {"env": ["NIC=0"]}}]}


def bad_files(folder) -> dict[str, str]:
    """File name -> what the warning about it must say. Their shapes: every kind of value
    where each field of the structure should be, wrong encodings, nesting, special files."""
    def spec(**over):
        return json.dumps({**GOOD, "kind": "bad.com/x", **over})
    texts = {
        "version-word.json": (spec(cdiVersion="abc"), "not a known CDI version"),
        "version-float.json": (spec(cdiVersion=0.5), "not a known CDI version"),
        "version-list.json": (spec(cdiVersion=["1.0.0"]), "not a known CDI version"),
        "version-map.yaml": ("cdiVersion: {a: 1}\nkind: bad.com/x\ndevices: []\n", "not a known CDI version"),
        "devices-string.json": (spec(devices="n0"), "at least one device"),
        "devices-strings.json": (spec(devices=["n0"]), "devices[0]: not a mapping"),
        "edits-list.json": (spec(devices=[{"name": "n0", "containerEdits": ["env"]}]), "not a mapping"),
        "env-string.json": (spec(containerEdits={"env": "A=1"}), "env: must be a list"),
        "node-number.json": (spec(containerEdits={"deviceNodes": [{"path": 7}]}), "is not a string"),
        "rdt-list.json": (spec(cdiVersion="1.1.0", containerEdits={"intelRdt": ["x"]}), "intelRdt: not a mapping"),
        "net-none.json": (spec(cdiVersion="1.1.0", containerEdits={"netDevices": [None]}), "not a mapping"),
        "deep.json": ('{"cdiVersion": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        "deep.yaml": ("cdiVersion: " + "[" * 100_000 + "\n", "nested more than 64 levels"),
        "empty.json": ("", "no spec data"),
        "garbage.yaml": ("\x00\x01: [", "not valid YAML"),
        "latin1.json": (None, "not UTF-8"),
    }
    for name, (text, _) in texts.items():
        if text is None:
            (folder / name).write_bytes(b'{"kind": "caf\xe9"}')
        else:
            (folder / name).write_text(text)
    with open(folder / "huge.json", "wb") as f:
        f.truncate((16 << 20) + 1)
    os.mkfifo(folder / "fifo.json")
    (folder / "folder.json").mkdir()
    expected = {name: why for name, (_, why) in texts.items()}
    expected["huge.json"] = "more than the"
    return expected           # the FIFO and the folder are not regular files: not read at all


@pytest.fixture
def node_root(tmp_path):
    root = tmp_path / "root"
    folder = root / "etc/cdi"
    folder.mkdir(parents=True)
    (folder / "acme.json").write_text(json.dumps(GOOD))
    return root, folder, bad_files(folder)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_cdi_list_lists_the_good_devices_and_warns_for_each_bad_file(node_root):
    root, folder, expected = node_root
    done = cli("--simulate", root, "cdi", "list", "-o", "json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert [d["name"] for d in json.loads(done.stdout)["devices"]] == ["acme.com/nic=n0"]
    warnings = done.stderr.splitlines()
    assert all(line.startswith("hostagent: warning: ") for line in warnings)
    for name, why in expected.items():
        assert any(f"{folder / name}" in w and why in w for w in warnings), (name, why, warnings)


def test_cdi_validate_gives_every_file_its_verdict(node_root):
    root, folder, expected = node_root
    names = sorted(expected) + ["fifo.json", "folder.json", "acme.json"]
    done = cli("cdi", "validate", *[folder / n for n in names])
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr == ""
    for name in names:
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"{folder / name}: ")]
        assert lines, name
        if name == "acme.json":
            assert lines == [f"{folder / name}: valid"]
        else:
            assert f"{folder / name}: valid" not in lines
            assert any(expected.get(name, "not a regular file") in line for line in lines), (name, lines)


def test_the_shim_injects_devices_from_the_good_files(shim):  # noqa: F811 - the fixture
    front, tmp_path = shim
    bad_files(tmp_path / "cdi")
    b = bundle(tmp_path, annotations={"cdi.k8s.io/gpu": "example.com/gpu=0"})
    proc = run(front, "create", "--bundle", str(b), "c1")
    assert proc.returncode == 0, proc.stderr
    assert called(tmp_path) == ["create", "--bundle", str(b), "c1"]
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["linux"]["devices"] == [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
