"""One folder per test run, and nothing left behind: every temporary folder of the run (pytest's
``tmp_path``, ``tempfile`` in the tests and in the programs they start, the simulated nodes)
is made inside it, and at the end of the run (also after a failure, ``-x`` or Ctrl-C) the
processes the run started and still running are stopped and the folder removed.

A process belongs to the run when its environment carries the run's marker (every child
inherits it) or its command line names the folder (the MPS daemons, which get a clean
environment, run from a simulated node inside it).

A parallel run (pytest-xdist) has one folder too: its workers ``join`` the one their
controller made, each with a temporary folder of its own in it, and the controller sweeps it
once they are done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["MARKER", "begin", "join", "sweep", "others_can_read", "readable_copy"]

MARKER = "HOSTAGENT_TEST_RUN"


def begin() -> Path:
    """Make the run's folder (others may traverse it: some tests run commands as another
    user on nodes inside) and point ``tempfile`` and the programs the tests start at its
    ``t``. Names are short: a simulated node's sockets must fit in 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="ha-tests-"))
    folder.chmod(0o711)
    tmp = folder / "t"
    tmp.mkdir()
    tmp.chmod(0o1777)             # as /tmp: commands run as another user make files there too
    os.environ[MARKER] = str(folder)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    return folder


def join(worker: str) -> Path:
    """In the worker ``worker`` (``gw0``, ``gw1``, ...) of a parallel run: the run's folder,
    which the controller made, with the worker's own temporary folder ``t<n>`` in it (as short
    as the controller's ``t``). The worker leaves its pid there: the controller's sweep, which
    may run before the workers have exited, does not take them for what a test left."""
    folder = Path(os.environ[MARKER])
    tmp = folder / f"t{worker.removeprefix('gw')}"
    tmp.mkdir()
    tmp.chmod(0o1777)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = str(tmp)
    (folder / "workers").mkdir(exist_ok=True)
    (folder / "workers" / str(os.getpid())).touch()
    return folder


def _workers(folder: Path) -> set[int]:
    try:
        return {int(name) for name in os.listdir(folder / "workers")}
    except OSError:
        return set()


def _ours(proc, folder: str) -> bool:
    import psutil
    try:
        if proc.environ().get(MARKER) == folder:
            return True
        return any(folder in arg for arg in proc.cmdline())
    except (psutil.Error, OSError):
        return False


def _unmount(folder: str) -> list[str]:
    """Unmount what the run left mounted inside the folder (an MPS tmpfs), deepest first."""
    import subprocess
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return []
    inside = sorted((p for p in points if p.startswith(folder + "/")), key=len, reverse=True)
    for point in inside:
        subprocess.run(["umount", "-l", point], capture_output=True)
    return inside


def sweep(folder: Path, remove: bool) -> list[str]:
    """Stop the run's processes still running (SIGTERM, then SIGKILL), unmount what it left
    mounted, and (``remove``) remove the folder. Returns what was left behind."""
    import psutil
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents()), *_workers(folder)}
    left = [p for p in psutil.process_iter() if p.pid not in me and _ours(p, str(folder))]
    found = []
    for p in left:
        try:
            found.append(f"process {p.pid}: {' '.join(p.cmdline())[:200]}")
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=3)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=3)
    found += [f"mount {m}" for m in _unmount(str(folder))]
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
    return found


def others_can_read(path) -> bool:
    """Whether a user who is neither the owner nor in the group may read ``path`` (every
    folder on the way searchable, the file or folder itself readable)."""
    path = Path(path).resolve()
    try:
        for folder in path.parents:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _closure(name: str, found: dict) -> dict:
    """The installed distributions ``name`` needs to run (extras left out), by name."""
    import importlib.metadata as md
    import re
    dist = md.distribution(name)
    key = dist.metadata["Name"].lower()
    if key not in found:
        found[key] = dist
        for req in dist.requires or ():
            if "extra ==" not in req:
                with contextlib.suppress(md.PackageNotFoundError):
                    _closure(re.match(r"[A-Za-z0-9_.-]+", req).group(0), found)
    return found


def readable_copy(extra: tuple[Path, ...] = ()) -> Path:
    """A folder any user may read holding hostagent, what it needs to run and ``extra``
    files, for commands run as another user where this checkout or its venv is private (a
    home folder is 0700): with it first on their PYTHONPATH they import nothing from here.
    Made once per run, in the run's folder."""
    import hostagent
    dest = Path(os.environ[MARKER]) / "readable"
    if not dest.exists():
        work = dest.with_name("readable.tmp")
        shutil.copytree(Path(hostagent.__file__).parent, work / "hostagent",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for key, dist in _closure("hostagent", {}).items():
            if key == "hostagent":
                continue
            for rel in dist.files or ():
                source = Path(dist.locate_file(rel))
                if source.is_file() and "__pycache__" not in rel.parts and ".." not in rel.parts:
                    (work / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, work / rel)
        for path in extra:
            shutil.copy2(path, work / path.name)
        for folder, _, files in os.walk(work):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644 | (os.stat(os.path.join(folder, name)).st_mode & 0o111))
        work.rename(dest)
    return dest
