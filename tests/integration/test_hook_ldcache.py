"""The linker cache the hook writes, judged by glibc itself: the host's ldconfig, run on
the same root with the same folders, must list the same entries in the same order, and the
host's dynamic loader, chrooted into the root, must find the injected libraries through it.

Roots are small images (libraries with SONAME and development links, a library without a
SONAME, a linker script, a compat libcuda listed in ld.so.conf) with a cache their own
ldconfig built, plus driver libraries and the links a spec asks for. The hook runs as the
program runs in a spec (python3 -I -S -c ..., the OCI state on stdin).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent.hooks import elfso
from hostagent.sim.elf import write_shared_object

LIB = "/usr/lib/x86_64-linux-gnu"
DRIVER = "/opt/driver/lib"                      # not a default directory: only the cache finds it
LDCONFIG = "/sbin/ldconfig"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="ldconfig -r and chroot need root; CI runs the suite as root"),
    pytest.mark.skipif(elfso.HOST_FLAGS.get(62) is None, reason="the roots are built of x86-64 libraries"),
    pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="the host has no /sbin/ldconfig to compare with"),
]


class Image:
    def __init__(self, tmp: Path):
        self.bundle = tmp / "bundle"
        self.root = self.bundle / "rootfs"
        (self.root / "etc").mkdir(parents=True)
        (self.bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
        self.links: list[str] = []

    def at(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def library(self, path: str, soname: str | None, machine: str = "x86_64") -> None:
        self.at(path).parent.mkdir(parents=True, exist_ok=True)
        write_shared_object(self.at(path), soname or "placeholder.so", machine=machine)
        if soname is None:                                   # DT_SONAME retagged DT_DEBUG
            data = bytearray(self.at(path).read_bytes())
            at = data.index((14).to_bytes(8, "little") + (1).to_bytes(8, "little"))
            data[at:at + 8] = (21).to_bytes(8, "little")
            self.at(path).write_bytes(bytes(data))

    def symlink(self, path: str, target: str) -> None:
        self.at(path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, self.at(path))

    def build_cache(self) -> None:
        """The image's own cache, as `ldconfig` in its build made it."""
        subprocess.run([LDCONFIG, "-r", str(self.root), "-X", "-i"], check=True, capture_output=True)

    def run_hook(self, *folders: str) -> subprocess.CompletedProcess:
        from hostagent.cdi.spec import hook_command
        args = ["prepare"] + [a for link in self.links for a in ("--link", link)]
        args += [a for folder in folders for a in ("--folder", folder)]
        hook = hook_command(sys.executable, *args)
        state = json.dumps({"ociVersion": "1.0.2", "id": "t", "status": "creating", "pid": os.getpid(),
                            "bundle": str(self.bundle)}).encode()
        proc = subprocess.run(hook.args, input=state, env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc

    def listing(self, cache: str = "/etc/ld.so.cache") -> tuple[list[str], str]:
        """(the entries of `ldconfig -p`, who generated the cache)."""
        out = subprocess.run([LDCONFIG, "-p", "-C", str(self.at(cache))], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        return [line for line in out if line.startswith("\t")], out[-1]

    def oracle(self, *folders: str, conf: str = "/etc/ld.so.conf") -> list[str]:
        """What ldconfig itself makes of the root with these folders on its command line."""
        subprocess.run([LDCONFIG, "-r", str(self.root), "-X", "-i", "-C", "/oracle.cache", "-f", conf, *folders],
                       check=True, capture_output=True)
        return self.listing("/oracle.cache")[0]


def typical_image(tmp: Path) -> Image:
    image = Image(tmp)
    image.at("/etc/ld.so.conf").write_text("/usr/local/lib\n/usr/local/cuda/compat\n")
    image.library(f"{LIB}/libz.so.1.2.13", "libz.so.1")
    image.symlink(f"{LIB}/libz.so.1", "libz.so.1.2.13")
    image.symlink(f"{LIB}/libz.so", "libz.so.1")                         # development link: its own entry
    image.library(f"{LIB}/libbz2.so.1.0.4", "libbz2.so.1.0")
    image.symlink(f"{LIB}/libbz2.so.1", "libbz2.so.1.0.4")               # not the SONAME: counts as the library
    image.library(f"{LIB}/libc.so.6", "libc.so.6")
    image.at(f"{LIB}/libc.so").write_text("/* GNU ld script */\nGROUP ( libc.so.6 )\n")
    image.library("/usr/local/lib/libplugin.so", None)                   # no SONAME: its own name
    image.library("/usr/local/cuda/compat/libcuda.so.535.1", "libcuda.so.1")
    image.symlink("/usr/local/cuda/compat/libcuda.so.1", "libcuda.so.535.1")
    image.build_cache()
    return image


def add_driver(image: Image, folder: str = LIB) -> None:
    """The driver's libraries as the engine mounts them, and the links a spec asks for."""
    for name, soname in (("libcuda.so.550.54.15", "libcuda.so.1"), ("libnvidia-ml.so.550.54.15", "libnvidia-ml.so.1"),
                         ("libnvidia-glcore.so.550.54.15", "libnvidia-glcore.so.550.54.15")):
        image.library(f"{folder}/{name}", soname)
        if name != soname:
            image.links.append(f"{name}::{folder}/{soname}")
    image.links += [f"libcuda.so.1::{folder}/libcuda.so", f"libnvidia-ml.so.1::{folder}/libnvidia-ml.so"]


@pytest.mark.parametrize("folder", [LIB, DRIVER])
def test_the_cache_lists_what_ldconfig_lists_for_the_same_folders(tmp_path, folder):
    image = typical_image(tmp_path)
    add_driver(image, folder)
    image.run_hook(folder)
    entries, generator = image.listing()
    assert entries == image.oracle(folder)
    assert "hostagent-hook" in generator                                  # built in the hook, no ldconfig
    assert entries.index(f"\tlibcuda.so.1 (libc6,x86-64) => {folder}/libcuda.so.1") \
        < entries.index("\tlibcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1")
    image.run_hook(folder)                                                # a second start changes nothing
    assert image.listing()[0] == entries


def test_an_image_without_a_cache_gets_one_with_the_folders_libraries(tmp_path):
    image = Image(tmp_path)
    add_driver(image, DRIVER)
    add_driver(image, LIB)
    image.run_hook(LIB, DRIVER)
    entries, generator = image.listing()
    assert entries == image.oracle(LIB, DRIVER) and "hostagent-hook" in generator
    assert len(entries) == 10


def test_the_same_directory_under_another_path_is_not_listed_twice(tmp_path):
    """Merged /usr: the image's cache names /lib/x86_64-linux-gnu, the spec's folder is
    /usr/lib/x86_64-linux-gnu; each library stays listed once."""
    image = Image(tmp_path)
    image.at(LIB).mkdir(parents=True)
    image.symlink("/lib", "usr/lib")
    image.at("/etc/ld.so.conf").write_text("/lib/x86_64-linux-gnu\n")
    image.library(f"{LIB}/libz.so.1.2.13", "libz.so.1")
    image.symlink(f"{LIB}/libz.so.1", "libz.so.1.2.13")
    image.build_cache()
    add_driver(image, LIB)
    image.run_hook(LIB)
    entries, _ = image.listing()
    assert [e for e in entries if "libz" in e] == ["\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"]
    alias = lambda lines: sorted(line.replace("/usr/lib/", "/lib/") for line in lines)   # noqa: E731
    assert alias(entries) == alias(image.oracle(LIB))


@pytest.mark.parametrize("case", ["damaged-image-cache", "32-bit-library", "update-ldcache-without-folders"])
def test_what_the_hook_cannot_do_faithfully_is_left_to_ldconfig(tmp_path, case):
    image = typical_image(tmp_path)
    add_driver(image)
    if case == "damaged-image-cache":
        image.at("/etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1" + os.urandom(100))
    elif case == "32-bit-library":
        image.library(f"{LIB}/libcuda32.so.550.54.15", "libcuda32.so.1", machine="i386")
    if case == "update-ldcache-without-folders":
        image.links = []
        from hostagent.cdi.spec import hook_command
        hook = hook_command(sys.executable, "update-ldcache")
        state = json.dumps({"ociVersion": "1.0.2", "id": "t", "status": "creating", "pid": 1,
                            "bundle": str(image.bundle)}).encode()
        subprocess.run(hook.args, input=state, env={"PATH": "/usr/bin:/bin"}, cwd="/", check=True)
        expected = image.oracle()
    else:
        image.run_hook(LIB)
        expected = image.oracle(LIB)
    entries, generator = image.listing()
    assert entries == expected and generator.startswith("Cache generated by: ldconfig")


def test_the_images_loader_finds_the_injected_libraries_through_the_cache(tmp_path):
    """The host's own ld.so and libc, chrooted into the root, load a library that only the
    cache can find (its folder is no default directory); without the hook they cannot."""
    interpreter = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    libc = subprocess.run([interpreter, "--list", "/bin/true"], capture_output=True, text=True).stdout
    libc = next((line.split("=> ")[1].split(" (")[0] for line in libc.splitlines() if "libc.so.6 =>" in line), None)
    chroot = shutil.which("chroot")
    if not os.path.exists(interpreter) or libc is None or chroot is None:
        pytest.skip("no x86-64 glibc loader or chroot(1) on this host")
    image = Image(tmp_path)
    image.at("/lib64").mkdir()
    shutil.copy2(interpreter, image.at("/lib64/ld-linux-x86-64.so.2"))
    image.at(LIB).mkdir(parents=True)
    shutil.copy2(libc, image.at(f"{LIB}/libc.so.6"))
    image.at("/bin").mkdir()
    shutil.copy2("/bin/true", image.at("/bin/true"))
    add_driver(image, DRIVER)

    def preload() -> subprocess.CompletedProcess:
        return subprocess.run([chroot, str(image.root), "/lib64/ld-linux-x86-64.so.2", "--preload",
                               "libcuda.so.1 libnvidia-ml.so.1", "/bin/true"], env={"LD_DEBUG": "libs"},
                              capture_output=True, text=True)

    assert "cannot be preloaded" in preload().stderr                     # control: nothing finds them yet
    image.run_hook(DRIVER)
    proc = preload()
    assert proc.returncode == 0 and "cannot be preloaded" not in proc.stderr, proc.stderr
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert f"trying file={DRIVER}/{soname}" in proc.stderr


def test_a_second_start_reads_no_library_the_cache_lists_and_writes_nothing(tmp_path, monkeypatch):
    from hostagent.hooks import folderscan, hostbin, ldcache
    from hostagent.hooks.inroot import Root
    image = typical_image(tmp_path)
    add_driver(image)
    image.run_hook(LIB)
    before = os.stat(image.at("/etc/ld.so.cache"))
    opened = []
    real = folderscan.regular_at
    monkeypatch.setattr(folderscan, "regular_at", lambda fd, name: opened.append(name) or real(fd, name))
    exe = hostbin.open_ldconfig(LDCONFIG)
    try:
        with Root(str(image.root)) as root:
            ldcache.update(root, [LIB], exe, 10)
    finally:
        os.close(exe)
    after = os.stat(image.at("/etc/ld.so.cache"))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Only what no cache entry accounts for: the linker script, and a library whose only
    # link is not its SONAME (the image lacks libbz2.so.1.0).
    assert sorted(opened) == ["libbz2.so.1.0.4", "libc.so"]


# Random folders: SONAMEs that tie with the image's, links of every shape, files that are
# no library, and sometimes a 32-bit library (then ldconfig builds the cache, same result).
SONAMES = ["libcuda.so.1", "libnvidia-ml.so.1", "libfoo.so.10", "libfoo.so.9", "libbar-2.so.0", "libz.so.1",
           "libnvidia-glcore.so.570.86.15", "libnvidia-egl-gbm.so.1", "ld-linux-x86-64.so.2"]
driver_library = st.tuples(st.sampled_from(SONAMES), st.sampled_from(["", ".550.54.15", ".1.2"]),
                           st.sampled_from(["none", "soname", "soname+dev", "dev-to-file"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(image_sonames=st.lists(st.sampled_from(SONAMES), max_size=4, unique=True),
       driver=st.lists(driver_library, min_size=1, max_size=6, unique_by=lambda d: d[0]),
       extras=st.sets(st.sampled_from(["no-soname", "script", "dangling", "outside", "chain", "i386"])),
       cached=st.booleans())
def test_random_folders_come_out_as_ldconfig_makes_them(tmp_path_factory, image_sonames, driver, extras, cached):
    image = Image(tmp_path_factory.mktemp("root"))
    image.at("/etc/ld.so.conf").write_text("/usr/local/lib\n")
    for soname in image_sonames:
        image.library(f"/usr/local/lib/{soname}.0", soname)
        image.symlink(f"/usr/local/lib/{soname}", f"{soname}.0")
    if cached:
        image.build_cache()
    for soname, suffix, links in driver:
        name = soname + suffix
        image.library(f"{DRIVER}/{name}", soname)
        if "soname" in links and name != soname:
            image.links.append(f"{name}::{DRIVER}/{soname}")
        if "dev" in links and ".so" in soname:
            dev = soname[:soname.index(".so") + 3]
            image.links.append(f"{soname if links == 'soname+dev' else name}::{DRIVER}/{dev}")
    if "no-soname" in extras:
        image.library(f"{DRIVER}/libnosoname.so.3", None)
    if "script" in extras:
        image.at(f"{DRIVER}/libscript.so").write_text("GROUP ( libz.so.1 )\n")
    if "dangling" in extras:
        image.links.append(f"libmissing.so.1::{DRIVER}/libgone.so.1")
    if "outside" in extras:
        image.library("/opt/other/libout.so.1.0", "libout.so.1")
        image.links.append(f"/opt/other/libout.so.1.0::{DRIVER}/libout.so.1")
    if "chain" in extras:
        image.library(f"{DRIVER}/libchain.so.2.0.0", "libchain.so.2")
        image.links += [f"libchain.so.2.0.0::{DRIVER}/libchain.so.2.0", f"libchain.so.2.0::{DRIVER}/libchain.so"]
    if "i386" in extras:
        image.library(f"{DRIVER}/libthirtytwo.so.1", "libthirtytwo.so.1", machine="i386")
    image.run_hook(DRIVER)
    entries, generator = image.listing()
    built_here = "i386" not in extras
    assert ("hostagent-hook" in generator) == built_here
    # Without a cache of its own, the image's ld.so.conf folders were never searched (the
    # loader reads no ld.so.conf); the hook keeps it that way, ldconfig adds them.
    image.at("/etc/none.conf").write_text("")
    assert entries == image.oracle(DRIVER, conf="/etc/ld.so.conf" if cached or not built_here else "/etc/none.conf")
