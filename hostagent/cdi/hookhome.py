"""Where the host's engines find the hook program CDI specs run.

On a host (or a simulated node) hostagent is installed where it runs, and specs start the
hook with this interpreter from this installation. Run from a container with the host
mounted (``--host-root``), neither exists on the host: the specs name the host's own
python3 and a copy of the hook program (``hostagent/hooks``: standard library only) that
hostagent keeps under the host's ``/var/lib/hostagent/hook``, as the NVIDIA toolkit's
DaemonSet copies its hook binary onto the host.

A simulated node whose host runs neither (a kind node: no python3, no hostagent) is given
specs without the hook (``hook.in_cdi_specs: false``); a real node's specs always have it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, NotFoundError
from ..fileio import ensure_dir, remove, write_atomic
from ..hostroot import HostRoot

__all__ = ["HookHome", "hook_home", "hook_in_specs", "install_hook_program", "HOOK_COPY_DIR"]

HOOK_COPY_DIR = "/var/lib/hostagent/hook"          # on the host; holds hostagent/hooks
HOST_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
_PACKAGE = Path(__file__).resolve().parents[1]       # hostagent/


@dataclass(frozen=True)
class HookHome:
    interpreter: str        # as the host runs it
    import_path: str        # the folder holding the hostagent package, on the host
    in_specs: bool = True   # False: CDI specs start no hook (a simulated node only)

    @property
    def spec_interpreter(self) -> str | None:
        """The interpreter CDI specs start the hook with; None: they start none."""
        return self.interpreter if self.in_specs else None


def hook_in_specs(host: HostRoot, section: dict, where: str | None = None) -> bool:
    """Whether CDI specs start the hook, by the configuration's ``hook`` section. Leaving it
    out is for a simulated node only: a real node's containers need what it does (library
    links, the linker cache, /dev/dri/by-path links)."""
    if section.get("in_cdi_specs", True):
        return True
    if not host.simulated:
        raise ConfigError("hook.in_cdi_specs: false is for a simulated node only", where=where,
                          hint="remove it: a real node's containers need the hook's library links and linker "
                               "cache")
    return False


def hook_home(host: HostRoot, interpreter: str | None = None, *, in_specs: bool = True) -> HookHome:
    """The hook's interpreter (``interpreter``: hook.interpreter of the configuration) and
    import path, as the host's engines run them; ``in_specs``: ``hook_in_specs``."""
    if not host.mounted:
        from .spec import HOOK_IMPORT_PATH   # the daemon's settings check hook_in_specs: kept light
        return HookHome(interpreter or sys.executable, HOOK_IMPORT_PATH, in_specs)
    candidates = (interpreter,) if interpreter else HOST_PYTHONS
    for path in candidates:
        real = host.resolve(host.host(path))
        if real.is_file() and os.access(real, os.X_OK):
            return HookHome(path, HOOK_COPY_DIR, in_specs)
    raise NotFoundError(f"the host has no {' or '.join(candidates)} to run the hook CDI specs start",
                        where=str(host.root),
                        hint="install python3 on the host, or name its interpreter as hook.interpreter "
                             "in the configuration")


def _program_files() -> dict[str, bytes]:
    """Package-relative path -> content of what the hook imports: the package's
    ``__init__`` and ``hooks``."""
    files = {"hostagent/__init__.py": (_PACKAGE / "__init__.py").read_bytes()}
    for path in sorted((_PACKAGE / "hooks").glob("*.py")):
        files[f"hostagent/hooks/{path.name}"] = path.read_bytes()
    return files


def install_hook_program(host: HostRoot) -> bool:
    """Keep the host's copy of the hook program equal to this one (files written atomically,
    only those that differ; stale ones removed); True if anything changed."""
    base = host.host(HOOK_COPY_DIR)
    changed = False
    wanted = _program_files()
    for rel, data in wanted.items():
        path = base / rel
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            pass
        ensure_dir(path.parent, 0o755)
        write_atomic(path, data, mode=0o644)
        changed = True
    for folder in (base / "hostagent", base / "hostagent/hooks"):
        for path in folder.glob("*.py") if folder.is_dir() else ():
            if str(path.relative_to(base)) not in wanted:
                remove(path)
                changed = True
    return changed
