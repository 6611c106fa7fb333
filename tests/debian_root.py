"""A clean Debian 12 root for tests that install things (packages, drivers) on a real
distribution: made by mmdebstrap from Debian's own packages, once, and cached by its
inputs, so a test session pays for it only the first time on a machine.

    tarball = root_tarball()                  # minbase + systemd, dbus, python3 (bookworm)
    image = podman_image(tarball)             # localhost/hostagent-test-debian:<key>
    with booted(image) as box:                # systemd as PID 1 in podman
        box.sh("apt-get install -y ./x.deb")

    root = extract(root_tarball(()), dest)    # a plain minbase root in a folder, for chroot
    chroot(root, "apt-get", "install", "-y", "x")
    with overlay(base, work, target):         # a copy of a prepared root for one test
        ...

Everything skips, saying why, where root, mmdebstrap, podman or Debian's archive is
missing; mmdebstrap failing while the archive answers fails the tests instead (a skip would
hide the install tests behind a green run). The cache is $HOSTAGENT_TEST_CACHE, else $XDG_CACHE_HOME/hostagent-tests, else
~/.cache/hostagent-tests; delete it to start over.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests import programs

__all__ = ["BASE_PACKAGES", "cache_dir", "root_tarball", "podman_image", "booted", "Booted", "extract",
           "chroot", "overlay"]

BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3")
SUITE = "bookworm"
PODMAN_LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def cache_dir() -> Path:
    base = os.environ.get("HOSTAGENT_TEST_CACHE")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hostagent-tests")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _require(*tools: str) -> None:
    programs.require(*tools, root_for="a Debian root and systemd in podman")


@contextlib.contextmanager
def _locked(path: Path):
    """One builder per cache entry, across processes (other sessions share the cache)."""
    with open(path.with_suffix(".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def root_tarball(include: tuple[str, ...] = BASE_PACKAGES, suite: str = SUITE) -> Path:
    """``mmdebstrap --variant=minbase --include=...`` as a tarball, cached by its arguments."""
    _require("mmdebstrap")
    # --format=tar: the partial file's name has no extension that says so, and mmdebstrap
    # would make a folder; an empty --include is a usage error, so it is left out then.
    args = ["--variant=minbase", "--format=tar"]
    args += [f"--include={','.join(sorted(include))}"] if include else []
    args.append(suite)
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:16]
    tarball = cache_dir() / f"debian-{suite}-{key}.tar"
    with _locked(tarball):
        if not tarball.exists():
            partial = tarball.with_suffix(f".{os.getpid()}.partial")
            done = subprocess.run(["mmdebstrap", "--quiet", *args, str(partial)], capture_output=True, text=True)
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                tail = " ".join(done.stderr.strip().splitlines()[-3:])
                unreachable = _archive_unreachable(suite)
                if unreachable:
                    pytest.skip(f"Debian's archive cannot be reached ({unreachable}), so mmdebstrap could not "
                                f"make a Debian root: {tail}")
                # The archive answers: a failure here is a bug (arguments, packages, the
                # tool), never a reason to skip the tests that need the root.
                pytest.fail(f"mmdebstrap could not make a Debian root, though Debian's archive answers: {tail}",
                            pytrace=False)
            partial.rename(tarball)
    return tarball


ARCHIVE = "http://deb.debian.org/debian"      # mmdebstrap's default mirror


def _archive_unreachable(suite: str) -> str | None:
    """Why Debian's archive cannot be reached (no network, no name resolution, no answer),
    or None when it answers with the suite's Release file."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"{ARCHIVE}/dists/{suite}/Release", timeout=15) as reply:
            reply.read(64)
        return None
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def podman_image(tarball: Path) -> str:
    """The tarball imported into podman once: ``localhost/hostagent-test-debian:<key>``."""
    _require("podman", "runc")
    tag = f"localhost/hostagent-test-debian:{tarball.stem.rsplit('-', 1)[-1]}"
    with _locked(tarball):
        if subprocess.run(["podman", "image", "exists", tag]).returncode != 0:
            subprocess.run(["podman", "import", "-q", str(tarball), tag], check=True, capture_output=True)
    return tag


class Booted:
    """A running container with systemd as PID 1."""

    def __init__(self, name: str):
        self.name = name

    def run(self, *cmd: str, check: bool = True, user: str | None = None, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess:
        exec_cmd = ["podman", "exec", "-i"] + (["--user", user] if user else []) + [self.name, *cmd]
        done = subprocess.run(exec_cmd, capture_output=True, text=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        return self.run("sh", "-ec", script, **kw)

    def copy_in(self, source: Path, target: str) -> None:
        subprocess.run(["podman", "cp", str(source), f"{self.name}:{target}"], check=True)

    def wait_until(self, script: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = self.sh(script, check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not true after {timeout:.0f} s: {script}\n{done.stdout}{done.stderr}")
            time.sleep(0.3)


@contextlib.contextmanager
def booted(image: str, *flags: str):
    """Boot ``image`` with systemd (``--systemd=always --runtime runc``); removed afterwards.
    ``--privileged`` stands in for a host: the units' sandboxing (mount namespaces,
    device policies) needs what a real machine's systemd has."""
    _require("podman", "runc")
    name = f"hostagent-boot-{uuid.uuid4().hex[:10]}"
    subprocess.run(["podman", "run", "-d", "--name", name, "--runtime", "runc", "--systemd=always", "--privileged",
                    *PODMAN_LIMITS, *flags, image, "/sbin/init"], check=True, capture_output=True)
    box = Booted(name)
    try:
        box.wait_until("systemctl is-system-running | grep -Eq 'running|degraded'", timeout=60)
        yield box
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)


def extract(tarball: Path, dest: Path) -> Path:
    """Unpack ``tarball`` into ``dest`` (device nodes and owners as built: run as root)."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(dest), "--numeric-owner"], check=True)
    return dest


def chroot(root: Path, *argv: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``root`` (its own programs and files)."""
    environ = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive",
               **(env or {})}
    proc = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, env=environ,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed in {root}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@contextlib.contextmanager
def overlay(base: Path, work: Path, target: Path):
    """A writable copy of the root ``base`` at ``target`` for one test: an overlay mount
    (instant) where the kernel offers one, else a full copy. Removed afterwards. (A copy at
    the path the root was built at keeps paths written into it, as a simulated node's
    tools have, pointing at the copy.)"""
    upper, scratch = work / "upper", work / "work"
    for d in (target, upper, scratch):
        d.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                              f"lowerdir={base},upperdir={upper},workdir={scratch}", str(target)],
                             capture_output=True).returncode == 0
    if not mounted:
        subprocess.run(["cp", "-a", f"{base}/.", str(target)], check=True)
    try:
        yield target
    finally:
        if mounted:
            subprocess.run(["umount", str(target)], capture_output=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
