"""Pure parts of the linker-cache step: choosing the host ldconfig, mountinfo, messages."""

import os
import shutil
import stat

import pytest

from hostagent.hooks import hostbin, ldcache, mountinfo
from hostagent.hooks.errors import HookError

HOST_LDCONFIG = "/sbin/ldconfig"


def static_ldconfig():
    if not os.path.exists(HOST_LDCONFIG):
        pytest.skip("the host has no /sbin/ldconfig")
    fd = os.open(HOST_LDCONFIG + ".real" if os.path.exists(HOST_LDCONFIG + ".real") else HOST_LDCONFIG, os.O_RDONLY)
    try:
        if hostbin.has_interpreter(fd, os.pread(fd, 64, 0)):
            pytest.skip("the host's ldconfig is not static")
    finally:
        os.close(fd)
    return HOST_LDCONFIG


def test_the_hosts_static_ldconfig_is_accepted():
    fd = hostbin.open_ldconfig(static_ldconfig())
    try:
        assert os.pread(fd, 4, 0) == b"\x7fELF"
    finally:
        os.close(fd)


def test_dynamic_binaries_scripts_and_relative_paths_are_refused(tmp_path):
    dynamic = shutil.which("true") or "/bin/true"
    with pytest.raises(HookError, match="dynamically linked"):
        hostbin.open_ldconfig(os.path.realpath(dynamic))
    script = tmp_path / "ldconfig"
    script.write_text("#!/bin/sh\ntouch /tmp/pwned\n")
    script.chmod(0o755)
    with pytest.raises(HookError, match="is a script"):
        hostbin.open_ldconfig(str(script))
    with pytest.raises(HookError, match="absolute path on the host"):
        hostbin.open_ldconfig("sbin/ldconfig")
    with pytest.raises(HookError, match="does not exist"):
        hostbin.open_ldconfig(str(tmp_path / "missing"))


def test_ldconfig_real_is_preferred_over_a_wrapper(tmp_path):
    wrapper = tmp_path / "ldconfig"
    wrapper.write_text("#!/bin/sh\nexec /sbin/ldconfig.real \"$@\"\n")
    wrapper.chmod(0o755)
    shutil.copy2(static_ldconfig(), tmp_path / "ldconfig.real")
    fd = hostbin.open_ldconfig(str(wrapper))
    try:
        assert os.fstat(fd).st_ino == (tmp_path / "ldconfig.real").stat().st_ino
    finally:
        os.close(fd)


def test_a_writable_binary_is_refused(tmp_path):
    copy = tmp_path / "ldconfig"
    shutil.copy2(static_ldconfig(), copy)
    copy.chmod(0o777)
    with pytest.raises(HookError, match="writable by group or others"):
        hostbin.open_ldconfig(str(copy))


def test_the_sealed_copy_is_identical_and_cannot_be_changed():
    fd = hostbin.open_ldconfig(static_ldconfig())
    sealed = hostbin.sealed_copy(fd)
    if sealed is None:
        os.close(fd)
        pytest.skip("memfd sealing unavailable here")
    try:
        size = os.fstat(fd).st_size
        assert os.fstat(sealed).st_size == size
        assert os.pread(sealed, size, 0) == os.pread(fd, size, 0)
        for change in (lambda: os.pwrite(sealed, b"x", 0), lambda: os.ftruncate(sealed, 0)):
            with pytest.raises(PermissionError):
                change()
        assert stat.S_ISREG(os.fstat(sealed).st_mode)
    finally:
        os.close(sealed)
        os.close(fd)


def test_mountinfo_parsing_with_escapes_and_optional_fields():
    text = ("22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
            "88 60 0:40 / /run/c/root\\040fs/proc rw,relatime - proc proc rw\n"
            "60 1 0:39 / /run/c/root\\040fs ro,relatime master:3 propagate_from:2 - overlay overlay rw\n")
    mounts = mountinfo.parse(text)
    assert [(m.point, m.fstype) for m in mounts] == [("/proc", "proc"), ("/run/c/root fs/proc", "proc"),
                                                    ("/run/c/root fs", "overlay")]
    assert "nodev" in mounts[0].options and "ro" in mounts[2].options
    assert mountinfo.under("/run/c/root fs/proc", "/run/c/root fs")
    assert not mountinfo.under("/run/c/root fsx", "/run/c/root fs")
    assert mountinfo.containing(mounts, "/run/c/root fs/etc").point == "/run/c/root fs"
    with pytest.raises(ValueError, match="unexpected mountinfo line"):
        mountinfo.parse("garbage\n")


def test_the_drop_in_lists_the_folders_one_per_line():
    assert ldcache.drop_in(["/usr/lib/x86_64-linux-gnu", "/usr/lib64"]).decode().splitlines()[1:] == [
        "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]


def test_ldconfig_output_is_quoted_as_one_printable_line():
    from hostagent.hooks.sandbox import _tail
    assert _tail(b"ldconfig: /x\x1b[31m: bad\nsecond line\n") == "ldconfig: /x [31m: bad second line"
    assert _tail(b"x" * 2000).startswith("...") and len(_tail(b"x" * 2000)) == 603
    assert _tail(None) == "no output"


@pytest.mark.parametrize("wait", ["_wait", "_poll"])
def test_waiting_for_ldconfig_reports_exits_and_kills_at_the_deadline(wait):
    import time
    from hostagent.hooks import sandbox
    wait = getattr(sandbox, wait)
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    assert wait(pid, 5) == 3
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    start = time.monotonic()
    assert wait(pid, 0.2) is None                                  # killed and reaped
    assert time.monotonic() - start < 2
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
