"""Real container engines: images are built from local tarballs, never pulled."""

import contextlib
import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests import programs

BUSYBOX_APPLETS = ("sh", "true", "ls", "cat", "readlink", "grep", "echo", "test", "stat", "find", "env", "id",
                   "sleep", "rm", "mkfifo", "ln")
PODMAN_FLAGS = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def require(*tools):
    programs.require(*tools, root_for="container engines")


@contextlib.contextmanager
def host_cdi_spec(name: str, text: str):
    """A spec file in the host's /etc/cdi (podman 4.3 reads no other folder but /var/run/cdi)
    for the duration: the file is removed afterwards, and so is /etc/cdi if this made it
    and it is empty again, so the host is left as found whether or not it had the folder."""
    folder = Path("/etc/cdi")
    made = not folder.exists()
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = folder / name
    try:
        path.write_text(text)
        yield path
    finally:
        path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):       # not empty: someone else's spec is there
                folder.rmdir()


def build_rootfs(root: Path) -> Path:
    """busybox-static plus the host's static ldconfig: enough to check device nodes,
    mounts, links and the linker cache from inside a container."""
    busybox = Path("/bin/busybox")
    ldconfig = Path("/sbin/ldconfig")
    for d in ("bin", "sbin", "etc/ld.so.conf.d", "dev", "proc", "sys", "tmp", "usr/lib/x86_64-linux-gnu"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin/busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    shutil.copy2(ldconfig, root / "sbin/ldconfig")
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    return root


def import_image(root: Path, repo: str):
    """Import the tree ``root`` as podman image ``localhost/<repo>:<content hash>``; yields
    the tag and removes the image afterwards (``yield from`` it in a fixture)."""
    require("podman", "runc")
    tarball = root.parent / f"{root.name}.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(root, arcname=".")
    tag = f"localhost/{repo}:" + hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    subprocess.run(["podman", "import", "-q", str(tarball), tag], check=True, capture_output=True)
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)


@pytest.fixture(scope="session")
def podman_image(tmp_path_factory):
    require("podman", "runc", "busybox")
    yield from import_image(build_rootfs(tmp_path_factory.mktemp("rootfs")), "hostagent-e2e")


def podman_run(image: str, *args: str, devices=(), flags=(), check=True) -> subprocess.CompletedProcess:
    cmd = ["podman", "run", "--rm", *PODMAN_FLAGS]
    for d in devices:
        cmd += ["--device", d]
    proc = subprocess.run(cmd + [*flags, image, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


# The package tests' session fixtures: the deb and a clean Debian root.
from .packages import deb_package, debian_image, debian_tarball, rpm_package, staged_tree  # noqa: E402,F401
