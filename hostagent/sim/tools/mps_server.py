"""``nvidia-cuda-mps-server`` stand-in, started by the control daemon (``start_server``).

Reproduced behaviour: logs to ``server.log`` in ``$CUDA_MPS_LOG_DIRECTORY`` (default
``<root>/var/log/nvidia-mps``) with the real line shape (``[... Server 12345] Startup``),
creates a context on every device it may use and so holds those GPUs on the simulated
node (``nvidia-smi`` lists it, and a GPU reset is refused while it runs), then waits
until SIGTERM or SIGINT, drops its holds and exits 0.

The devices are those ``CUDA_VISIBLE_DEVICES`` names (GPU index or UUID, MIG UUID; like
CUDA, entries after the first one that does not resolve are ignored), or every GPU
when it is unset. Lost GPUs are skipped, and so are MIG-enabled GPUs named as whole
GPUs (CUDA cannot use them whole). With the driver unloaded the server logs the
failure and exits 1.

The compute mode applies to the server's contexts as to any process's: "Exclusive-mode
restrictions are applied to the MPS server, not MPS clients" (NVIDIA's MPS documentation,
Limitations). A PROHIBITED device, or an EXCLUSIVE_PROCESS one another process already
holds, refuses the context; the server logs CUDA's error and exits 1, holding nothing.
The control daemon learns the outcome through the descriptor named by
``HOSTAGENT_SIM_SERVER_READY`` (one byte ``1``, or ``0`` and the reason).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from . import log_line

__all__ = ["main"]

NAME = "nvidia-cuda-mps-server"
READY_ENV = "HOSTAGENT_SIM_SERVER_READY"
USED_MIB = 30     # a server context's footprint on each device


def main(root: str, argv: list[str]) -> int:
    logs = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or os.path.join(root, "var/log/nvidia-mps"))
    logs.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        log_line(logs / "server.log", "Server", message)

    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)   # no race with sigwait below
    log("Startup")
    from ..store import SimStore
    store = SimStore(root)
    try:
        held = _hold(store, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except RuntimeError as e:
        log(str(e))
        _tell(b"0" + str(e).encode())
        return 1
    for text in held:
        log(f"Creating server context on device {text}")
    log("Server has started")
    _tell(b"1")
    signum = signal.sigwait(stop_signals)
    log(f"Received signal {signum}: server is shutting down")
    _release(store)
    log("Server exiting")
    return 0


def _tell(message: bytes) -> None:
    fd = os.environ.get(READY_ENV)
    if not fd:
        return
    try:
        os.write(int(fd), message)
        os.close(int(fd))
    except (OSError, ValueError):
        pass


def _hold(store, visible: str | None) -> list[str]:
    from ...errors import NotFoundError
    from ..control import resolve_device
    from ..node import MIG_ENABLE, SimProcess

    with store.mutate() as state:
        if not state.driver_loaded:
            raise RuntimeError("Failed to initialize the CUDA driver: NVIDIA driver is not loaded")
        if visible is None:
            wanted = [(g.index, None, None) for g in state.gpus]
        else:
            wanted = []
            for ident in visible.split(","):
                try:
                    wanted.append(resolve_device(state, ident))
                except NotFoundError:
                    break
        usable = [(gpu, gi, ci) for gpu, gi, ci in wanted
                  if not state.gpus[gpu].lost and not (gi is None and state.gpus[gpu].mig_current == MIG_ENABLE)]
        for gpu, gi, ci in usable:
            why = state.context_refusal(gpu, os.getpid(), gi, ci)
            if why:
                where = f"{gpu}" if gi is None else f"{gpu} (GPU instance {gi}, compute instance {ci})"
                raise RuntimeError(f"Failed to create a server context on device {where}: {why}")
        out = []
        for gpu, gi, ci in usable:
            state.processes.append(SimProcess(pid=os.getpid(), gpu=gpu, gi=gi, ci=ci, name=NAME,
                                              used_mib=USED_MIB))
            out.append(f"{gpu}" if gi is None else f"{gpu} (GPU instance {gi}, compute instance {ci})")
        return out


def _release(store) -> None:
    try:
        with store.mutate() as state:
            state.processes = [p for p in state.processes if p.pid != os.getpid()]
    except Exception:   # the node may be gone; the driver forgets us on exit anyway
        pass
