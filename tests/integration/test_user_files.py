"""Files users name on the command line (MIG configs, hooks files, engine configs, CDI
specs, hostagent's own config): each must be a regular file of bounded size, read as its
format says (JSON as JSON, however Go's encoder indented it), and any other thing there (a
FIFO, a directory, a device, a document nested thousands deep, one too big) gets one line
and a non-zero exit, never a hang or a traceback. Commands run as processes, each with a
deadline, so a read that blocks fails the test instead of hanging it."""

import json
import os
import subprocess
import sys
import threading

import pytest

from hostagent.errors import ConfigError, NotFoundError, StateError
from hostagent.fileio import MAX_USER_FILE
from hostagent.mig.hooks import HookSpec, load_hooks
from hostagent.mig.spec import load_spec, parse_spec

CONFIG = {"version": "v1", "mig-configs": {
    "balanced": [{"devices": "all", "mig-enabled": True,
                  "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}],
    "off": [{"devices": [0, 1], "mig-enabled": False}]}}
HOOKS = {"version": "v1", "hooks": {"apply-start": [{"command": "/bin/true", "args": ["a"], "workdir": "/"}]}}


def cli(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "hostagent.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def one_line_error(done, *needles):
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


@pytest.mark.parametrize("dump", [
    lambda d: json.dumps(d, indent="\t"),                      # Go's json.MarshalIndent(v, "", "\t")
    lambda d: json.dumps(d, indent="\t").replace("\n", "\r\n"),
    lambda d: json.dumps(d, separators=(",", ":")),
    lambda d: "\n\t " + json.dumps(d, indent=2) + "\n\n",
])
def test_json_files_are_read_as_json_however_indented(tmp_path, dump):
    path = tmp_path / "config.json"
    path.write_text(dump(CONFIG))
    assert load_spec(str(path)).to_dict() == parse_spec(json.dumps(CONFIG)).to_dict()
    hooks = tmp_path / "hooks.json"
    hooks.write_text(dump(HOOKS))
    assert load_hooks(str(hooks)).hooks["apply-start"] == (HookSpec("/bin/true", ("a",), (), "/"),)


def test_invalid_json_says_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n\t"version": "v1",\n\t"mig-configs": {\n}')
    with pytest.raises(ConfigError, match="not valid JSON: Expecting"):
        load_spec(str(path))


def deep(kind: str, depth: int = 100_000) -> str:
    if kind == "json":
        return '{"version": "v1", "mig-configs": {"c": ' + "[" * depth + "]" * depth + "}}"
    if kind == "yaml-flow":
        return "version: v1\nmig-configs:\n  c: " + "[" * depth + "]" * depth + "\n"
    return "version: v1\nmig-configs:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 1500))


@pytest.mark.parametrize("kind", ["json", "yaml-flow", "yaml-block"])
def test_deeply_nested_documents_are_one_line_errors(tmp_path, kind):
    from hostagent.config import load_config
    path = tmp_path / "doc.yaml"
    path.write_text(deep(kind))
    for reader in (load_spec, load_hooks, load_config):
        e = raised(reader, str(path))
        assert isinstance(e, ConfigError) and "nested" in e.what and e.where == str(path), (reader, e)


def test_a_deeply_nested_config_on_the_command_line_is_one_line(tmp_path, make_node):
    host, _ = make_node("a30x4")
    path = tmp_path / "mig.json"
    path.write_text(deep("json"))
    one_line_error(cli("--simulate", host.root, "mig", "plan", "-c", "c", "-f", path),
                   f"{path}: nested more than 64 levels deep")


def special_files(tmp_path):
    """Names that are not regular files: a FIFO (a plain open would block forever), a
    directory, a character device, a symlink to a FIFO, a file over the size limit."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to("fifo")       # relative: read in a host root, an absolute one is the host's
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(MAX_USER_FILE + 1)
    return {"fifo": ("FIFO", tmp_path / "fifo"), "folder": ("directory", tmp_path / "folder"),
            "device": ("character device", "/dev/null"), "link": ("FIFO", tmp_path / "link"),
            "big": ("more than the", big)}


def raised(fn, *args):
    """What ``fn(*args)`` raised, run on a thread with a deadline: a read that blocks
    fails the test instead of hanging it."""
    box = []

    def call():
        try:
            fn(*args)
            box.append(None)
        except BaseException as e:      # noqa: B036 - reported to the test
            box.append(e)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(20)
    assert box, f"{fn.__name__}{args} blocked"
    return box[0]


def test_special_files_are_refused_by_every_reader(tmp_path):
    from hostagent.config import load_config
    from hostagent.hostroot import HostRoot
    from hostagent.runtime.files import read_one
    host = HostRoot(root=tmp_path)
    for name, (kind, path) in special_files(tmp_path).items():
        for reader in (load_spec, load_hooks, load_config):
            e = raised(reader, str(path))
            assert isinstance(e, ConfigError) and kind in e.what and str(path) == e.where, (reader, name, e)
        if name != "device":
            e = raised(read_one, host, "/" + os.path.relpath(path, tmp_path))
            assert isinstance(e, ConfigError) and kind in e.what, (name, e)


def test_a_fifo_named_on_the_command_line_is_one_line_and_changes_nothing(tmp_path, make_node):
    host, _ = make_node("a30x4")
    root = tmp_path / "root"
    (root / "etc/docker").mkdir(parents=True)
    os.mkfifo(root / "etc/docker/daemon.json")
    os.mkfifo(tmp_path / "mig.yaml")
    one_line_error(cli("--simulate", host.root, "mig", "apply", "-c", "x", "-f", tmp_path / "mig.yaml"),
                   "MIG config file is a FIFO, not a regular file")
    one_line_error(cli("--simulate", root, "runtime", "configure", "--runtime", "docker"),
                   "daemon.json: is a FIFO, not a regular file")
    assert os.listdir(root / "etc/docker") == ["daemon.json"]


def test_special_files_given_to_cdi_validate_are_reported_and_the_next_file_checked(tmp_path):
    names = []
    for kind, path in special_files(tmp_path).values():
        link = tmp_path / f"{os.path.basename(path)}-{len(names)}.json"
        link.symlink_to(path)
        names.append((kind, link))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"cdiVersion": "0.3.0", "kind": "acme.com/gpu",
                                "devices": [{"name": "a0", "containerEdits": {"env": ["A=1"]}}]}))
    done = cli("cdi", "validate", *[p for _, p in names], good)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    for kind, path in names:
        assert f"{path}: " in done.stdout and kind in done.stdout.split(f"{path}: ", 1)[1].split("\n")[0]
    assert f"{good}: valid" in done.stdout


def test_a_hooks_workdir_that_is_missing_is_named_and_the_command_not_run(tmp_path):
    marker = tmp_path / "ran"
    for workdir in (tmp_path / "missing", tmp_path / "file"):
        (tmp_path / "file").write_text("")
        spec = HookSpec("/bin/sh", ("-c", f"touch {marker}"), (), str(workdir))
        with pytest.raises(StateError, match=f"apply-start hook: its workdir {workdir} is not a directory"):
            spec.run({}, "apply-start")
        assert not marker.exists()
    HookSpec("/bin/sh", ("-c", f"touch {marker}"), (), str(tmp_path)).run({}, "apply-start")
    assert marker.exists()


def test_missing_files_say_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="MIG config file not found"):
        load_spec(str(tmp_path / "nope.yaml"))
    with pytest.raises(NotFoundError, match="hooks file not found"):
        load_hooks(str(tmp_path / "nope.yaml"))
