"""What tests and demos do to a simulated node from outside: hold devices with processes,
inject XIDs and ECC errors, lose a GPU, unload the driver, reboot."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pynvml as N

from ..errors import StateError, UnknownName, UsageError
from .files import remove_cap_nodes
from .node import NodeState, SimNvmlError, SimProcess
from .store import SimStore

__all__ = ["resolve_device", "hold", "release", "inject_xid", "inject_ecc", "lose_gpu", "set_topology_support",
           "set_event_support", "reboot", "set_driver_loaded", "reset_gpus", "stop_spawned",
           "start_persistenced"]


def resolve_device(state: NodeState, ident: str) -> tuple[int, int | None, int | None]:
    """(gpu, gi, ci) for a GPU index or UUID, a MIG UUID, or ``<gpu>:<mig index>``."""
    ident = ident.strip()
    for gpu in state.gpus:
        if ident in (str(gpu.index), gpu.uuid):
            return gpu.index, None, None
        for slot, (gi, ci) in state.mig_devices(gpu.index).items():
            if ident in (ci.uuid, f"{gpu.index}:{slot}"):
                return gpu.index, gi.id, ci.id
    raise UnknownName(f"no device {ident!r} on the simulated node", name=ident,
                      hint="use a GPU index or UUID, a MIG UUID, or GPU:MIG as 'hostagent devices' shows")


def _spawn_holder() -> int:
    sleeper = shutil.which("sleep")
    cmd = [sleeper, "infinity"] if sleeper else [sys.executable, "-c", "import time\nwhile 1: time.sleep(3600)"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def hold(store: SimStore, device: str, *, pid: int | None = None, name: str = "cuda-app",
         used_mib: int = 512) -> SimProcess:
    """Make a process hold a GPU or MIG device until it exits or is released.

    Without ``pid`` a background process is started for the purpose; the driver drops the
    hold the moment that process exits, as it does for real CUDA processes. The GPU's compute
    mode applies: PROHIBITED refuses every context, EXCLUSIVE_PROCESS a second process.
    """
    with store.mutate() as state:
        gpu, gi, ci = resolve_device(state, device)
        state.live_gpu(gpu)
        why = state.context_refusal(gpu, -1 if pid is None else pid, gi, ci)
        if why:
            raise StateError(f"device {device}: {why}",
                             hint="the GPU's compute mode allows no further CUDA process now (nvidia-smi -q "
                                  "shows it; nvidia-smi -c DEFAULT changes it)")
        spawned = pid is None
        if spawned:
            pid = _spawn_holder()
        proc = SimProcess(pid=pid, gpu=gpu, gi=gi, ci=ci, name=name, used_mib=used_mib,
                          spawned=spawned)
        state.processes.append(proc)
        return proc


def release(store: SimStore, pid: int | None = None) -> list[SimProcess]:
    """Drop the holds of ``pid`` (or all); stop holder processes the simulator started."""
    with store.mutate() as state:
        gone = [p for p in state.processes if pid is None or p.pid == pid]
        if pid is not None and not gone:
            raise UnknownName(f"process {pid} holds no simulated device", name=pid)
        state.processes = [p for p in state.processes if p not in gone]
    stop_spawned(gone)
    return gone


def stop_spawned(procs) -> None:
    for p in procs:
        if p.spawned:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def inject_xid(store: SimStore, gpu: int, xid: int, gi: int | None = None, ci: int | None = None):
    if xid <= 0:
        raise UsageError(f"XID must be a positive number, not {xid}")
    from . import kmod
    with store.mutate() as state:
        event = state.add_event(_gpu_index(state, gpu), N.nvmlEventTypeXidCriticalError, xid, gi, ci)
        kmod.log(store.root, _xid_line(state, gpu, xid, "simulated error"), level=3)
        return event


def inject_ecc(store: SimStore, gpu: int):
    """A double-bit ECC error event, as NVML reports uncorrectable memory errors."""
    with store.mutate() as state:
        return state.add_event(_gpu_index(state, gpu), N.nvmlEventTypeDoubleBitEccError, 0)


def _xid_line(state: NodeState, gpu: int, xid: int, text: str) -> str:
    """The driver's Xid line: ``NVRM: Xid (PCI:0000:07:00): 79, pid=..., <what>``."""
    bus = state.gpus[gpu].pci_bus_id.rsplit(".", 1)[0]
    return f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, {text}"


def lose_gpu(store: SimStore, gpu: int) -> None:
    """The GPU falls off the bus: XID 79, then every call on it returns GPU_IS_LOST."""
    from . import kmod
    with store.mutate() as state:
        state.mark_lost(_gpu_index(state, gpu))
        kmod.log(store.root, _xid_line(state, gpu, 79, "GPU has fallen off the bus."),
                 f"NVRM: GPU {state.gpus[gpu].pci_bus_id}: GPU has fallen off the bus.", level=3)


def set_event_support(store: SimStore, gpu: int, supported: bool) -> None:
    """Whether nvmlDeviceRegisterEvents works on a GPU (off: NOT_SUPPORTED, though the
    supported-types mask still lists the events). Takes effect at the next registration."""
    with store.mutate() as state:
        state.gpus[_gpu_index(state, gpu)].events_supported = supported


def set_topology_support(store: SimStore, gpu: int, supported: bool) -> None:
    """Whether NVML's topology calls work on a GPU (off: NOT_SUPPORTED, as on a virtual GPU)."""
    with store.mutate() as state:
        state.gpus[_gpu_index(state, gpu)].topology = supported


def reboot(store: SimStore) -> None:
    from . import kmod
    with store.mutate() as state:
        gone = state.reboot(store.facts)
        kmod.boot(store.root, store.facts, state)     # the module on disk comes up
    from . import pcibus
    pcibus.sync(store.root, store.facts, store.read())
    stop_spawned(gone)
    remove_cap_nodes(store.root)      # a booted host's /dev has none for instances


def set_driver_loaded(store: SimStore, loaded: bool) -> None:
    """Unload (as ``rmmod nvidia``, refused while processes use GPUs) or load the driver
    (``modprobe nvidia``: the module on disk, see sim/kmod.py)."""
    from . import kmod
    if loaded:
        kmod.load(store)
    else:
        kmod.unload(store)


def reset_gpus(store: SimStore, indices: list[int]) -> None:
    """GPU reset, as ``nvidia-smi -r``: all or nothing."""
    with store.mutate() as state:
        busy = [i for i in indices if state.processes_on(_gpu_index(state, i))]
        if busy:
            raise StateError(f"cannot reset GPU {', '.join(map(str, busy))}: in use by another client",
                             busy=busy)
        for index in indices:
            try:
                state.reset_gpu(index)
            except SimNvmlError as e:
                raise StateError(f"cannot reset GPU {index}: {e}") from None


def _gpu_index(state: NodeState, gpu: int) -> int:
    if not 0 <= gpu < len(state.gpus):
        raise UnknownName(f"no GPU {gpu} on the simulated node (it has {len(state.gpus)})", name=gpu)
    return gpu


def start_persistenced(store: SimStore) -> int:
    """Start the node's nvidia-persistenced stand-in and return its pid (stop it with
    SIGTERM). While it runs it is a driver client keeping every GPU open, so an Ampere GPU
    cannot reset itself for a MIG mode change (``sim.clients``)."""
    from .tools import read_pid
    from .tools.persistenced import PID_FILE
    env = {k: v for k, v in os.environ.items() if k != "HOSTAGENT_SIMULATE"}
    proc = subprocess.run([str(store.root / "usr/bin/nvidia-persistenced")], env=env,
                          capture_output=True, text=True, timeout=30)
    pid = read_pid(store.root / PID_FILE)
    if proc.returncode != 0 or pid is None:
        raise StateError(f"the nvidia-persistenced stand-in did not start: {proc.stderr.strip()}")
    return pid
