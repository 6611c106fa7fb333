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
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from . import log_line

__all__ = ["main"]

NAME = "nvidia-cuda-mps-server"
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
        return 1
    for text in held:
        log(f"Creating server context on device {text}")
    log("Server has started")
    signum = signal.sigwait(stop_signals)
    log(f"Received signal {signum}: server is shutting down")
    _release(store)
    log("Server exiting")
    return 0


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
        out = []
        for gpu, gi, ci in wanted:
            g = state.gpus[gpu]
            if g.lost or (gi is None and g.mig_current == MIG_ENABLE):
                continue
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
