"""The hook as a real createContainer hook of runc (and crun): links and linker cache appear
inside the container, while the image's environment and its planted /proc tricks achieve
nothing on the host.

The bundle's rootfs is busybox-static plus the host's static ldconfig; the fake driver
libraries are real ELF objects with SONAMEs, bind-mounted read-only from a "host" folder
as a CDI spec would mount them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hostagent.sim.elf import write_shared_object
from tests.integration.test_hook_security import assert_no_mount_leak, mount_table
from tests.programs import installed
from tests.readwatch import ReadWatch

LIB = "/usr/lib/x86_64-linux-gnu"
APPLETS = ("sh", "ls", "readlink", "cat", "echo")
DRIVER = {"libcuda.so.550.54.15": "libcuda.so.1", "libnvidia-ml.so.550.54.15": "libnvidia-ml.so.1"}
LINKS = (f"libcuda.so.550.54.15::{LIB}/libcuda.so.1", f"libcuda.so.1::{LIB}/libcuda.so",
         f"libnvidia-ml.so.550.54.15::{LIB}/libnvidia-ml.so.1")
PROBE = (f"ldconfig -p; for f in {LIB}/*; do echo \"lib $f -> $(readlink $f)\"; done; "
         "cat /etc/ld.so.conf /etc/ld.so.conf.d/00-hostagent.conf")
CGROUP2_SETUP_FAILED = "cannot mount cgroup2 on /sys/fs/cgroup in a private mount namespace"
# sh -c SCRIPT sh MOUNTS COMMAND...: the namespace's mount table is saved around COMMAND
# (as MOUNTS.before and MOUNTS.after) so that what the hook mounts there is checked as it
# is on the host; without MOUNTS, nothing is saved.
IN_CGROUP2_NAMESPACE = f"""mounts=$1; shift
mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup || {{ echo '{CGROUP2_SETUP_FAILED}' >&2; exit 125; }}
[ -z "$mounts" ] || cat /proc/self/mountinfo > "$mounts.before"
"$@"
status=$?
[ -z "$mounts" ] || cat /proc/self/mountinfo > "$mounts.after"
exit $status
"""


def require(runtime: str) -> str:
    if os.geteuid() != 0:
        pytest.skip("starting containers with runc/crun needs root here; CI runs the suite as root")
    exe = shutil.which(runtime)
    if not exe:
        pytest.skip(f"{runtime} is not installed (.ci/run installs it)")
    if not os.path.exists("/bin/busybox"):
        pytest.skip("busybox-static is not installed (.ci/run installs it)")
    from hostagent.hooks import hostbin
    try:
        os.close(hostbin.open_ldconfig("/sbin/ldconfig"))
    except Exception as e:
        pytest.skip(f"the host has no static ldconfig for the image: {e}")
    return exe


def fs_type(path: str) -> str | None:
    """The type of the file system mounted last (on top) at ``path``, if any."""
    types = [fstype for point, _, fstype in mount_table().values() if point == path]
    return types[-1] if types else None


def hybrid_cgroups() -> bool:
    """systemd's hybrid layout: v1 hierarchies on /sys/fs/cgroup, v2 on its unified/."""
    return fs_type("/sys/fs/cgroup") != "cgroup2" and fs_type("/sys/fs/cgroup/unified") == "cgroup2"


def in_cgroup2_namespace(argv: list[str], mounts: Path | None = None) -> list[str]:
    """``argv`` in a private mount namespace whose /sys/fs/cgroup is the v2 hierarchy.

    crun 1.8 refuses the hybrid layout ("cgroups in hybrid mode not supported"), even with
    --cgroup-manager=disabled; there it sees a plain v2 host. The namespace is private
    (rprivate before the mount), so neither the cgroup2 mount nor any other reaches the host.
    """
    return ["unshare", "-m", "sh", "-c", IN_CGROUP2_NAMESPACE, "sh", str(mounts or ""), *argv]


def build(tmp: Path, runtime: str, builder: str) -> tuple[Path, Path]:
    """(bundle, outside): a runc bundle, and a host folder the image tries to reach."""
    outside = tmp / "outside"
    (outside / "libdir").mkdir(parents=True)
    write_shared_object(outside / "libdir" / "libescape.so.1", "libescape.so.1")
    (outside / "escape.conf").write_text(f"{outside}/libdir\n")
    driver = tmp / "driver"
    driver.mkdir()
    for name, soname in DRIVER.items():
        write_shared_object(driver / name, soname)

    bundle = tmp / "bundle"
    root = bundle / "rootfs"
    for d in ("bin", "sbin", "dev", "proc", "sys", "tmp", "etc/ld.so.conf.d", LIB.lstrip("/")):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    shutil.copy2(os.path.realpath("/sbin/ldconfig"), root / "sbin" / "ldconfig")
    if builder == "ldconfig":                # a 32-bit library: the hook leaves the cache to ldconfig
        write_shared_object(root / LIB.lstrip("/") / "libcuda32.so.1", "libcuda32.so.1", machine="i386")
    # The image's own hostile linker configuration: reach the host through runc init's /proc.
    (root / "etc/ld.so.conf.d/evil.conf").write_text(
        f"include /proc/1/root{outside}/escape.conf\n/proc/1/root{outside}/libdir\n")
    markers = tmp / "markers"
    markers.mkdir()
    cc = installed("cc", "gcc")              # image ENV LD_PRELOAD, the NVIDIAScape recipe
    src = tmp / "evil.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ close(open("{markers}/preload", O_CREAT | O_WRONLY, 0644)); }}\n')
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(root / "evil.so"), str(src)], check=True)

    subprocess.run([runtime, "spec"], cwd=bundle, check=True, capture_output=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"] = {"path": "rootfs", "readonly": False}
    config["process"].update(terminal=False, args=["/bin/sh", "-c", PROBE], cwd="/",
                             env=["PATH=/bin:/sbin", "LD_PRELOAD=/proc/self/cwd/evil.so",
                                  "PYTHONPATH=/", "PYTHONHOME=/", "LD_LIBRARY_PATH=/"])
    config["mounts"] += [{"destination": f"{LIB}/{name}", "type": "bind", "source": str(driver / name),
                          "options": ["ro", "nosuid", "nodev", "bind"]} for name in DRIVER]
    # args[0] is the interpreter's absolute path, not "python3": CPython derives its prefix
    # (stdlib, site-packages) from argv[0], searching PATH when it has no slash, which
    # would pick whatever python3 comes first on the hook's PATH. Not resolved either: a
    # venv's python is a symlink, and only through it does the hook find the venv's packages.
    interpreter = sys.executable
    args = [interpreter, "-I", "-m", "hostagent.hooks", "prepare"]
    for link in LINKS:
        args += ["--link", link]
    args += ["--folder", LIB]
    config["hooks"] = {"createContainer": [{"path": interpreter, "args": args,
                                            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                                            "timeout": 60}]}
    (bundle / "config.json").write_text(json.dumps(config, indent=1))
    return bundle, outside


@pytest.mark.root("runc and crun start containers as root here")
@pytest.mark.engine
@pytest.mark.parametrize("builder", ["in-hook", "ldconfig"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_container_start_runs_the_hook_and_the_cache_resolves(tmp_path, runtime, builder):
    exe = require(runtime)
    bundle, outside = build(tmp_path, runtime, builder)
    escape = outside / "libdir" / "libescape.so.1"
    watch = ReadWatch(outside)                  # every read of the host's tree, access times or not
    mounts = mount_table()
    cli = [exe, "--root", str(tmp_path / "state")]
    if runtime == "crun":
        cli.append("--cgroup-manager=disabled")                     # cgroups are beside the point here
    private = runtime == "crun" and hybrid_cgroups()
    if private and not shutil.which("unshare"):
        pytest.skip("crun needs unshare(1) on this host's hybrid cgroup v1/v2 layout")

    def command(argv, saved=None):
        return in_cgroup2_namespace(argv, saved) if private else argv

    name = f"hostagent-hook-{uuid.uuid4().hex[:8]}"
    inside = tmp_path / "namespace-mounts"                          # .before and .after, when private
    try:
        proc = subprocess.run(command([*cli, "run", "--bundle", str(bundle), name], inside),
                              capture_output=True, text=True, timeout=120)
    finally:                                                        # same --root, same kind of namespace
        subprocess.run(command([*cli, "delete", "--force", name]), capture_output=True, timeout=60)
    if private and (CGROUP2_SETUP_FAILED in proc.stderr or "cgroups in hybrid mode not supported" in proc.stderr):
        pytest.skip(f"crun cannot start containers on this host's hybrid cgroup v1/v2 layout, even in a "
                    f"private mount namespace with cgroup2 on /sys/fs/cgroup: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert f"{soname} (libc6,x86-64) => {LIB}/{soname}" in out, out
    assert f"lib {LIB}/libcuda.so.1 -> libcuda.so.550.54.15" in out
    assert f"lib {LIB}/libcuda.so -> libcuda.so.1" in out
    assert f"lib {LIB}/libnvidia-ml.so.1 -> libnvidia-ml.so.550.54.15" in out
    assert "include /etc/ld.so.conf.d/*.conf" in out and f"\n{LIB}\n" in out
    assert ("Cache generated by: hostagent-hook" in out) == (builder == "in-hook")
    # The image's planted escapes did nothing on the host.
    assert "libescape" not in out
    reads = watch.reads()
    watch.close()
    assert str(escape) not in reads and not reads, f"the host's files were read: {reads}"
    assert not list((tmp_path / "markers").iterdir()), "the image's LD_PRELOAD ran in the hook"
    after = mount_table()
    assert_no_mount_leak(mounts, after, tmp_path)
    assert_no_mount_leak(mounts, after, Path("/sys/fs/cgroup"))        # no cgroup2 mount from the namespace
    if private:                                                       # and none in the namespace crun ran in
        assert_no_mount_leak(mount_table(f"{inside}.before"), mount_table(f"{inside}.after"), tmp_path)
