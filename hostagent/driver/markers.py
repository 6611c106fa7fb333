"""The GPU operator's driver readiness marker, ``/run/nvidia/validations/driver-ready``.

Its validator writes the file once the driver works, as shell ``KEY=VALUE`` lines that
other operands source (``set -o allexport; . driver-ready``), and deletes it when the
driver must be validated again; operator components wait for it before they start. The
keys are the validator's, with the values it writes for a driver installed on the host
(``IS_HOST_DRIVER=true``, roots ``/``, seen at ``/host`` from the operator's containers) or in
another root such as the driver container's ``/run/nvidia/driver``.
"""

from __future__ import annotations

from ..fileio import ensure_dir, remove, write_atomic
from ..hostroot import HostRoot

__all__ = ["DRIVER_READY", "WRITTEN_BY", "driver_ready_content", "Markers"]

DRIVER_READY = "driver-ready"
# The first line of every marker hostagent writes into a folder others write to too: the
# package's purge removes exactly the files that start with it (packaging/common/purge.sh),
# and a shell that sources the marker reads a comment.
WRITTEN_BY = "# written by hostagent"


def driver_ready_content(host: HostRoot) -> str:
    driver = host.shown(host.driver())
    dev = host.shown(host.dev().parent)
    on_host = driver == "/"
    return (f"{WRITTEN_BY}\n"
            f"IS_HOST_DRIVER={'true' if on_host else 'false'}\n"
            f"NVIDIA_DRIVER_ROOT={driver}\n"
            f"DRIVER_ROOT_CTR_PATH={'/host' if on_host else driver}\n"
            f"NVIDIA_DEV_ROOT={dev}\n"
            f"DEV_ROOT_CTR_PATH={'/host' if dev == '/' else dev}\n")


class Markers:
    def __init__(self, host: HostRoot, directory: str, enabled: bool = True):
        self.host = host
        self.enabled = enabled
        self.path = host.host(directory) / DRIVER_READY

    def written(self) -> bool:
        return self.path.exists()

    def ready(self) -> bool:
        """Write the marker (atomically) unless it already says the same; True if written."""
        if not self.enabled:
            return False
        content = driver_ready_content(self.host)
        try:
            if self.path.read_text() == content:
                return False
        except OSError:
            pass
        ensure_dir(self.path.parent, 0o755)
        write_atomic(self.path, content, mode=0o644)
        return True

    def not_ready(self) -> bool:
        """Remove the marker if hostagent wrote it (another writer's is not ours to remove);
        True if there was one."""
        if not self.enabled or not self.ours():
            return False
        remove(self.path)
        return True

    def ours(self) -> bool:
        try:
            with open(self.path) as f:
                return f.readline().rstrip("\n") == WRITTEN_BY
        except (OSError, UnicodeDecodeError):
            return False
