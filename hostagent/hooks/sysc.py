"""The few Linux system calls the ldconfig sandbox needs and Python 3.11 lacks (ctypes).

Imported only when the linker cache is refreshed: ctypes costs a few milliseconds.
Syscall numbers 430+ are the same on every architecture (the unified table since 5.1).
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 0x400, 0x800, 0x200000, 0x1000000
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT, _SYS_MOUNT_SETATTR = 430, 431, 432, 442
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_FSOPEN_CLOEXEC, _FSMOUNT_CLOEXEC = 0x1, 0x1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(_b(target), ctypes.c_int(flags)), f"umount {target}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr_recursive(path: str, attr_set: int) -> None:
    """Set mount attributes on the mount at ``path`` and every mount below it (Linux 5.12+;
    OSError ENOSYS before)."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    _check(_libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), _b(path),
                         ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
           "mount_setattr")


def detached_tmpfs(size: int, mode: str = "0777") -> int:
    """A descriptor of a new tmpfs attached to no mount namespace and reachable through no
    path (fsopen/fsmount, Linux 5.2+): a private scratch space. ``..`` from its root stays
    in it, so a process whose working directory it is cannot walk out of it."""
    call = _libc.syscall
    fs = _check(call(ctypes.c_long(_SYS_FSOPEN), b"tmpfs", ctypes.c_uint(_FSOPEN_CLOEXEC)), "fsopen tmpfs")
    try:
        for key, value in (("size", str(size)), ("mode", mode), ("nr_inodes", "64")):
            _check(call(ctypes.c_long(_SYS_FSCONFIG), ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_SET_STRING),
                        key.encode(), value.encode(), ctypes.c_int(0)), f"fsconfig {key}")
        _check(call(ctypes.c_long(_SYS_FSCONFIG), ctypes.c_int(fs), ctypes.c_uint(_FSCONFIG_CMD_CREATE),
                    None, None, ctypes.c_int(0)), "fsconfig create")
        return _check(call(ctypes.c_long(_SYS_FSMOUNT), ctypes.c_int(fs), ctypes.c_uint(_FSMOUNT_CLOEXEC),
                           ctypes.c_uint(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)), "fsmount")
    finally:
        os.close(fs)
