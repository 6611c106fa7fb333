"""The host's ldconfig: found, checked and copied before anything runs in the container.

* Only a host path is accepted (``--ldconfig-path`` must be absolute and is opened in the
  hook's own mount namespace, before any chroot); the container's ldconfig is never run.
* ``PATH.real`` is preferred when it exists: Ubuntu's ``/sbin/ldconfig`` is a shell
  wrapper around ``ldconfig.real``.
* It must be a static ELF executable (no PT_INTERP). It is executed after the chroot into
  the container root, where a dynamic binary's loader (``/lib64/ld-linux-x86-64.so.2``)
  and its libraries would be the image's: attacker code running as root.
* It runs from a sealed memfd copy, so neither the container nor anyone else can modify
  the running binary through /proc/<pid>/exe (the runc CVE-2019-5736 / CVE-2024-0135
  class). Where memfds cannot be executed (vm.memfd_noexec=2) the checked host file
  descriptor itself is executed.
"""

import posix

from .errors import HookError

MAX_BINARY = 64 << 20
_PT_INTERP = 3
_MFD_CLOEXEC, _MFD_ALLOW_SEALING, _MFD_EXEC = 0x1, 0x2, 0x10


def open_ldconfig(path: str) -> int:
    """A read-only descriptor of the checked host ldconfig."""
    if not path.startswith("/"):
        raise HookError(f"ldconfig path {path!r} must be an absolute path on the host")
    candidates = [path] if path.endswith(".real") else [path + ".real", path]
    for candidate in candidates:
        try:
            fd = posix.open(candidate, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise HookError(f"cannot open host ldconfig {candidate}: {e.strerror}") from None
        try:
            _check(fd, candidate)
        except BaseException:
            posix.close(fd)
            raise
        return fd
    raise HookError(f"host ldconfig {path} does not exist (pass --ldconfig-path with the host's static ldconfig)")


def _check(fd: int, path: str) -> None:
    st = posix.fstat(fd)
    if (st.st_mode & 0o170000) != 0o100000 or not st.st_mode & 0o111:
        raise HookError(f"host ldconfig {path} is not an executable regular file")
    if st.st_mode & 0o022:
        raise HookError(f"host ldconfig {path} is writable by group or others; refusing to run it as root")
    if st.st_size > MAX_BINARY:
        raise HookError(f"host ldconfig {path} is larger than {MAX_BINARY} bytes")
    head = posix.pread(fd, 64, 0)
    if head[:2] == b"#!":
        raise HookError(f"host ldconfig {path} is a script, and no {path}.real exists; "
                        "pass --ldconfig-path with the static ldconfig binary")
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise HookError(f"host ldconfig {path} is not an ELF executable")
    if has_interpreter(fd, head):
        raise HookError(f"host ldconfig {path} is dynamically linked; it runs chrooted in the "
                        "container, where its loader would be the image's. Use a static ldconfig")


def has_interpreter(fd: int, head: bytes) -> bool:
    """Whether the ELF file has a PT_INTERP program header (is dynamically linked)."""
    wide, order = head[4] == 2, "little" if head[5] == 1 else "big"

    def num(b: bytes, off: int, size: int) -> int:
        return int.from_bytes(b[off:off + size], order)

    if wide:
        phoff, phentsize, phnum = num(head, 32, 8), num(head, 54, 2), num(head, 56, 2)
    else:
        phoff, phentsize, phnum = num(head, 28, 4), num(head, 42, 2), num(head, 44, 2)
    if phnum == 0 or phentsize < 4 or phnum > 4096:
        return phnum != 0                        # nonsense headers: treat as not static
    table = posix.pread(fd, phentsize * phnum, phoff)
    if len(table) < phentsize * phnum:
        return True
    return any(num(table, i * phentsize, 4) == _PT_INTERP for i in range(phnum))


def sealed_copy(fd: int) -> int | None:
    """An executable memfd holding a copy of ``fd``, sealed against every change; None when
    the kernel refuses (then the caller executes ``fd`` itself)."""
    import fcntl
    try:
        try:
            mfd = posix.memfd_create("hostagent-ldconfig", _MFD_CLOEXEC | _MFD_ALLOW_SEALING | _MFD_EXEC)
        except OSError:                          # kernels before 6.3 do not know MFD_EXEC
            mfd = posix.memfd_create("hostagent-ldconfig", _MFD_CLOEXEC | _MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        size, offset = posix.fstat(fd).st_size, 0
        while offset < size:
            sent = posix.sendfile(mfd, fd, offset, size - offset)
            if sent <= 0:
                raise OSError("short copy")
            offset += sent
        fcntl.fcntl(mfd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    except OSError:
        posix.close(mfd)
        return None
    return mfd
