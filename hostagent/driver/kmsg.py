"""The kernel log as ``/dev/kmsg`` gives it: the NVIDIA driver's lines and what they mean.

``/dev/kmsg`` returns one record per read (``PRIO,SEQ,USEC,FLAGS;MESSAGE``); opened
non-blocking, a read past the last record fails with EAGAIN. The same loop reads a
regular file (a simulated node's log) to its end. Reading needs CAP_SYSLOG where
``kernel.dmesg_restrict`` is set (the default on Debian and Ubuntu).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

from ..hostroot import HostRoot

__all__ = ["KernelLog", "read_kernel_log", "find", "PATTERNS"]

# Lines kept: the driver's own (NVRM, nvidia, nvidia-modeset...), module signing, nouveau,
# firmware loading.
_KEEP = re.compile(r"NVRM|nvidia|nouveau|[Mm]odule signature|unsigned module|Key was rejected|"
                   r"Direct firmware load")
_MAX_LINES = 400           # the newest kept lines; a node logging Xids for days stays bounded

# What a kept line means -> its pattern (the texts are the driver's and the kernel's own).
PATTERNS = {
    # The driver continues on the next record: "NVRM: this kernel module has the version ...".
    "api-mismatch": re.compile(r"NVRM: API mismatch: the client has the version ([^\s,]+)"),
    "unsigned-module": re.compile(r"Loading of unsigned module is rejected|Key was rejected by service|"
                                  r"module verification failed: signature"),
    "rm-init-failed": re.compile(r"RmInitAdapter failed"),
    "gsp-firmware": re.compile(r"Cannot initialize GSP firmware RM|RmFetchGspRmImages: No firmware image found|"
                               r"Direct firmware load for nvidia/\S+ failed|WPR2 already up"),
    "open-unsupported": re.compile(r"not supported by open nvidia\.ko"),
    "probe-not-called": re.compile(r"NVIDIA probe routine was not called|No NVIDIA (?:GPUs|devices) "
                                   r"(?:found|probed)"),
    "xid": re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)"),
}


@dataclass(frozen=True)
class KernelLog:
    readable: bool
    lines: tuple[str, ...] = ()       # the kept messages, oldest first
    error: str | None = None          # why it could not be read


def read_kernel_log(host: HostRoot) -> KernelLog:
    path = host.dev("kmsg")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return KernelLog(False, error=f"{path} does not exist")
    except PermissionError:
        if os.geteuid() != 0:
            return KernelLog(False, error=f"no permission to read {path} (run as root)")
        return KernelLog(False, error=f"{path} is closed to this process (a sandbox: the hostagent "
                                      "unit's ProtectKernelLogs=, a container without CAP_SYSLOG); "
                                      "'hostagent driver verify' as root from a shell reads it")
    kept: list[str] = []
    pending = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:      # the record was overwritten: go on
                    continue
                if e.errno in (errno.EAGAIN, errno.EINVAL):
                    break
                raise
            if not chunk:
                break
            pending += chunk
            *records, pending = pending.split(b"\n")
            for record in records:
                _keep(record, kept)
    finally:
        os.close(fd)
    _keep(pending, kept)
    return KernelLog(True, tuple(kept[-_MAX_LINES:]))


def _keep(record: bytes, kept: list[str]) -> None:
    if not record or record.startswith(b" "):     # continuation lines (KEY=value) are metadata
        return
    text = record.decode(errors="replace")
    message = text.split(";", 1)[1] if ";" in text[:40] else text
    if _KEEP.search(message):
        kept.append(message)


def find(log: KernelLog, kind: str) -> list[re.Match]:
    """The matches of ``PATTERNS[kind]`` in the log's kept lines, oldest first."""
    pattern = PATTERNS[kind]
    return [m for m in map(pattern.search, log.lines) if m]
