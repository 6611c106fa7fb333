"""The hook's command line: known verbs and flags, the warn-and-continue policy, usage errors."""

import io
import os
import posix
import sys

import pytest

from hostagent.hooks import cli, main as hook_main
from hostagent.hooks.errors import UsageError


class Flags:
    """sys.flags with another ``isolated`` (the interpreter's own flags stay readable)."""

    def __init__(self, isolated, real=sys.flags):
        self.isolated, self._real = isolated, real

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """main() refuses to run unless isolated, and pytest is not: in-process calls stand in
    for the isolated interpreter (the integration tests start the real one)."""
    for name in list(os.environ):
        if name.startswith(("PYTHON", "LD_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr("sys.flags", Flags(1))


def test_prepare_takes_repeated_links_and_folders_in_both_spellings():
    req = cli.parse(["prepare", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                     "--link=../libnvidia-allocator.so.1::/usr/lib/gbm/nvidia-drm_gbm.so",
                     "--folder", "/usr/lib/x86_64-linux-gnu", "--folder=/usr/lib64/",
                     "--ldconfig-path", "/usr/sbin/ldconfig", "--ldconfig-timeout=2.5"])
    assert req.verb == "prepare" and not req.warnings
    assert req.links == [("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"),
                         ("../libnvidia-allocator.so.1", "/usr/lib/gbm/nvidia-drm_gbm.so")]
    assert req.folders == ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    assert (req.ldconfig_path, req.ldconfig_timeout) == ("/usr/sbin/ldconfig", 2.5)


def test_defaults_and_duplicates():
    req = cli.parse(["update-ldcache", "--folder", "/lib", "--folder", "/lib/", "--folder", "/./lib"])
    assert req.folders == ["/lib"]
    assert (req.ldconfig_path, req.ldconfig_timeout) == ("/sbin/ldconfig", cli.DEFAULT_TIMEOUT)
    req = cli.parse(["create-symlinks", "--link", "a::/b", "--link", "a::/b"])
    assert req.links == [("a", "/b")]


def test_unknown_verb_is_a_warning_and_nothing_to_do():
    req = cli.parse(["enable-cuda-compat", "--host-driver-version=550.54.15"])
    assert req.verb is None
    assert req.warnings == ["unknown verb 'enable-cuda-compat' ignored; this hook knows prepare, "
                            "create-symlinks, update-ldcache"]


def test_an_unknown_global_flag_with_a_value_keeps_the_verb_and_its_flags():
    req = cli.parse(["--log-level", "info", "prepare", "--link", "a::/b", "--folder", "/lib"])
    assert (req.verb, req.links, req.folders) == ("prepare", [("a", "/b")], ["/lib"])
    assert req.warnings == ["unknown flag '--log-level' before the verb ignored"]
    req = cli.parse(["--debug", "--log-level=info", "create-symlinks", "--link", "a::/b"])
    assert (req.verb, req.links) == ("create-symlinks", [("a", "/b")])


def test_flags_without_a_verb_mean_prepare():
    req = cli.parse(["--link", "A::/B", "--folder", "/d"])
    assert (req.verb, req.links, req.folders, req.warnings) == ("prepare", [("A", "/B")], ["/d"], [])


def test_a_word_no_verb_explains_does_nothing_whatever_the_flags_say():
    """A newer verb behind a newer global flag is never run as prepare."""
    for argv in (["--debug", "enable-cuda-compat", "--link", "a::/b"], ["--mode", "x", "--folder", "/lib"]):
        req = cli.parse(argv)
        assert req.verb is None and req.links == [] and req.folders == []
        assert req.warnings[-1].startswith("unknown verb ")


def test_device_links_are_kept_apart_and_made_only_for_present_nodes():
    from hostagent.hooks.links import present_device_links
    req = cli.parse(["prepare", "--device-link", "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card",
                     "--device-link", "../renderD128::/dev/dri/by-path/pci-0000:3b:00.0-render",
                     "--device-link", "../card2::/dev/dri/by-path/pci-0000:5e:00.0-card"])
    assert req.links == [] and len(req.device_links) == 3
    present = present_device_links(req.device_links, {"/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"})
    assert [link for _, link in present] == ["/dev/dri/by-path/pci-0000:3b:00.0-card",
                                             "/dev/dri/by-path/pci-0000:3b:00.0-render"]
    assert present_device_links(req.device_links, set()) == []


def test_unknown_flags_are_skipped_with_their_values_and_the_rest_still_applies():
    req = cli.parse(["--debug", "prepare", "--new-flag", "value", "--link", "a::/b",
                     "--other=x", "--flag-without-value", "--folder", "/lib", "stray"])
    assert req.verb == "prepare"
    assert req.links == [("a", "/b")] and req.folders == ["/lib"]
    assert req.warnings == ["unknown flag '--debug' before the verb ignored",
                            "unknown flag '--new-flag' for prepare ignored",
                            "unknown flag '--other' for prepare ignored",
                            "unknown flag '--flag-without-value' for prepare ignored",
                            "unexpected argument 'stray' ignored"]


def test_a_flag_of_another_verb_is_ignored_not_applied():
    req = cli.parse(["create-symlinks", "--folder", "/lib", "--link", "a::/b"])
    assert req.folders == [] and req.links == [("a", "/b")]
    assert req.warnings == ["unknown flag '--folder' for create-symlinks ignored"]


@pytest.mark.parametrize("argv, message", [
    (["prepare", "--link"], "--link needs a value"),
    (["prepare", "--link", "no-separator"], "expected TARGET::LINK"),
    (["prepare", "--link", "a::b::c"], "expected TARGET::LINK"),
    (["prepare", "--link", "::/b"], "expected TARGET::LINK"),
    (["prepare", "--link", "a\0::/b"], "not a usable path"),
    (["prepare", "--link", "a::/b", "--link", "a::/usr/lib/.."], "'/usr/lib/..' does not name a file"),
    (["prepare", "--device-link", "../card1::/"], "'/' does not name a file"),
    (["prepare", "--link", "a::/usr/lib/" + "é" * 128], "file name is longer than 255 bytes"),
    (["create-symlinks", "--device-link", "card1"], "expected TARGET::LINK"),
    (["prepare", "--folder", "lib"], "must be an absolute container path"),
    (["prepare", "--folder", "/lib\ninclude /proc/1/root/etc/*"], "characters ld.so.conf cannot hold"),
    (["prepare", "--folder", "/lib # comment"], "characters ld.so.conf cannot hold"),
    (["prepare", "--folder", "/lib=libc6"], "characters ld.so.conf cannot hold"),
    (["prepare", "--folder", "/lib "], "leading or trailing blanks"),
    (["update-ldcache", "--ldconfig-path", "sbin/ldconfig"], "must be an absolute path on the host"),
    (["update-ldcache", "--ldconfig-timeout", "0"], "expected seconds"),
    (["update-ldcache", "--ldconfig-timeout", "nan"], "expected seconds"),
    (["update-ldcache", "--ldconfig-timeout", "soon"], "expected seconds"),
])
def test_known_flags_used_wrongly_are_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message) as info:
        cli.parse(argv)
    assert info.value.code == 2


def test_main_warns_and_exits_zero_on_unknown_verbs_without_reading_stdin(capsys, monkeypatch):
    monkeypatch.setattr(posix, "read", lambda *a: pytest.fail("stdin must not be read"))
    assert hook_main.main(["chmod", "--mode", "755", "--path", "/dev/dri"]) == 0
    err = capsys.readouterr().err
    assert err == ("hostagent-hook: warning: unknown verb 'chmod' ignored; this hook knows prepare, "
                   "create-symlinks, update-ldcache\n")


def test_main_changes_to_a_trusted_directory_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hook_main.main(["--help"]) == 0
    assert os.getcwd() == "/"


def test_main_reports_usage_errors_in_one_line(capsys):
    assert hook_main.main(["prepare", "--link", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err == "hostagent-hook: error: --link 'nonsense': expected TARGET::LINK (see hostagent-hook --help)\n"


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES"])
def test_main_refuses_a_leaked_loader_environment(name, monkeypatch, capsys):
    monkeypatch.setenv(name, "/proc/self/cwd/evil.so")
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    assert hook_main.main(["prepare", "--folder", "/lib"]) == 1
    assert f"refusing to run with {name} set" in capsys.readouterr().err


def test_a_hook_not_started_isolated_refuses_whatever_it_is_asked_but_help(monkeypatch, capsys):
    monkeypatch.setattr("sys.flags", Flags(0))
    assert hook_main.main(["--help"]) == 0          # reads and writes nothing: answered anyway
    out = capsys.readouterr().out
    assert out.startswith("usage: hostagent-hook") and "python3 -I -m hostagent.hooks" in out
    for argv in (["--help", "prepare"], ["no-such-verb"], ["create-symlinks", "--link", "a::/b"]):
        assert hook_main.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("hostagent-hook: error: not started isolated (python3 -I)") and err.count("\n") == 1
    monkeypatch.setenv("PYTHONPATH", "/rootfs")
    monkeypatch.setattr("sys.flags", Flags(1))
    assert hook_main.main(["no-such-verb"]) == 0          # isolated: PYTHON* variables were ignored


def test_the_hook_imports_only_the_stdlib_and_its_own_modules(tmp_path):
    """Start-up cost and attack surface: nothing from the rest of hostagent, no argparse or
    json, and no ctypes unless the linker cache is refreshed."""
    import json
    import subprocess
    import sys
    (tmp_path / "rootfs").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "bundle": str(tmp_path)}).encode()
    proc = subprocess.run([sys.executable, "-I", "-X", "importtime", "-m", "hostagent.hooks", "create-symlinks",
                           "--link", "libcuda.so.1::/usr/lib/libcuda.so"], input=state, capture_output=True,
                          env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert proc.returncode == 0, proc.stderr
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.decode().splitlines()
               if line.startswith("import time:") and "|" in line}
    ours = {m for m in modules if m.startswith("hostagent")}
    assert ours and all(m in ("hostagent", "hostagent.hooks") or m.startswith("hostagent.hooks.") for m in ours), ours
    assert not modules & {"argparse", "json", "ctypes", "hostagent.hooks.sandbox"}, modules & {"argparse", "json", "ctypes"}
    assert os.readlink(tmp_path / "rootfs/usr/lib/libcuda.so") == "libcuda.so.1"
