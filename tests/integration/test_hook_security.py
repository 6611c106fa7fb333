"""Attacks on the hook program against real container roots on disk.

Every test builds a hostile container root next to an "outside" tree that stands for the
host, runs the hook the way an engine does (the generated spec's own command line,
``python3 -I -S -c ...``, or ``python3 -I -m hostagent.hooks``; the OCI state on stdin,
an explicit PATH-only environment), and asserts that nothing outside was
created, changed or read (a metadata snapshot, and every read of it as the kernel reports it:
``tests/readwatch.py``, whatever the file system does with access times) and that no
attacker code ran (planted code creates marker files). Where it matters, a
control run without the defence shows that the attack and its detection are real.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hostagent.sim.elf import shared_object_bytes, write_shared_object
from tests.readwatch import ReadWatch

LIB = "/usr/lib/x86_64-linux-gnu"
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
HOST_LDCONFIG = "/sbin/ldconfig"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the ldconfig sandbox needs root (namespaces, mounts, "
                                                         "chroot); CI runs the suite as root")
LINKS = (f"libcuda.so.550.54.15::{LIB}/libcuda.so.1", f"libcuda.so.1::{LIB}/libcuda.so",
         f"libnvidia-ml.so.550.54.15::{LIB}/libnvidia-ml.so.1")


class World:
    """tmp/outside (the host), tmp/bundle/rootfs (the container), tmp/markers (attacker code)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.outside = tmp / "outside"
        self.bundle = tmp / "bundle"
        self.root = self.bundle / "rootfs"
        self.markers = tmp / "markers"
        self.markers.mkdir()
        libdir = self.outside / "libdir"
        libdir.mkdir(parents=True)
        write_shared_object(libdir / "libescape.so.1", "libescape.so.1")
        (self.outside / "escape.conf").write_text(f"{libdir}\n")
        (self.outside / "etc").mkdir()
        (self.outside / "etc" / "ld.so.cache").write_text("the host's cache\n")
        (self.outside / "confd").mkdir()
        (self.outside / "canary").write_text("secret\n")
        (self.root / LIB.lstrip("/")).mkdir(parents=True)
        (self.root / "etc").mkdir()
        for name, soname in (("libcuda.so.550.54.15", "libcuda.so.1"), ("libnvidia-ml.so.550.54.15", "libnvidia-ml.so.1")):
            write_shared_object(self.root / LIB.lstrip("/") / name, soname)
        (self.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
        self._snapshot = None
        self.watch: ReadWatch | None = None

    def at(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def state(self, **extra) -> bytes:
        return json.dumps({"ociVersion": "1.0.2", "id": "hook-test", "status": "creating",
                           "pid": os.getpid(), "bundle": str(self.bundle), **extra}).encode()

    def run(self, *args, env=None, cwd="/", stdin=None, timeout=60, isolated=True, spec=False) -> subprocess.CompletedProcess:
        if spec:         # exactly what a generated spec's hook runs
            from hostagent.cdi.spec import hook_command
            hook = hook_command(sys.executable, *args)
            cmd = list(hook.args)
            assert cmd[0] == hook.path
        else:
            cmd = [sys.executable, *(["-I"] if isolated else []), "-m", "hostagent.hooks", *args]
        return subprocess.run(cmd, input=self.state() if stdin is None else stdin, env=ENV if env is None else env,
                              cwd=cwd, capture_output=True, timeout=timeout)

    # What "nothing outside changed or was read" means.
    def seal(self) -> None:
        self._snapshot = snapshot(self.outside)
        if self.watch is not None:
            self.watch.close()
        self.watch = ReadWatch(self.outside)

    def assert_untouched(self) -> None:
        read = self.watch.reads()          # first: the snapshot below lists the tree itself
        assert not read, f"read outside the container root: {read}"
        assert snapshot(self.outside) == self._snapshot, "the outside tree changed"
        assert not list(self.markers.iterdir()), f"attacker code ran: {list(self.markers.iterdir())}"

    def cache(self, path: Path | None = None) -> str:
        """`ldconfig -p` of the container's cache (the host's ldconfig reading a file)."""
        return subprocess.run([HOST_LDCONFIG, "-p", "-C", str(path or self.at("/etc/ld.so.cache"))],
                              capture_output=True, text=True, check=True).stdout


def snapshot(top: Path) -> dict:
    out = {}
    for p in [top, *top.rglob("*")]:
        st = os.lstat(p)
        out[str(p)] = (st.st_mode, st.st_uid, st.st_ino, st.st_nlink, st.st_size, st.st_mtime_ns,
                       os.readlink(p) if p.is_symlink() else None)
    return out


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    if w.watch is not None:
        w.watch.close()


def test_the_read_watch_sees_what_a_reader_does(world):
    """The detection's own control: a read, a listing and an open of the outside tree are
    seen (on any file system, access times or not); a stat and a path-only open are not."""
    world.seal()
    os.stat(world.outside / "canary")
    os.close(os.open(world.outside / "canary", os.O_PATH))
    assert world.watch.reads() == []
    (world.outside / "canary").read_bytes()
    os.listdir(world.outside / "confd")
    os.close(os.open(world.outside / "libdir" / "libescape.so.1", os.O_RDONLY))
    assert world.watch.reads() == [str(world.outside / "canary"), str(world.outside / "confd"),
                                   str(world.outside / "libdir" / "libescape.so.1")]
    with pytest.raises(AssertionError, match="read outside the container root"):
        world.assert_untouched()


# The two ways the cache is built: in the hook from the image's cache and the folders'
# libraries, or by the host's ldconfig in the sandbox, which the hook leaves a folder with a
# library of another kind than the host's to (a 32-bit one here).
BUILDERS = ["in-hook", "ldconfig"]


def use_builder(world: World, builder: str) -> None:
    if builder == "ldconfig":
        write_shared_object(world.at(f"{LIB}/libcuda32.so.1"), "libcuda32.so.1", machine="i386")


def built_by(world: World, builder: str, cache: Path | None = None) -> None:
    out = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(cache or world.at("/etc/ld.so.cache"))],
                         capture_output=True, text=True, check=True).stdout
    assert ("generated by: hostagent-hook" in out) == (builder == "in-hook"), out[-200:]


def prepare_args(*links, folder=LIB, timeout=None):
    args = ["prepare"]
    for link in links:
        args += ["--link", link]
    if folder:
        args += ["--folder", folder]
    if timeout:
        args += ["--ldconfig-timeout", str(timeout)]
    return args


def ok(proc) -> str:
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stderr.decode()


# -- 1. The image's environment and working directory -----------------------------------

def plant_python(world: World) -> dict:
    """Modules that would run if the interpreter looked at the image's files or variables."""
    code = "import posix; posix.close(posix.open({!r}, posix.O_CREAT | posix.O_WRONLY, 0o644))\n"
    plants = {"json.py": "json", "ctypes/__init__.py": "ctypes", "hostagent/__init__.py": "hostagent",
              "hostagent/hooks/__init__.py": "hooks", "sitecustomize.py": "sitecustomize",
              "startup.py": "startup", "userbase/lib/python3.11/site-packages/usercustomize.py": "usercustomize",
              f"home/lib/python{sys.version_info[0]}.{sys.version_info[1]}/encodings/__init__.py": "encodings"}
    for rel, marker in plants.items():
        path = world.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code.format(str(world.markers / marker)))
    return {**ENV, "PYTHONPATH": str(world.root), "PYTHONHOME": str(world.root / "home"),
            "PYTHONSTARTUP": str(world.root / "startup.py"), "PYTHONUSERBASE": str(world.root / "userbase"),
            "PYTHONINSPECT": "", "PYTHONSAFEPATH": ""}


@pytest.mark.parametrize("spec", [True, False], ids=["spec-command-line", "module"])
def test_image_python_environment_and_cwd_do_not_reach_the_hook(world, spec):
    env = plant_python(world)
    world.seal()
    args = prepare_args(*LINKS) if os.geteuid() == 0 else ["create-symlinks", *sum((["--link", l] for l in LINKS), [])]
    ok(world.run(*args, env=env, cwd=world.root, spec=spec))
    world.assert_untouched()
    assert os.readlink(world.at(f"{LIB}/libcuda.so.1")) == "libcuda.so.550.54.15"
    # Control: the same interpreter without -I runs the image's code. The attack is real,
    # and isolation (plus the spec's explicit env) is what stops it.
    world.run("--help", env=env, cwd=world.root, isolated=False)
    assert (world.markers / "encodings").exists()


def build_preload(world: World) -> Path:
    from tests.programs import installed
    cc = installed("cc", "gcc")
    src = world.tmp / "evil.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void run(void) '
                   f'{{ close(open("{world.markers}/preload", O_CREAT | O_WRONLY, 0644)); }}\n')
    out = world.root / "evil.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def test_a_leaked_loader_environment_is_refused(world):
    """LD_PRELOAD runs before any Python code, so only the spec's explicit env stops it (the
    e2e test shows the engine honouring it); if it leaks anyway, the hook refuses to do its
    work, and LD_LIBRARY_PATH is refused before any extension module (ctypes: libffi) loads."""
    build_preload(world)
    world.seal()
    proc = world.run(*prepare_args(*LINKS), env={**ENV, "LD_PRELOAD": "/proc/self/cwd/evil.so"}, cwd=world.root)
    assert (world.markers / "preload").exists()            # the loader ran it, before Python
    assert proc.returncode == 1 and b"refusing to run with LD_PRELOAD set" in proc.stderr
    (world.markers / "preload").unlink()
    proc = world.run(*prepare_args(*LINKS), env={**ENV, "LD_LIBRARY_PATH": str(world.root)}, cwd=world.root)
    assert proc.returncode == 1 and b"refusing to run with LD_LIBRARY_PATH set" in proc.stderr
    assert not os.path.lexists(world.at(f"{LIB}/libcuda.so.1"))      # refused before writing
    world.assert_untouched()


# -- 2./3. Symlinks, `..` and absolute paths in the container root ------------------------

@pytest.mark.parametrize("text", ["{outside}/libdir", "../../../../../../../../..{outside}/libdir",
                                  "/proc/self/root{outside}/libdir", "/proc/{pid}/root{outside}/libdir"])
def test_a_library_directory_pointing_outside_stays_inside(world, text):
    shutil.rmtree(world.at(LIB))
    world.at(LIB).symlink_to(text.format(outside=world.outside, pid=os.getpid()))
    world.seal()
    ok(world.run("create-symlinks", *sum((["--link", l] for l in LINKS), [])))
    world.assert_untouched()
    made = world.root / f"{world.outside}/libdir".lstrip("/")
    if "/proc/" in text:
        made = world.root / f"proc/{'self' if 'self' in text else os.getpid()}/root{world.outside}/libdir".lstrip("/")
    assert os.readlink(made / "libcuda.so") == "libcuda.so.1"


def test_a_links_parent_pointing_outside_stays_inside(world):
    world.at(f"{LIB}/vdpau").symlink_to(world.outside / "confd")
    world.at("/dev").mkdir()
    world.at("/dev/dri").symlink_to("/proc/self/cwd/../../../..")
    world.seal()
    ok(world.run("create-symlinks", "--link", f"libvdpau_nvidia.so.550::{LIB}/vdpau/libvdpau_nvidia.so.1",
                 "--link", "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card"))
    world.assert_untouched()
    assert os.readlink(world.root / f"{world.outside}/confd/libvdpau_nvidia.so.1".lstrip("/")) == "libvdpau_nvidia.so.550"
    # /proc/self/cwd/../../../.. walked inside the root is the root itself.
    assert os.readlink(world.at("/by-path/pci-0000:3b:00.0-card")) == "../card1"


def test_dotdot_components_and_absolute_targets(world):
    world.seal()
    ok(world.run("create-symlinks",
                 "--link", f"/etc/shadow::/../../../../..{world.outside}/evil1",
                 "--link", f"{world.outside}/canary::/usr/../../../..{world.outside}/confd/evil2",
                 "--link", f"../../../../../..{world.outside}/canary::usr/lib/../../../evil3"))
    world.assert_untouched()
    inside = world.root / str(world.outside).lstrip("/")
    assert os.readlink(inside / "evil1") == "/etc/shadow"                    # stored verbatim, never followed
    assert os.readlink(inside / "confd" / "evil2") == f"{world.outside}/canary"
    assert os.readlink(world.root / "evil3") == f"../../../../../..{world.outside}/canary"


@needs_root
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("layout", ["confd", "cache", "conf", "etc"])
def test_symlinked_linker_configuration_stays_inside(world, layout, builder):
    use_builder(world, builder)
    etc = world.at("/etc")
    if layout == "confd":
        (etc / "ld.so.conf.d").symlink_to(world.outside / "confd")
    elif layout == "cache":
        (etc / "ld.so.cache").symlink_to(world.outside / "etc" / "ld.so.cache")
    elif layout == "conf":
        (etc / "ld.so.conf").symlink_to(world.outside / "escape.conf")
    else:
        etc.rmdir()
        world.at("/etc").symlink_to(world.outside / "etc")
    world.seal()
    ok(world.run(*prepare_args(*LINKS)))
    world.assert_untouched()
    # /etc -> <outside>/etc is followed inside the root: the cache lands under root/<outside>/etc.
    inside_etc = world.root / str(world.outside / "etc").lstrip("/") if layout == "etc" else world.at("/etc")
    cache = world.cache(inside_etc / "ld.so.cache")
    assert f"libcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1" in cache and "libescape" not in cache
    built_by(world, builder, inside_etc / "ld.so.cache")


# -- 2. Swaps of a directory for a symlink while the hook runs ---------------------------

def flipper(path: Path, target: Path) -> int:
    """A process exchanging the directory at ``path`` with a symlink to ``target`` and back
    (renameat2 RENAME_EXCHANGE: the attacker's primitive, atomic, never a missing entry) as
    fast as it can, until killed. It works through a descriptor of the real parent, so
    another flipper swapping that parent cannot redirect it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    link = path.name + ".swap"
    os.symlink(target, link, dir_fd=parent)
    pid = os.fork()
    if pid:
        os.close(parent)
        return pid
    a, b = os.fsencode(path.name), os.fsencode(link)
    try:
        while True:
            libc.renameat2(parent, a, parent, b, 2)         # RENAME_EXCHANGE
    finally:
        os._exit(0)


def test_directories_swapped_for_symlinks_while_the_hook_runs(world):
    from hostagent.hooks import ldcache
    from hostagent.hooks.errors import HookError
    from hostagent.hooks.inroot import Root
    from hostagent.hooks.links import create_links

    world.at("/etc/ld.so.conf.d").mkdir()
    world.seal()
    libdir = os.open(world.at(LIB), os.O_PATH | os.O_DIRECTORY)
    flippers = [flipper(world.at(LIB), world.outside / "libdir"),
                flipper(world.at("/etc/ld.so.conf.d"), world.outside / "confd"),
                flipper(world.at("/etc"), world.outside / "etc")]
    links = [tuple(link.split("::")) for link in LINKS]
    rounds = failures = 0
    try:
        deadline = time.monotonic() + 1.5
        with Root(str(world.root)) as root:                 # the hook's own code, many times a second
            while time.monotonic() < deadline:
                rounds += 1
                try:
                    create_links(root, links, lambda m: None)
                    ldcache.write_config(root, [LIB])
                    ldcache.install_cache(root, ldcache.merged(root, [LIB], None) or b"stand-in")
                except (HookError, OSError):
                    failures += 1                            # losing a race is allowed, escaping is not
        for run in range(4):                                # and whole runs of the program, both builders
            if run == 2:                                    # (a 32-bit library, made in the real folder)
                fd = os.open("libcuda32.so.1", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755, dir_fd=libdir)
                os.write(fd, shared_object_bytes("libcuda32.so.1", machine="i386"))
                os.close(fd)
            world.run(*prepare_args(*LINKS)) if os.geteuid() == 0 else \
                world.run("create-symlinks", *sum((["--link", l] for l in LINKS), []))
    finally:
        for pid in flippers:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(libdir)
    assert rounds >= 20, f"only {rounds} rounds ran"
    world.assert_untouched()


# -- 5. ldconfig -------------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize("builder", BUILDERS)
def test_ldconfig_cannot_reach_outside_through_proc_or_relative_paths(world, builder):
    use_builder(world, builder)
    proc = world.at("/proc")
    proc.mkdir()
    subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)  # as runc does before the hooks
    try:
        pid = os.getpid()                                   # a root process whose root is the host's /
        (world.at("/etc") / "ld.so.conf").write_text(
            f"include /proc/{pid}/root{world.outside}/escape.conf\n/proc/{pid}/root{world.outside}/libdir\n"
            f"/proc/{pid}/cwd/../../../../../..{world.outside}/libdir\n"
            f"../../../../../../../../..{world.outside}/libdir\ninclude ../../../../../..{world.outside}/*.conf\n")
        # Control: a plain `ldconfig -r` escapes through /proc and reads the host's library.
        subprocess.run([HOST_LDCONFIG, "-X", "-r", str(world.root), "-C", "/naive.cache"], capture_output=True)
        listed = subprocess.run([HOST_LDCONFIG, "-p", "-C", str(world.root / "naive.cache")],
                                capture_output=True, text=True).stdout
        assert "libescape.so.1" in listed
        (world.root / "naive.cache").unlink()
        world.seal()
        ok(world.run(*prepare_args(*LINKS)))
        world.assert_untouched()
        cache = world.cache()
        assert f"libcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1" in cache and "libescape" not in cache
        built_by(world, builder)
    finally:
        subprocess.run(["umount", "-l", str(proc)], check=True)


@needs_root
@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("hostile", ["include-loop", "huge", "fifo"])
def test_hostile_ld_so_conf_cannot_hang_or_escape(world, hostile, builder):
    use_builder(world, builder)
    conf = world.at("/etc/ld.so.conf")
    if hostile == "include-loop":           # two self-includes per level: exponential without limits
        conf.write_text("include /etc/ld.so.conf\ninclude /etc/ld.so.conf\n")
    elif hostile == "huge":                 # 40 MB of includes, each re-reading the drop-in folder
        conf.write_text("include /etc/ld.so.conf.d/*.conf\n" * 1_250_000)
    else:                                   # opening a FIFO blocks forever
        (world.at("/etc") / "ld.so.conf.d").mkdir()
        os.mkfifo(world.at("/etc/ld.so.conf.d/zz-fifo.conf"))
        conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
    world.seal()
    start = time.monotonic()
    proc = world.run(*prepare_args(*LINKS, timeout=1.5))
    elapsed = time.monotonic() - start
    assert elapsed < 6, f"the hook took {elapsed:.1f} s"
    world.assert_untouched()
    if proc.returncode != 0:                # killed at the deadline: said so, old cache kept
        assert builder == "ldconfig" and b"ldconfig did not finish within 1.5 s" in proc.stderr
        assert not world.at("/etc/ld.so.cache").exists()
    else:
        built_by(world, builder)
    assert not list(world.tmp.glob("**/aux-cache"))


@needs_root
@pytest.mark.parametrize("builder", BUILDERS)
def test_the_containers_ldconfig_is_never_run(world, builder):
    use_builder(world, builder)
    script = f"#!/bin/sh\ntouch {world.markers}/container-ldconfig\n"
    for path in ("/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/sbin/ldconfig", "/usr/bin/ldconfig"):
        world.at(path).parent.mkdir(parents=True, exist_ok=True)
        world.at(path).write_text(script)
        world.at(path).chmod(0o755)
    world.at("/var/cache/ldconfig").mkdir(parents=True)
    world.at("/var/cache/ldconfig").chmod(0o777)       # writable even for nobody: only read-only mounts stop it
    world.seal()
    ok(world.run(*prepare_args(*LINKS), "--ldconfig-path", "/sbin/ldconfig"))
    world.assert_untouched()
    assert "libnvidia-ml.so.1" in world.cache()
    built_by(world, builder)
    # ldconfig wrote nothing in the container itself: its view was read-only.
    assert list(world.at("/var/cache/ldconfig").iterdir()) == []


@needs_root
def test_a_dynamic_ldconfig_is_refused_before_anything_is_written(world):
    world.seal()
    proc = world.run(*prepare_args(*LINKS), "--ldconfig-path", os.path.realpath(shutil.which("true")))
    assert proc.returncode == 1 and b"dynamically linked" in proc.stderr
    assert not os.path.lexists(world.at(f"{LIB}/libcuda.so.1"))
    world.assert_untouched()


@needs_root
def test_the_per_mount_remount_fallback_confines_as_well(world):
    """Kernels before 5.12 have no mount_setattr: the sandbox remounts each mount instead."""
    from hostagent.hooks import hostbin, sandbox
    from hostagent.hooks.inroot import Root

    (world.at("/etc") / "ld.so.conf").write_text(f"{LIB}\n")
    world.at("/var/cache/ldconfig").mkdir(parents=True)
    world.at("/var/cache/ldconfig").chmod(0o777)
    exe = hostbin.open_ldconfig(HOST_LDCONFIG)
    try:
        with Root(str(world.root)) as root:
            cache = sandbox.run_ldconfig(root.fd, [exe], [], 10, force_remount=True)
    finally:
        os.close(exe)
    assert cache.startswith(sandbox.CACHE_MAGICS) and b"libcuda.so.1" in cache
    assert list(world.at("/var/cache/ldconfig").iterdir()) == []


# -- 5b. The cache built in the hook --------------------------------------------------------

def blocked_writer(fifo: Path) -> int:
    """A process opening ``fifo`` for writing: it stays blocked until someone opens the
    FIFO for reading, so its exit shows whether anyone did."""
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(os.open(fifo, os.O_WRONLY))
        finally:
            os._exit(0)
    return pid


@needs_root
def test_the_image_cache_and_the_folders_entries_are_read_inside_the_root_only(world):
    """What the hook reads to build the cache: the image's cache and every library-named
    entry of a folder. A FIFO there is never opened for reading (a device node neither:
    the same path-only open), and links to the host, through /proc or out with .. are
    followed inside the root or not at all."""
    world.at("/proc").mkdir()
    subprocess.run(["mount", "-t", "proc", "proc", str(world.at("/proc"))], check=True)  # as runc mounts it
    writers = {}
    try:
        escape = world.outside / "libdir" / "libescape.so.1"
        for name, target in (("libabs.so.1", escape), ("libproc.so.1", f"/proc/{os.getpid()}/root{escape}"),
                             ("libup.so.1", f"../../../../../../../..{escape}"), ("libloop.so.1", "libloop.so.1")):
            world.at(f"{LIB}/{name}").symlink_to(target)
        os.mknod(world.at(f"{LIB}/libnull.so.1"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        for path in (world.at("/etc/ld.so.cache"), world.at(f"{LIB}/libfifo.so.1")):
            writers[path] = blocked_writer(path)
        world.seal()
        ok(world.run(*prepare_args(*LINKS)))
        world.assert_untouched()
        opened = [fifo for fifo, pid in writers.items() if os.waitpid(pid, os.WNOHANG) != (0, 0)]
        for fifo in opened:
            del writers[fifo]                                # exited, and reaped just now
        assert not opened, f"opened for reading: {opened}"
        cache = world.cache(world.at("/etc/ld.so.cache"))   # the FIFO was replaced, never read
        assert f"libcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1" in cache
        assert not any(n in cache for n in ("libescape", "libabs", "libproc", "libup", "libloop", "libnull", "libfifo"))
        built_by(world, "in-hook")
        # Control: opening one for reading is what the writer's exit would show.
        fifo = world.at(f"{LIB}/libfifo.so.1")
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        assert os.waitpid(writers.pop(fifo), 0)[0] > 0
    finally:
        for pid in writers.values():
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        subprocess.run(["umount", "-l", str(world.at("/proc"))], check=False)


# -- 7. Mounts never leak to the host ---------------------------------------------------

def mount_table(mountinfo: str | Path = "/proc/self/mountinfo") -> dict[str, tuple[str, str, str]]:
    """mount id -> (mount point, per-mount options, fs type) of the host's namespace (or of
    the namespace whose mountinfo was saved in ``mountinfo``), in mount order."""
    table = {}
    for line in Path(mountinfo).read_text().splitlines():
        fields = line.split(" ")
        table[fields[0]] = (fields[4], fields[5], fields[fields.index("-", 6) + 1])
    return table


def assert_no_mount_leak(before: dict, after: dict, area: Path) -> None:
    """Mounts that exist in both tables kept their options (nothing turned read-only on the
    host), and nothing appeared or vanished in the test's own area. Mounts elsewhere may
    come and go: other tests may run in parallel."""
    for mount_id in before.keys() & after.keys():
        assert before[mount_id] == after[mount_id], f"host mount changed: {before[mount_id]} -> {after[mount_id]}"
    inside = lambda table: sorted(v for v in table.values() if v[0] == str(area) or v[0].startswith(f"{area}/"))
    assert inside(after) == inside(before)


@needs_root
@pytest.mark.parametrize("builder", BUILDERS)
def test_no_mount_leaks_with_shared_propagation(world, builder):
    use_builder(world, builder)
    subprocess.run(["mount", "--bind", str(world.root), str(world.root)], check=True)
    subprocess.run(["mount", "--make-rshared", str(world.root)], check=True)
    try:
        (world.at("/proc")).mkdir()
        subprocess.run(["mount", "-t", "proc", "proc", str(world.at("/proc"))], check=True)
        before = mount_table()
        ok(world.run(*prepare_args(*LINKS)))
        after = mount_table()
        assert_no_mount_leak(before, after, world.tmp)
        assert len([v for v in after.values() if v[0] == str(world.at("/proc"))]) == 1   # still there
    finally:
        subprocess.run(["umount", "-R", "-l", str(world.root)], check=True)


# -- 9. Broken OCI input ----------------------------------------------------------------

@pytest.mark.parametrize("case", ["root-is-slash", "root-links-to-slash", "crun-root-links-to-slash", "missing-bundle",
                                  "garbage", "empty", "not-an-object", "deep"])
def test_broken_oci_input_is_refused_and_nothing_is_written(world, case):
    probe = f"/tmp/hostagent-hook-refused-{uuid.uuid4().hex}"
    stdin = None
    config = world.bundle / "config.json"
    if case == "root-is-slash":
        config.write_text(json.dumps({"root": {"path": "/"}}))
    elif case == "root-links-to-slash":
        (world.bundle / "slash").symlink_to("/")
        config.write_text(json.dumps({"root": {"path": "slash"}}))
    elif case == "crun-root-links-to-slash":          # crun's root field, relative to the bundle
        (world.bundle / "slash").symlink_to("/")
        stdin = world.state(root="slash")
    elif case == "missing-bundle":
        stdin = world.state(bundle=str(world.tmp / "gone"))
    else:
        stdin = {"garbage": b"\x00\x01 not json", "empty": b"", "not-an-object": b"[1, 2]",
                 "deep": b"[" * 200_000}[case]
    proc = world.run("create-symlinks", "--link", f"x::{probe}/link", stdin=stdin)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and err.startswith("hostagent-hook: error: ") and err.count("\n") == 1, err
    assert not os.path.lexists(probe) and not os.path.lexists(world.root / probe.lstrip("/"))


def test_unknown_verbs_and_flags_warn_and_exit_zero(world):
    proc = world.run("enable-cuda-compat", "--host-driver-version=550.54.15", stdin=b"")
    assert proc.returncode == 0 and b"unknown verb 'enable-cuda-compat' ignored" in proc.stderr
    proc = world.run("create-symlinks", "--future-flag", "value", "--link", LINKS[0])
    assert proc.returncode == 0 and b"unknown flag '--future-flag' for create-symlinks ignored" in proc.stderr
    assert os.readlink(world.at(f"{LIB}/libcuda.so.1")) == "libcuda.so.550.54.15"


def test_a_hook_started_without_isolation_refuses_and_writes_nothing(world):
    """As the hostagent-hook console script starts it (installers drop interpreter flags):
    whatever PYTHONPATH planted would already have run, so the hook does not go on."""
    for env in (ENV, {**ENV, "PYTHONPATH": str(world.tmp / "elsewhere")}):
        proc = world.run(*prepare_args(*LINKS), env=env, isolated=False)
        assert proc.returncode == 1 and proc.stderr.startswith(b"hostagent-hook: error: not started isolated")
    assert not os.path.lexists(world.at(f"{LIB}/libcuda.so.1"))


def test_device_links_are_made_for_the_containers_own_nodes_only(world):
    config = json.loads((world.bundle / "config.json").read_text())
    config["linux"] = {"devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
                                   {"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2},
                                   {"path": "/dev/dri/renderD130", "type": "c", "major": 226, "minor": 130}]}
    (world.bundle / "config.json").write_text(json.dumps(config))
    links = []
    for bdf, card in (("0000:3b:00.0", 1), ("0000:5e:00.0", 2)):
        links += ["--device-link", f"../card{card}::/dev/dri/by-path/pci-{bdf}-card",
                  "--device-link", f"../renderD{128 + card}::/dev/dri/by-path/pci-{bdf}-render"]
    ok(world.run("create-symlinks", "--link", LINKS[0], *links, spec=True))
    by_path = world.at("/dev/dri/by-path")
    assert {n: os.readlink(by_path / n) for n in os.listdir(by_path)} == {
        "pci-0000:5e:00.0-card": "../card2", "pci-0000:5e:00.0-render": "../renderD130"}
    assert os.readlink(world.at(f"{LIB}/libcuda.so.1")) == "libcuda.so.550.54.15"


def test_a_bad_link_after_good_ones_changes_nothing(world):
    world.at("/etc/ld.so.conf.d").write_text("a file where a directory is expected")
    # A missing directory on the way does not hide the file after it: "/missing/.." is
    # checked, not made, before the first link.
    for bad in (f"x::{LIB}/..", "x::/etc/ld.so.conf.d/link", "x::/missing/../etc/ld.so.conf.d/link",
                f"x::{LIB}/new/../../../../missing/../etc/ld.so.conf.d/link"):
        proc = world.run("create-symlinks", "--link", LINKS[0], "--link", LINKS[1], "--link", bad)
        assert proc.returncode in (1, 2) and proc.stderr.count(b"\n") == 1, proc.stderr
        assert sorted(os.listdir(world.at(LIB))) == ["libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"]
        assert sorted(os.listdir(world.root)) == ["etc", "usr"] and os.listdir(world.at("/etc")) == ["ld.so.conf.d"]


@needs_root
def test_a_cache_refresh_that_cannot_write_its_config_makes_no_link(world):
    world.at("/etc/ld.so.conf.d").write_text("a file where a directory is expected")
    proc = world.run(*prepare_args(*LINKS))
    assert proc.returncode == 1 and b"cannot reach /etc/ld.so.conf.d" in proc.stderr, proc.stderr
    assert sorted(os.listdir(world.at(LIB))) == ["libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"]
    assert os.listdir(world.at("/etc")) == ["ld.so.conf.d"]


@needs_root
def test_a_second_start_rewrites_nothing(world):
    ok(world.run(*prepare_args(*LINKS)))
    paths = [world.at(p) for p in (f"{LIB}/libcuda.so.1", f"{LIB}/libcuda.so", "/etc/ld.so.conf",
                                   "/etc/ld.so.conf.d/00-hostagent.conf")]
    before = [os.lstat(p) for p in paths]
    ok(world.run(*prepare_args(*LINKS)))
    assert [(s.st_ino, s.st_mtime_ns) for s in map(os.lstat, paths)] == [(s.st_ino, s.st_mtime_ns) for s in before]
    assert world.at("/etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    assert sorted(os.listdir(world.at("/etc"))) == ["ld.so.cache", "ld.so.conf", "ld.so.conf.d"]


# -- The hook's total work is bounded ----------------------------------------------------

def bomb_library(size: int = 1 << 20, *, null: bool) -> bytes:
    """A 64-bit ELF shared object of ``size`` bytes with a dynamic segment of 64 KiB from
    offset 4 KiB: DT_STRTAB and DT_SONAME (libbomb.so.1) first, then DT_DEBUG entries, and a
    DT_NULL at its end (``null``: the longest dynamic segment a reader accepts) or none at
    all (it runs on to the end of the file: what a reader that stops only at DT_NULL walks)."""
    import struct
    ehdr, phdr, dyn = struct.Struct("<4sBBBBB7xHHIQQQIHHHHHH"), struct.Struct("<IIQQQQQQ"), struct.Struct("<qQ")
    start, length = 4096, (1 << 16 if null else size - 4096)
    strings = start + length
    head = ehdr.pack(b"\x7fELF", 2, 1, 1, 0, 0, 3, 62, 1, 0, ehdr.size, 0, 0, ehdr.size, phdr.size, 2, 64, 0, 0)
    head += phdr.pack(1, 4, 0, 0, 0, size, size, 4096) + phdr.pack(2, 6, start, start, start, length, length, 8)
    entries = [(5, strings), (14, 1)] + [(21, 0)] * (length // 16 - 3) + [(0, 0) if null else (21, 0)]
    body = head.ljust(start, b"\0") + b"".join(dyn.pack(*e) for e in entries)
    return (body + b"\0libbomb.so.1\0").ljust(size, b"\0")


@needs_root
@pytest.mark.parametrize("library", ["endless-dynamic", "longest-dynamic"])
def test_a_hostile_image_cannot_keep_the_hook_busy(world, library):
    """One 1 MiB library hard-linked 4000 times as libbombN.so.1 in the injected folder, and
    500 links ./bomb to it: each name was read whole (20 ms a name, 82 s for the names and
    12 s for the links). A file is read once per run, by its inode (read under each name,
    the longest dynamic segment accepted would take the run past its byte budget, and the
    cache to ldconfig), its dynamic segment no further than itself; one without DT_NULL
    there is ldconfig's to judge (it skips it, never having found DT_STRTAB's end)."""
    bomb = world.at(f"{LIB}/bomb")
    bomb.write_bytes(bomb_library(null=library == "longest-dynamic"))
    for i in range(4000):
        os.link(bomb, world.at(f"{LIB}/libbomb{i}.so.1"))
    for i in range(500):
        world.at(f"{LIB}/libsym{i}.so.1").symlink_to("./bomb")
    world.seal()
    started = time.monotonic()
    ok(world.run(*prepare_args(*LINKS)))
    elapsed = time.monotonic() - started
    world.assert_untouched()
    assert elapsed < 10, f"the hook took {elapsed:.1f} s"
    cache = world.cache()
    assert f"libcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1" in cache
    if library == "endless-dynamic":
        built_by(world, "ldconfig")
    else:
        built_by(world, "in-hook")
        assert f"libbomb.so.1 (libc6,x86-64) => {LIB}/libbomb.so.1" in cache


def test_the_runs_reading_is_bounded_and_its_own_work_has_a_deadline(world, monkeypatch):
    """Past the run's budget of names, files or bytes the hook reads nothing more and leaves
    the cache to ldconfig (``merged`` says None); past its deadline it fails."""
    from hostagent.hooks import budget, ldcache
    from hostagent.hooks.errors import HookError
    from hostagent.hooks.inroot import Root
    for i in range(40):
        write_shared_object(world.at(f"{LIB}/libmany{i}.so.1"), f"libmany{i}.so.1")
    world.seal()
    with Root(str(world.root)) as root:
        assert ldcache.merged(root, [LIB], None) is not None             # within the budget: the hook builds it
        for limit, value in (("MAX_NAMES", 20), ("MAX_FILES", 20), ("MAX_BYTES", 20 * 4096)):
            monkeypatch.setattr(budget, limit, value)
            run = budget.Budget()
            assert ldcache.merged(root, [LIB], None, run) is None, limit
            monkeypatch.undo()
        with pytest.raises(HookError, match="own work did not finish within"):
            ldcache.merged(root, [LIB], None, budget.Budget(seconds=-1))
    world.assert_untouched()
