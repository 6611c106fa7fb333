"""GPU reset for Ampere MIG mode changes: ``nvidia-smi -r -i <bus ids>`` on the GPUs that
need it only (mig-parted resets every GPU of the node).

NVML has no reset call hostagent can use, so this runs the driver's own tool, found under
the host's driver root.
"""

from __future__ import annotations

import subprocess

from ..errors import NotFoundError, StateError
from ..hostroot import HostRoot

__all__ = ["reset_gpus", "nvidia_smi"]

RESET_TIMEOUT = 300.0


def nvidia_smi(host: HostRoot) -> list[str]:
    """The command line of the host's nvidia-smi (``HostRoot.driver_command``)."""
    command = host.driver_command("nvidia-smi")
    if command is not None:
        return command
    raise NotFoundError("nvidia-smi is needed to reset GPUs and was not found", where=str(host.driver("usr/bin/nvidia-smi")),
                        hint="install the NVIDIA driver utilities, or apply with --mode-only "
                             "--skip-reset and reboot")


def reset_gpus(host: HostRoot, bus_ids: list[str], *, timeout: float = RESET_TIMEOUT) -> None:
    """Reset exactly these GPUs; all or nothing, as nvidia-smi does it."""
    cmd = [*nvidia_smi(host), "-r", "-i", ",".join(bus_ids)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StateError(f"GPU reset of {', '.join(bus_ids)} did not finish in {timeout:.0f} s",
                         hint="check the GPUs with nvidia-smi; a reboot applies pending MIG modes") from None
    except OSError as e:
        raise StateError(f"cannot run {cmd[0]}: {e.strerror}") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if ln.startswith("GPU ")), lines[0] if lines else "no output")
        in_use = any("in use" in ln.lower() for ln in lines)
        raise StateError(f"GPU reset of {', '.join(bus_ids)} failed (nvidia-smi exit {done.returncode}: "
                         f"{detail})", **({"in_use": True} if in_use else {}),
                         hint="stop what uses these GPUs (CUDA processes, nvidia_drm, "
                              "nvidia-persistenced, DCGM) and retry, or reboot")
