"""The driver's device nodes, made by the agent itself where nothing made them (as
``nvidia-modprobe -c <minor> -u`` does): ``/dev/nvidiactl``, ``/dev/nvidia<minor>``,
``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and, with MIG on, the config and monitor
capability nodes. Majors come from ``/proc/devices``, so a node is only made for a driver
that registered its major."""

from __future__ import annotations

import os
import stat

from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot

__all__ = ["missing_nodes", "create_missing", "MODES"]

# nvidia-modprobe's modes: the GPU and UVM nodes are world read-write; MIG config is root's.
MODES = {"/dev/nvidia-caps/nvidia-cap1": 0o400, "/dev/nvidia-caps/nvidia-cap2": 0o444}


def missing_nodes(facts) -> list[tuple[str, int, int, int]]:
    """(path, major, minor, mode) of every expected node that does not exist."""
    from .checks.gpus import expected_nodes
    return [(path, major, minor, MODES.get(path, 0o666)) for path, major, minor in expected_nodes(facts)
            if major is not None and path not in facts.nodes]


def create_missing(host: HostRoot, *, dry_run: bool = False) -> list[str]:
    """Create the missing nodes (char devices; regular files on a simulated node built
    without the right to make device nodes, as its others are). Returns their paths."""
    from .probe import probe
    facts = probe(host)
    regular = facts.simulated and any(n.kind == "regular" for n in facts.nodes.values())
    made = []
    for path, major, minor, mode in missing_nodes(facts):
        target = host.dev(path.removeprefix("/dev/"))
        made.append(path)
        if dry_run:
            continue
        ensure_dir(target.parent, 0o755)
        if regular:
            write_atomic(target, f"simulated character device {major}:{minor}\n", mode=mode, durable=False)
        else:
            os.mknod(target, stat.S_IFCHR | mode, os.makedev(major, minor))
            os.chmod(target, mode)          # mknod applies the umask
    return made
