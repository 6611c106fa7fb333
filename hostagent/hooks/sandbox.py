"""Run the host's ldconfig confined to the container root; return the cache it built.

ldconfig must read the image's files (ld.so.conf, its includes, every library directory)
and the image controls all of them. It runs in a child process that:

1. enters new mount, UTS, IPC and network namespaces and makes every mount private, so
   nothing it does to mounts reaches the host;
2. detaches every procfs mount under the container root: runc mounts /proc before
   createContainer hooks run, and that procfs's pid 1 (runc init) still has the host's
   root, so ``/proc/1/root`` would lead out of any chroot;
3. makes every mount read-only, nodev, nosuid and noexec (mount_setattr, or a remount per
   mount on kernels before 5.12) and checks the result in mountinfo, so ldconfig cannot
   write anywhere in the container or through a bind mount, nor open a device node;
4. chroots into the container root (re-opened in the new namespace and checked to be
   the same directory) and takes as working directory a detached tmpfs that no path
   reaches and whose ``..`` is itself: ldconfig writes the cache there (``-C ld.so.cache``,
   a relative path), and relative paths in a hostile ld.so.conf see only that empty place;
5. gets /dev/null as stdin and a log file in the scratch as stdout/stderr, resource limits
   (CPU time, address space, file size, open files, no core), an empty environment, all
   other descriptors closed, no new privileges, the parent-death signal, and the uid/gid
   of nobody where that user exists;
6. executes the checked, sealed copy of the host's static ldconfig by descriptor
   (``ldconfig -i -X``: no aux cache read, no links made: links are the hook's job).

The parent waits with a wall-clock deadline and kills it on expiry (include loops,
FIFOs, huge files), then reads the cache from the scratch and validates it. Writing it
into the container is the caller's job, through the safe resolver.

Everything the child needs is imported before the fork: after the chroot an import
would read the container's files, so the child also empties Python's import machinery.
"""

from __future__ import annotations

import errno
import os
import resource
import sys
import time

from . import mountinfo, sysc
from .errors import HookError
from .fileat import read_at

CACHE = "ld.so.cache"
LOG = "ldconfig.log"
MAX_CACHE = 64 << 20
SCRATCH_BYTES = 2 * MAX_CACHE + (1 << 20)
MAX_ADDRESS_SPACE = 4 << 30          # ldconfig maps each library whole
MAX_OPEN_FILES = 256                 # ends include loops quickly (fopen fails)
NOBODY = 65534
CACHE_MAGICS = (b"glibc-ld.so.cache1.1", b"ld.so-1.7.0")

_NAMESPACES = sysc.CLONE_NEWNS | sysc.CLONE_NEWUTS | sysc.CLONE_NEWIPC | sysc.CLONE_NEWNET
_LOCKDOWN = sysc.MOUNT_ATTR_RDONLY | sysc.MOUNT_ATTR_NOSUID | sysc.MOUNT_ATTR_NODEV | sysc.MOUNT_ATTR_NOEXEC
_REMOUNT = sysc.MS_REMOUNT | sysc.MS_BIND | sysc.MS_RDONLY | sysc.MS_NOSUID | sysc.MS_NODEV | sysc.MS_NOEXEC
_ATIME = {"noatime": sysc.MS_NOATIME, "nodiratime": sysc.MS_NODIRATIME,
          "relatime": sysc.MS_RELATIME, "strictatime": sysc.MS_STRICTATIME}


def run_ldconfig(root_fd: int, exe_fds: list[int], folders: list[str], timeout: float,
                 *, force_remount: bool = False) -> bytes:
    """The ld.so.cache ldconfig builds for the container at ``root_fd``."""
    try:
        root_path = os.readlink(f"/proc/self/fd/{root_fd}")
    except OSError as e:
        raise HookError(f"cannot find the container root's path in /proc ({e.strerror}); is /proc mounted?") from None
    if not root_path.startswith("/") or root_path.endswith(" (deleted)"):
        raise HookError(f"the container root is not reachable by path ({root_path})")
    st = os.fstat(root_fd)
    root_id = (st.st_dev, st.st_ino)
    argv = ["ldconfig", "-i", "-X", "-C", CACHE, "-f", "/etc/ld.so.conf", *folders]
    try:
        scratch = sysc.detached_tmpfs(SCRATCH_BYTES)
    except OSError as e:
        raise HookError(f"cannot create the ldconfig scratch space ({e}); needs root and Linux 5.2 or newer") from None
    try:
        log_fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666, dir_fd=scratch)
        null_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        err_r, err_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:                                  # child: never returns
            try:
                os.close(err_r)
                _child(root_path, root_id, scratch, log_fd, null_fd, exe_fds, err_w, argv,
                       int(timeout) + 1, parent, force_remount)
            except BaseException as e:
                try:
                    os.write(err_w, f"{e}".encode("utf-8", "replace")[:2000] or type(e).__name__.encode())
                finally:
                    os._exit(127)
        os.close(err_w)
        os.close(log_fd)
        os.close(null_fd)
        status = _wait(pid, timeout)
        failure = os.read(err_r, 4096)
        os.close(err_r)
        if failure:
            raise HookError(f"cannot confine ldconfig: {failure.decode('utf-8', 'replace')}")
        if status is None:
            raise HookError(f"ldconfig did not finish within {timeout:g} s (hostile or huge ld.so.conf?); "
                            "it was killed and the cache left as it was")
        if status != 0:
            raise HookError(f"ldconfig failed ({_describe(status)}): {_tail(read_at(scratch, LOG, 1 << 16))}")
        cache = read_at(scratch, CACHE, MAX_CACHE)
    finally:
        os.close(scratch)
    if cache is None:
        raise HookError("ldconfig wrote no cache")
    if len(cache) > MAX_CACHE or not cache.startswith(CACHE_MAGICS):
        raise HookError("ldconfig wrote something that is not a linker cache; not installing it")
    return cache


def _wait(pid: int, timeout: float) -> int | None:
    """Exit code (negative: killed by that signal), or None after killing it at the deadline."""
    try:
        pidfd = os.pidfd_open(pid)                   # Linux 5.3+: wake up exactly at exit
    except OSError:
        return _poll(pid, timeout)
    import select
    try:
        exited = select.select([pidfd], [], [], timeout)[0]
    finally:
        os.close(pidfd)
    if not exited:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return None
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _poll(pid: int, timeout: float) -> int | None:
    deadline, delay = time.monotonic() + timeout, 0.0001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.002)


def _child(root_path, root_id, scratch, log_fd, null_fd, exe_fds, err_w, argv, cpu, parent, force_remount):
    sysc.prctl(sysc.PR_SET_PDEATHSIG, 9)
    if os.getppid() != parent:                       # the hook died before prctl took effect
        os._exit(127)
    sysc.unshare(_NAMESPACES)
    sysc.mount(None, "/", None, sysc.MS_REC | sysc.MS_PRIVATE)
    hide_procfs(root_path)
    make_read_only(root_path, force_remount)
    # Descriptors opened before unshare still point into the engine's mounts: re-open the
    # root here so the chroot lands on this namespace's (now locked-down) copy.
    rfd = os.open(root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(rfd)
    if (st.st_dev, st.st_ino) != root_id:
        raise OSError(errno.ESTALE, f"{root_path} is no longer the container root")
    check_mounts(root_path)

    # Nothing may be imported from here on: it would come from the container.
    sys.meta_path.clear()
    sys.path_hooks.clear()
    sys.path_importer_cache.clear()
    sys.path.clear()
    os.fchdir(rfd)
    os.chroot(".")
    os.fchdir(scratch)

    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    keep, low = sorted({err_w, *exe_fds}), 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
    for limit, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, MAX_ADDRESS_SPACE),
                         (resource.RLIMIT_FSIZE, MAX_CACHE), (resource.RLIMIT_NOFILE, MAX_OPEN_FILES),
                         (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    try:                                             # fails where nobody is not mapped (user namespaces)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError:
        pass
    sysc.prctl(sysc.PR_SET_NO_NEW_PRIVS, 1)
    sysc.prctl(sysc.PR_SET_PDEATHSIG, 9)             # a uid change cleared it
    if os.getppid() != parent:
        os._exit(127)
    error = None
    for fd in exe_fds:                               # the sealed copy first, then the host file
        try:
            os.execve(fd, argv, {})
        except OSError as e:
            error = e
    raise OSError(error.errno if error else errno.ENOEXEC, f"cannot execute the host ldconfig: {error}")


def hide_procfs(root_path: str) -> None:
    """Detach every procfs mount under ``root_path`` (in the caller's private namespace)."""
    for _ in range(16):                              # stacked mounts come off one per pass
        procs = [m for m in mountinfo.read() if m.fstype == "proc" and mountinfo.under(m.point, root_path)]
        if not procs:
            return
        for m in sorted(procs, key=lambda m: -m.point.count("/")):
            try:
                sysc.umount2(m.point, sysc.MNT_DETACH | sysc.UMOUNT_NOFOLLOW)
            except OSError:
                pass                                 # check_mounts has the last word
    raise OSError(errno.EBUSY, f"procfs under {root_path} cannot be detached")


def make_read_only(root_path: str, force_remount: bool = False) -> None:
    if not force_remount:
        try:
            sysc.mount_setattr_recursive("/", _LOCKDOWN)
            return
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
    mounts = mountinfo.read()                        # before 5.12: one remount per mount
    base = mountinfo.containing(mounts, root_path)
    for m in mounts:
        if m is base or mountinfo.under(m.point, root_path):
            keep = 0
            for name in m.options:
                keep |= _ATIME.get(name, 0)
            sysc.mount(None, m.point, None, _REMOUNT | keep)


def check_mounts(root_path: str) -> None:
    """Every mount the chroot can reach must be read-only and nodev, and none may be procfs."""
    mounts = mountinfo.read()
    reach = [m for m in mounts if mountinfo.under(m.point, root_path)]
    base = mountinfo.containing(mounts, root_path)
    for m in reach + ([base] if base else []):
        if m.fstype == "proc":
            raise OSError(errno.EBUSY, f"procfs still mounted at {m.point}")
        if "ro" not in m.options or "nodev" not in m.options:
            raise OSError(errno.EROFS, f"{m.point} is still writable or allows devices ({','.join(sorted(m.options))})")


def _describe(status: int) -> str:
    if status >= 0:
        return f"exit status {status}"
    names = {9: "SIGKILL", 11: "SIGSEGV", 24: "SIGXCPU (CPU time limit)", 25: "SIGXFSZ (file size limit)"}
    return f"killed by {names.get(-status, f'signal {-status}')}"


def _tail(log: bytes | None, limit: int = 600) -> str:
    """The end of ldconfig's output as one printable line (it quotes image-controlled paths)."""
    if not log:
        return "no output"
    text = log.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else " " for c in text).strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]
