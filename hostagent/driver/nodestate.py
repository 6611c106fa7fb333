"""What the installer's planner needs of the node: loaded modules, GPU architectures,
NVSwitches, the driver's daemons and how they run, and who still uses the GPUs."""

from __future__ import annotations

import os

from ..hostroot import HostRoot
from .plan import MODULE_UNLOAD_ORDER, NodeState, Service
from .probe import FABRICMANAGER_PID, PERSISTENCED_PID, probe
from .system import Runner

__all__ = ["read_node_state", "gpu_processes", "SERVICES", "AGENT_UNIT"]

AGENT_UNIT = "hostagent.service"

# The driver's daemons that hold the GPUs: (name, systemd unit, pid file, how to start it).
SERVICES = (("nvidia-persistenced", "nvidia-persistenced.service", PERSISTENCED_PID,
             ("nvidia-persistenced", "--persistence-mode")),
            ("nvidia-fabricmanager", "nvidia-fabricmanager.service", FABRICMANAGER_PID,
             ("nv-fabricmanager", "-c", "/usr/share/nvidia/nvswitch/fabricmanager.cfg")),
            ("nvidia-dcgm", "nvidia-dcgm.service", None, ()))


def _systemd(host: HostRoot, runner: Runner) -> bool:
    return host.host("/run/systemd/system").is_dir() and runner.has("systemctl")


def _agent_unit(host: HostRoot, runner: Runner) -> str | None:
    """The unit of the running daemon, when systemd runs it."""
    if _systemd(host, runner) and runner.run(["systemctl", "is-active", "--quiet", AGENT_UNIT], check=False).ok:
        return AGENT_UNIT
    return None


def _services(host: HostRoot, runner: Runner, facts) -> tuple[Service, ...]:
    out = []
    systemd = _systemd(host, runner)
    for name, unit, pid_file, start in SERVICES:
        if systemd and runner.run(["systemctl", "is-active", "--quiet", unit], check=False).ok:
            out.append(Service(name, unit=unit))
            continue
        pid = facts.persistenced if pid_file == PERSISTENCED_PID else \
            facts.fabricmanager if pid_file == FABRICMANAGER_PID else None
        if pid:
            out.append(Service(name, pid=pid, start=start))
    return tuple(out)


def gpu_processes(host: HostRoot) -> list[str]:
    """One line per process NVML sees on a GPU; empty when NVML does not answer."""
    import pynvml as N
    from ..devices.reader import nvml_session
    from ..errors import HostagentError
    lines = []
    try:
        with nvml_session(host):
            for index in range(N.nvmlDeviceGetCount()):
                try:
                    procs = N.nvmlDeviceGetComputeRunningProcesses(N.nvmlDeviceGetHandleByIndex(index))
                except N.NVMLError:
                    continue
                lines += [f"process {p.pid} on GPU {index}" for p in procs if p.pid != os.getpid()]
    except HostagentError:
        pass
    return lines


def read_node_state(host: HostRoot, runner: Runner, *, allocations=(), agent: bool = False,
                    our_holds=frozenset()) -> NodeState:
    facts = probe(host)
    loaded = tuple(m for m in MODULE_UNLOAD_ORDER if host.sys(f"module/{m}").is_dir())
    if facts.module.loaded and facts.module.name not in loaded:
        loaded += (facts.module.name,)             # Debian's nvidia_current
    users = tuple(f"allocation {a}" for a in allocations) + tuple(gpu_processes(host))
    return NodeState(kernel_release=facts.kernel_release, loaded_modules=loaded,
                     architectures=tuple(sorted({g.architecture for g in facts.pci_gpus if g.architecture})),
                     nvswitch=bool(facts.nvswitches), current_version=facts.module.version,
                     services=_services(host, runner, facts), users=users, agent=agent,
                     agent_unit=_agent_unit(host, runner) if agent else None, our_holds=frozenset(our_holds))
