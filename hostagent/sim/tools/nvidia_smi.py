"""``nvidia-smi`` stand-in, backed by the simulated node.

Reproduced behaviour (command-line syntax as the real tool; errors go to stdout as the
real tool prints them):

* no arguments: the summary table (driver and CUDA version, one block per GPU with bus
  id, memory used/total and MIG mode, the MIG devices table with their ``MIG Dev`` index,
  then the processes holding GPUs);
* ``-L``/``--list-gpus``: ``GPU 0: <name> (UUID: GPU-...)`` and, for MIG-enabled GPUs,
  ``  MIG 1g.5gb      Device  0: (UUID: MIG-...)`` lines numbered by MIG device index
  (dense, in GPU then compute instance id order, as NVML numbers them);
* ``-r``/``--gpu-reset`` [``-i ID[,ID...]``]: all or nothing; a GPU with processes makes
  the whole reset fail with "In use by another client" (exit 255, what mig-parted sees);
* ``-mig``/``--multi-instance-gpu 0|1`` [``-i ...``]: through ``NodeState.set_mig_mode``.
  A mode that took effect prints ``Enabled MIG Mode for GPU ...``; a mode left pending
  prints the real warning instead (``:In use by another client`` when a process or driver
  client holds the GPU, else ``:Not Supported`` plus the "Reboot the system or try
  nvidia-smi --gpu-reset" line, as a passed-through Ampere GPU shows). Both exit 0;
* ``-c``/``--compute-mode`` ``0|2|3|DEFAULT|PROHIBITED|EXCLUSIVE_PROCESS``: through
  ``NodeState.set_compute_mode`` (what ``nvmlDeviceSetComputeMode`` does), so NVML, the
  summary's ``Compute M.`` column (``Default``, ``E. Process``, ``Prohibited``) and
  ``--query-gpu=compute_mode`` (``Default``, ``Exclusive_Process``, ``Prohibited``) agree.
  ``1``/``EXCLUSIVE_THREAD`` is refused: nvml.h marks it "Support Removed";
* ``compute-policy`` [``-i ID``] ``--set-timeslice 0|1|2|3`` (Default, Short, Medium, Long)
  or ``-l``/``--list``: the command the DRA driver runs to set a GPU's time-slice (NVML has
  no call for it); whole GPUs only (a MIG-enabled GPU's setting is kept too). The lines
  it prints are this simulator's wording;
* ``topo -m``, ``-mp``, ``-p2p r|w|n|a|p``: the topology matrix (``smi_topo``);
* ``--query-gpu=FIELDS``/``--query-compute-apps=FIELDS`` with ``--format=csv[,noheader]
  [,nounits]``; an unknown field fails with ``Field "x" is not a valid field to query.``;
* ``mig`` subcommand: ``-lgip``, ``-lgipp``, ``-lgi``, ``-lci``, ``-cgi LIST [-C]``,
  ``-cci [LIST]``, ``-dci``, ``-dgi``, with ``-i``, ``-gi``, ``-ci`` filters. Profiles
  are given by id or name (``9``, ``3g.20gb``, ``MIG 3g.20gb``); ``ID:START`` asks for
  a placement. Failures print the NVML text (In use by another client, Insufficient
  Resources, Invalid Argument, Not Supported).

Privileges as the driver checks them (``sim.privilege``): without the mig/monitor
capability ``mig -lgi/-lci/-lgip/-lgipp`` print ``Failed to display ...: Insufficient
Permissions`` (exit 4), a MIG-enabled GPU's memory is ``N/A`` in the summary and
``[Insufficient Permissions]`` in ``--query-gpu``, and its processes are not listed;
creating or destroying instances needs mig/config, ``-mig`` and ``-r`` CAP_SYS_ADMIN.

Like the real tool, every run (with the driver loaded) creates the missing
``/dev/nvidia-caps/nvidia-cap<N>`` nodes of the MIG capabilities the driver lists in /proc.

``-i`` takes a GPU index, UUID or PCI bus id (``0000:07:00.0`` or ``00000000:07:00.0``).
A lost GPU among the targets fails the command with ``Unable to determine the device
handle for GPU0000:07:00.0: Unknown Error``; an unloaded driver fails every command.

Exit codes (those of nvidia-smi's man page):
    0   success
    2   invalid argument, option combination or query field
    3   not supported on the target device (e.g. ``-mig 1 -i`` on a GPU without MIG)
    4   insufficient permissions
    6   not found: no such device, no MIG-enabled device, no instance to list/destroy
    9   NVIDIA driver not loaded
    15  GPU lost (fallen off the bus)
    255 any other failure: GPU in use (reset, destroy), insufficient resources
"""

from __future__ import annotations

import os
import sys
import time

import pynvml as N

from ...errors import HostagentError
from .. import privilege
from ..clients import driver_clients
from ..node import MIG_ENABLE, NodeState, SimGpu, SimNvmlError
from ..kmod import loaded_version
from ..store import SimStore
from ..versions import cuda_version, library_version, module_version

__all__ = ["main"]

EXIT_ARG, EXIT_UNSUPPORTED, EXIT_NOT_FOUND, EXIT_NO_DRIVER, EXIT_LOST, EXIT_OTHER = 2, 3, 6, 9, 15, 255

NVML_TEXT = {
    N.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    N.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    N.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    N.NVML_ERROR_NOT_FOUND: "Not Found",
    N.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    N.NVML_ERROR_IN_USE: "In use by another client",
    N.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
}
NVML_EXIT = {N.NVML_ERROR_INVALID_ARGUMENT: EXIT_ARG, N.NVML_ERROR_NOT_SUPPORTED: EXIT_UNSUPPORTED,
             N.NVML_ERROR_NO_PERMISSION: 4, N.NVML_ERROR_NOT_FOUND: EXIT_NOT_FOUND,
             N.NVML_ERROR_GPU_IS_LOST: EXIT_LOST}

BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")
NO_MIG = "No MIG-enabled devices found."
# With the NVML return code as exit status, as for a driver that is not loaded (9).
EXIT_NO_LIBRARY, EXIT_MISMATCH = 12, 18
NO_LIBRARY = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
              "NVIDIA Display Driver is properly installed and present in your system.\n"
              "Please also try adding directory that contains libnvidia-ml.so to your system PATH.")

FLAG, VALUE, OPTIONAL = "flag", "value", "optional"
MAIN_OPTIONS = {
    "-h": ("help", FLAG), "--help": ("help", FLAG),
    "-L": ("list", FLAG), "--list-gpus": ("list", FLAG),
    "-i": ("id", VALUE), "--id": ("id", VALUE),
    "-r": ("reset", FLAG), "--gpu-reset": ("reset", FLAG),
    "-mig": ("mig", VALUE), "--multi-instance-gpu": ("mig", VALUE),
    "-c": ("compute_mode", VALUE), "--compute-mode": ("compute_mode", VALUE),
    "-pm": ("persistence", VALUE), "--persistence-mode": ("persistence", VALUE),
    "--query-gpu": ("query_gpu", VALUE), "--query-compute-apps": ("query_apps", VALUE),
    "--format": ("format", VALUE),
}
MIG_OPTIONS = {
    "-h": ("help", FLAG), "--help": ("help", FLAG),
    "-i": ("id", VALUE), "--id": ("id", VALUE),
    "-gi": ("gi", VALUE), "--gpu-instance-id": ("gi", VALUE),
    "-ci": ("ci", VALUE), "--compute-instance-id": ("ci", VALUE),
    "-lgip": ("lgip", FLAG), "--list-gpu-instance-profiles": ("lgip", FLAG),
    "-lgipp": ("lgipp", FLAG), "--list-gpu-instance-possible-placements": ("lgipp", FLAG),
    "-lgi": ("lgi", FLAG), "--list-gpu-instances": ("lgi", FLAG),
    "-lci": ("lci", FLAG), "--list-compute-instances": ("lci", FLAG),
    "-cgi": ("cgi", VALUE), "--create-gpu-instance": ("cgi", VALUE),
    "-C": ("default_ci", FLAG), "--default-compute-instance": ("default_ci", FLAG),
    "-cci": ("cci", OPTIONAL), "--create-compute-instance": ("cci", OPTIONAL),
    "-dci": ("dci", FLAG), "--destroy-compute-instance": ("dci", FLAG),
    "-dgi": ("dgi", FLAG), "--destroy-gpu-instance": ("dgi", FLAG),
}
MIG_ACTIONS = ("lgip", "lgipp", "lgi", "lci", "cgi", "cci", "dci", "dgi")
COMPUTE_MODES = {"0": "DEFAULT", "1": "EXCLUSIVE_THREAD", "2": "PROHIBITED", "3": "EXCLUSIVE_PROCESS"}
MODE_VALUES = {"DEFAULT": N.NVML_COMPUTEMODE_DEFAULT, "EXCLUSIVE_THREAD": N.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
               "PROHIBITED": N.NVML_COMPUTEMODE_PROHIBITED, "EXCLUSIVE_PROCESS": N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS}
# How nvidia-smi spells each mode: the summary's Compute M. column, and --query-gpu=compute_mode.
MODE_COLUMN = {0: "Default", 2: "Prohibited", 3: "E. Process"}
MODE_QUERY = {0: "Default", 2: "Prohibited", 3: "Exclusive_Process"}
POLICY_OPTIONS = {
    "-h": ("help", FLAG), "--help": ("help", FLAG),
    "-i": ("id", VALUE), "--id": ("id", VALUE),
    "-l": ("list", FLAG), "--list": ("list", FLAG),
    "--set-timeslice": ("timeslice", VALUE),
}
TIMESLICES = ("Default", "Short", "Medium", "Long")
TOPO_OPTIONS = {
    "-h": ("help", FLAG), "--help": ("help", FLAG),
    "-m": ("matrix", FLAG), "--matrix": ("matrix", FLAG),
    "-mp": ("matrix_pci", FLAG), "--matrix_pci": ("matrix_pci", FLAG),
    "-p2p": ("p2p", VALUE), "--p2pstatus": ("p2p", VALUE),
}

HELP = """NVIDIA System Management Interface -- simulated (hostagent)

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -L,   --list-gpus             Display a list of GPUs connected to the system.
    -i,   --id=                   Target a specific GPU (index, UUID or PCI bus id).
    -r,   --gpu-reset             Trigger reset of the GPU.
    -mig, --multi-instance-gpu=   Enable or disable Multi Instance GPU: 0/DISABLED, 1/ENABLED.
    -c,   --compute-mode=         Set MODE for compute applications.
    --query-gpu=                  Information about GPU (with --format=csv[,noheader][,nounits]).
    --query-compute-apps=         List of active compute processes.
    mig                           MIG management: -lgip -lgipp -lgi -lci -cgi [-C] -cci -dci -dgi
    compute-policy                Compute policies: --set-timeslice 0|1|2|3 (Default, Short, Medium, Long), -l
    topo                          Topology: -m (matrix), -mp (PCIe only), -p2p r|w|n|a|p
"""


class Exit(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


def main(root: str, argv: list[str]) -> int:
    try:
        return _run(SimStore(root), argv)
    except Exit as e:
        if e.message:
            print(e.message)
        return e.code
    except HostagentError as e:        # the simulated node's own files: say which
        print(f"nvidia-smi (simulated): {e.message}", file=sys.stderr)
        return EXIT_OTHER
    finally:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# ---- command line ------------------------------------------------------------------

def _parse(argv: list[str], table: dict) -> dict:
    """nvidia-smi's syntax: ``-i 0``, ``--id=0``, ``--id 0``, single-dash long names."""
    opts: dict = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name not in table:
            raise Exit(EXIT_ARG, BAD_ARGS)
        dest, kind = table[name]
        if kind == FLAG:
            if eq:
                raise Exit(EXIT_ARG, BAD_ARGS)
            value = True
        elif not eq:
            has_next = i + 1 < len(argv) and not (kind == OPTIONAL and argv[i + 1].startswith("-"))
            if has_next:
                i += 1
                value = argv[i]
            elif kind == VALUE:
                raise Exit(EXIT_ARG, BAD_ARGS)
        if dest in opts:
            raise Exit(EXIT_ARG, BAD_ARGS)
        opts[dest] = value
        i += 1
    return opts


def _run(store: SimStore, argv: list[str]) -> int:
    sub = argv[0] if argv and argv[0] in ("mig", "compute-policy", "topo") else None
    table = {"mig": MIG_OPTIONS, "compute-policy": POLICY_OPTIONS, "topo": TOPO_OPTIONS}.get(sub, MAIN_OPTIONS)
    opts = _parse(argv[1:] if sub else argv, table)
    if opts.get("help"):
        print(HELP, end="")
        return 0
    state = store.read()
    if not state.driver_loaded:
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER)
    _check_library(store)
    try:
        return _command(store, state, sub, opts)
    finally:
        _create_cap_nodes(store)


def _check_library(store: SimStore) -> None:
    """nvidia-smi is NVML's client: it fails as nvmlInit does when the libraries are gone or
    are another version than the loaded module (an upgrade without a reload), printing the
    library's version as the real tool does ("NVML library version: 550.127")."""
    library = library_version(store.root)
    if library is None:
        raise Exit(EXIT_NO_LIBRARY, NO_LIBRARY)
    if library != module_version(store.root, library):
        raise Exit(EXIT_MISMATCH, "Failed to initialize NVML: Driver/library version mismatch\n"
                                  f"NVML library version: {'.'.join(library.split('.')[:2])}")


def _create_cap_nodes(store: SimStore) -> None:
    """nvidia-smi creates the /dev/nvidia-caps node of every MIG capability /proc lists
    (the driver cannot); so, after any run, the nodes of existing instances are there."""
    from ..files import create_cap_nodes
    try:
        create_cap_nodes(store.root, store.facts)
    except OSError:
        pass


def _command(store: SimStore, state: NodeState, sub: str | None, opts: dict) -> int:
    targets = _targets(state, opts.get("id"))
    if sub == "compute-policy":
        return _compute_policy(store, state, targets, opts)
    if sub == "topo":
        from .smi_topo import topo
        _check_lost(state, targets)

        def fail(code, message):
            raise Exit(code, message)
        return topo(store, state, opts, fail)
    if sub:
        return _mig(store, state, targets, opts)
    actions = [k for k in ("list", "reset", "mig", "compute_mode", "persistence", "query_gpu", "query_apps")
               if k in opts]
    if len(actions) > 1 or ("format" in opts) != bool({"query_gpu", "query_apps"} & set(actions)):
        raise Exit(EXIT_ARG, BAD_ARGS)
    action = actions[0] if actions else "summary"
    _check_lost(state, targets)
    return {"summary": _summary, "list": _list, "reset": _reset, "mig": _set_mig,
            "compute_mode": _compute_mode, "persistence": _persistence, "query_gpu": _query_gpu,
            "query_apps": _query_apps}[action](store, state, targets, opts)


# ---- devices -----------------------------------------------------------------------

def bus_id(gpu: SimGpu) -> str:
    """NVML's form of the PCI bus id: ``00000000:07:00.0``."""
    domain, bus, rest = gpu.pci_bus_id.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _bus_key(text: str):
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        domain, bus, rest = parts
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None


def _targets(state: NodeState, ids: str | None) -> list[int]:
    """The GPUs named (NVML's indices, UUIDs, bus ids: the GPUs the nvidia driver holds), as
    the state's slots."""
    visible = state.nvml_gpus()
    if ids is None:
        return [g.index for g in visible]
    out = []
    for ident in ids.split(","):
        ident = ident.strip()
        key = _bus_key(ident) if ":" in ident else None
        match = next((g.index for n, g in enumerate(visible)
                      if ident in (str(n), g.uuid)
                      or (key is not None and key == _bus_key(g.pci_bus_id))), None)
        if match is None:
            raise Exit(EXIT_NOT_FOUND, "No devices were found")
        if match not in out:
            out.append(match)
    return out


def _check_lost(state: NodeState, targets: list[int]) -> None:
    for i in targets:
        if state.gpus[i].lost:
            raise Exit(EXIT_LOST, "Unable to determine the device handle for "
                                  f"GPU{state.gpus[i].pci_bus_id.upper()}: Unknown Error")


def _fail(e: SimNvmlError) -> tuple[str, int]:
    return NVML_TEXT.get(e.code, "Unknown Error"), NVML_EXIT.get(e.code, EXIT_OTHER)


def _mig_name(store: SimStore, gpu: SimGpu, gi, ci) -> str:
    gprof = store.facts.skus[gpu.sku].mig.by_id(gi.profile_id)
    cprof = gprof.ci_profile(ci.profile_id)
    return gprof.name if cprof.slices == gprof.slices else f"{cprof.slices}c.{gprof.name}"


def _mig_on(store: SimStore, gpu: SimGpu) -> bool:
    return store.facts.skus[gpu.sku].mig is not None and gpu.mig_current == MIG_ENABLE


def _mig_mode_text(store: SimStore, mode: int, gpu: SimGpu) -> str:
    if store.facts.skus[gpu.sku].mig is None:
        return "[N/A]"
    return "Enabled" if mode == MIG_ENABLE else "Disabled"


# ---- -L, -r, -mig, -c ----------------------------------------------------------------

def _list(store, state, targets, opts) -> int:
    for i in targets:
        gpu = state.gpus[i]
        print(f"GPU {state.nvml_gpus().index(gpu)}: {store.facts.skus[gpu.sku].name} (UUID: {gpu.uuid})")
        if _mig_on(store, gpu):
            for n, (gi, ci) in state.mig_devices(i).items():
                print(f"  MIG {_mig_name(store, gpu, gi, ci):<12}Device {n:>2}: (UUID: {ci.uuid})")
    return 0


def _reset(store, state, targets, opts) -> int:
    from ...errors import StateError
    from ..control import reset_gpus

    if not privilege.sys_admin():
        for i in targets:
            print(f"Unable to reset GPU {bus_id(state.gpus[i])}: Insufficient Permissions")
        return NVML_EXIT[N.NVML_ERROR_NO_PERMISSION]
    busy = [i for i in targets if state.processes_on(i)]
    if not busy:
        try:
            reset_gpus(store, targets)
        except StateError:
            busy = [i for i in targets if store.read().processes_on(i)] or targets
    if busy:
        many = len(busy) > 1
        print("The following GPUs could not be reset:")
        for i in busy:
            print(f"  GPU {bus_id(state.gpus[i])}: In use by another client")
        print()
        print(f"{len(busy)} device{'s are' if many else ' is'} currently being used by one or more "
              "other processes (e.g., Fabric Manager, CUDA application, graphics application "
              "such as an X server, or a monitoring application such as another instance of "
              "nvidia-smi). Please first kill all processes using "
              f"{'these devices' if many else 'this device'} and all compute applications "
              "running in the system.")
        return EXIT_OTHER
    for i in targets:
        print(f"GPU {bus_id(state.gpus[i])} was successfully reset.")
    print("All done.")
    return 0


def _set_mig(store, state, targets, opts) -> int:
    value = str(opts["mig"]).upper()
    modes = {"0": 0, "DISABLED": 0, "1": 1, "ENABLED": 1}
    if value not in modes:
        raise Exit(EXIT_ARG, BAD_ARGS)
    mode = modes[value]
    verb, state_word = ("enable", "enable") if mode else ("disable", "disable")
    rc = 0
    for i in targets:
        bus = bus_id(state.gpus[i])
        try:
            if not privilege.sys_admin():
                raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, "MIG mode needs CAP_SYS_ADMIN")
            clients = driver_clients(store.root)
            with store.mutate() as st:
                status = st.set_mig_mode(store.facts, i, mode, clients)
                current = st.gpus[i].mig_current
        except SimNvmlError as e:
            text, code = _fail(e)
            print(f"Unable to {verb} MIG Mode for GPU {bus}: {text}")
            if "id" not in opts and e.code == N.NVML_ERROR_NOT_SUPPORTED:
                print("Treating as warning and moving on.")
            else:
                rc = rc or code
            continue
        if current == mode:
            print(f"{verb.capitalize()}d MIG Mode for GPU {bus}")
        elif status == N.NVML_ERROR_IN_USE:
            print(f"Warning: MIG mode is in pending {state_word} state for GPU {bus}:"
                  "In use by another client")
            print(f"{bus} is currently being used by one or more other processes (e.g. CUDA "
                  "application or a monitoring application such as another instance of "
                  "nvidia-smi). Please first kill all processes using the device and retry the "
                  "command or reboot the system to make MIG mode effective.")
        else:
            print(f"Warning: MIG mode is in pending {state_word} state for GPU {bus}:Not Supported")
            print(f"Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective "
                  f"on GPU {bus}")
    if rc == 0:
        print("All done.")
    return rc


def _compute_mode(store, state, targets, opts) -> int:
    value = str(opts["compute_mode"]).upper()
    mode = COMPUTE_MODES.get(value, value if value in COMPUTE_MODES.values() else None)
    if mode is None:
        raise Exit(EXIT_ARG, BAD_ARGS)
    if mode == "EXCLUSIVE_THREAD":
        raise Exit(EXIT_ARG, f"Unable to set the compute mode to {mode}: Invalid Argument")
    _need_root("set the compute mode")

    def change(s):
        for i in targets:
            s.set_compute_mode(i, MODE_VALUES[mode])
    _mutate(store, change)
    for i in targets:
        print(f"Set compute mode to {mode} for GPU {bus_id(state.gpus[i])}.")
    print("All done.")
    return 0


def _persistence(store, state, targets, opts) -> int:
    """``-pm 0|1``: through nvidia-persistenced's socket while it runs (it lets the GPU go,
    or takes it again), else the driver's legacy flag."""
    value = str(opts["persistence"]).strip().upper()
    if value not in ("0", "1", "ENABLED", "DISABLED"):
        raise Exit(EXIT_ARG, BAD_ARGS)
    on = value in ("1", "ENABLED")
    _need_root("set the persistence mode")
    from ..pcibus import _persistenced_running
    daemon = _persistenced_running(store.root)

    def change(s):
        for i in targets:
            gpu = s.gpu(i)
            if daemon:
                gpu.persistenced_released = not on
            else:
                gpu.persistence = on
    _mutate(store, change)
    for i in targets:
        print(f"{'Enabled' if on else 'Disabled'} persistence mode for GPU {bus_id(state.gpus[i])}.")
    print("All done.")
    return 0


def _need_root(what: str) -> None:
    """Changing a GPU's compute settings "Requires root/admin permissions" (nvml.h); the
    message is NVML's text, in this simulator's sentence."""
    from ..privilege import sys_admin
    if not sys_admin():
        raise Exit(4, f"Unable to {what}: Insufficient Permissions")


def _mutate(store: SimStore, change) -> None:
    with store.mutate() as s:
        change(s)


def _compute_policy(store, state, targets, opts) -> int:
    if ("timeslice" in opts) == bool(opts.get("list")):
        raise Exit(EXIT_ARG, BAD_ARGS)
    _check_lost(state, targets)
    if opts.get("list"):
        for i in targets:
            print(f"GPU {bus_id(state.gpus[i])}: Timeslice: {TIMESLICES[state.gpus[i].timeslice]}")
        return 0
    value = str(opts["timeslice"])
    if value not in ("0", "1", "2", "3"):
        raise Exit(EXIT_ARG, BAD_ARGS)
    _need_root("set the timeslice")

    def change(s):
        for i in targets:
            s.gpus[i].timeslice = int(value)
    _mutate(store, change)
    for i in targets:
        print(f"Set timeslice to {TIMESLICES[int(value)]} ({value}) for GPU {bus_id(state.gpus[i])}.")
    print("All done.")
    return 0


# ---- --query-gpu, --query-compute-apps ---------------------------------------------

def _gpu_fields(store: SimStore, state: NodeState):
    facts = store.facts

    def used(g):
        return sum(p.used_mib for p in state.processes_on(g.index))

    def sku(g):
        return facts.skus[g.sku]

    return {  # name -> (unit or None, value(gpu))
        "index": (None, lambda g: state.nvml_gpus().index(g)),
        "count": (None, lambda g: len(state.nvml_gpus())),
        "name": (None, lambda g: sku(g).name),
        "uuid": (None, lambda g: g.uuid),
        "serial": (None, lambda g: g.serial),
        "pci.bus_id": (None, bus_id),
        "pci.device_id": (None, lambda g: f"0x{sku(g).pci_device_id:08X}"),
        "pci.sub_device_id": (None, lambda g: f"0x{sku(g).pci_subsystem_id:08X}"),
        "driver_version": (None, lambda g: loaded_version(facts, state)),
        "compute_cap": (None, lambda g: "%d.%d" % sku(g).compute_capability),
        "memory.total": ("MiB", _unless_hidden(store, lambda g: sku(g).memory_mib)),
        "memory.used": ("MiB", _unless_hidden(store, used)),
        "memory.free": ("MiB", _unless_hidden(store, lambda g: sku(g).memory_mib - used(g))),
        "mig.mode.current": (None, lambda g: _mig_mode_text(store, g.mig_current, g)),
        "mig.mode.pending": (None, lambda g: _mig_mode_text(store, g.mig_pending, g)),
        "compute_mode": (None, lambda g: MODE_QUERY.get(g.compute_mode, "Unknown")),
    }


def _unless_hidden(store: SimStore, value):
    return lambda g: NO_PERMISSION if _hidden(store, g) else value(g)


NO_PERMISSION = "[Insufficient Permissions]"
GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial",
               "gpu_bus_id": "pci.bus_id"}
APP_ALIASES = {"name": "process_name", "used_gpu_memory": "used_memory"}


def _csv(opts, rows, headers) -> int:
    fmt = [f.strip() for f in str(opts.get("format", "")).split(",")]
    if "csv" not in fmt or not set(fmt) <= {"csv", "noheader", "nounits"}:
        raise Exit(EXIT_ARG, BAD_ARGS)
    if "noheader" not in fmt:
        print(", ".join(headers))
    for row in rows:
        print(", ".join(str(v) if unit is None or "nounits" in fmt or v == NO_PERMISSION
                        else f"{v} {unit}" for v, unit in row))
    return 0


def _fields(text: str, known, aliases) -> list[str]:
    names = [f.strip() for f in str(text).split(",") if f.strip()]
    for name in names:
        if aliases.get(name, name) not in known:
            raise Exit(EXIT_ARG, f'Field "{name}" is not a valid field to query.\n')
    if not names:
        raise Exit(EXIT_ARG, BAD_ARGS)
    return names


def _query_gpu(store, state, targets, opts) -> int:
    table = _gpu_fields(store, state)
    names = _fields(opts["query_gpu"], table, GPU_ALIASES)
    cols = [table[GPU_ALIASES.get(n, n)] for n in names]
    headers = [f"{n} [{unit}]" if unit else n for n, (unit, _) in zip(names, cols)]
    rows = [[(fn(state.gpus[i]), unit) for unit, fn in cols] for i in targets]
    return _csv(opts, rows, headers)


def _query_apps(store, state, targets, opts) -> int:
    facts = store.facts
    table = {
        "pid": (None, lambda p: p.pid),
        "process_name": (None, lambda p: p.name),
        "used_memory": ("MiB", lambda p: p.used_mib),
        "gpu_uuid": (None, lambda p: state.gpus[p.gpu].uuid),
        "gpu_bus_id": (None, lambda p: bus_id(state.gpus[p.gpu])),
        "gpu_name": (None, lambda p: facts.skus[state.gpus[p.gpu].sku].name),
        "gpu_serial": (None, lambda p: state.gpus[p.gpu].serial),
    }
    names = _fields(opts["query_apps"], table, APP_ALIASES)
    cols = [table[APP_ALIASES.get(n, n)] for n in names]
    headers = [("used_gpu_memory" if APP_ALIASES.get(n, n) == "used_memory" else n)
               + (f" [{unit}]" if unit else "") for n, (unit, _) in zip(names, cols)]
    rows = [[(fn(p), unit) for unit, fn in cols]
            for i in targets if not _hidden(store, state.gpus[i]) for p in state.processes_on(i)]
    return _csv(opts, rows, headers)


# ---- summary -----------------------------------------------------------------------

def _line(*widths, fill="-", edge="+") -> str:
    return edge + edge.join(fill * w for w in widths) + edge


def _row(*cells: tuple[str, int]) -> str:
    return "|" + "|".join(text.ljust(width)[:width] for text, width in cells) + "|"


def _summary(store, state, targets, opts) -> int:
    facts = store.facts
    # nvidia-smi's own version is the user-space driver's; the driver's is the loaded module's.
    cuda = cuda_version(store.root, facts)
    version = loaded_version(facts, state)
    tool = library_version(store.root) or version
    pm = "On" if driver_clients(store.root) else "Off"
    cols = (41, 24, 22)
    out = [time.strftime("%a %b %d %H:%M:%S %Y").ljust(31), _line(89),
           _row((f" NVIDIA-SMI {tool:<23}Driver Version: {version:<15}"
                 f"CUDA Version: {cuda // 1000}.{cuda % 1000 // 10}", 89)),
           "|" + "+".join("-" * w for w in cols) + "+",
           _row((" GPU  Name                 Persistence-M ", 41), (" Bus-Id          Disp.A ", 24),
                (" Volatile Uncorr. ECC ", 22)),
           _row((" Fan  Temp   Perf          Pwr:Usage/Cap ", 41), ("           Memory-Usage ", 24),
                (" GPU-Util  Compute M. ", 22)),
           _row(("", 41), ("", 24), ("               MIG M. ", 22)),
           "|" + "+".join("=" * w for w in cols) + "|"]
    for i in targets:
        gpu = state.gpus[i]
        sku = facts.skus[gpu.sku]
        used = sum(p.used_mib for p in state.processes_on(i))
        mig = "N/A" if sku.mig is None else ("Enabled" if gpu.mig_current == MIG_ENABLE else "Disabled")
        memory = "N/A" if _hidden(store, gpu) else f"{used:>8}MiB / {sku.memory_mib:>6}MiB"
        index = state.nvml_gpus().index(gpu)
        out += [_row((f"{index:>4}  {sku.name:<29}{pm:>4}  ", 41), (f"{bus_id(gpu):>19} Off ", 24),
                     (f"{'0':>21} ", 22)),
                _row((f" N/A   32C    P0{'54W':>16} / {sku.power_limit_w:>4}W ", 41),
                     (f"{memory:>23} ", 24),
                     (f"{'0%':>8}{MODE_COLUMN.get(gpu.compute_mode, 'Unknown'):>13} ", 22)),
                _row(("", 41), ("", 24), (f"{mig:>21} ", 22)),
                _line(*cols)]
    out += _mig_table(store, state, targets)
    out += ["", _line(89), _row((" Processes:", 89)),
            _row((f"{'GPU':>5}{'GI':>5}{'CI':>5}{'PID':>11}{'Type':>7}   {'Process name':<42}"
                  f"{'GPU Memory':>10} ", 89)),
            _row((f"{'':>5}{'ID':>5}{'ID':>5}{'':>11}{'':>7}   {'':<42}{'Usage':<10} ", 89)),
            _line(89, fill="=", edge="|")]
    procs = [p for i in targets if not _hidden(store, state.gpus[i]) for p in state.processes_on(i)]
    for p in procs:
        gi = "N/A" if p.gi is None else p.gi
        ci = "N/A" if p.ci is None else p.ci
        out.append(_row((f"{p.gpu:>5}{gi:>5}{ci:>5}{p.pid:>11}{'C':>7}   {p.name[:42]:<42}"
                         f"{str(p.used_mib) + 'MiB':>10} ", 89)))
    if not procs:
        out.append(_row(("  No running processes found", 89)))
    out.append(_line(89))
    print("\n".join(out))
    return 0


def _hidden(store: SimStore, gpu: SimGpu) -> bool:
    """A MIG-enabled GPU's aggregate memory and processes, which NVML gives only to callers
    with the mig/monitor privilege (sim.privilege)."""
    return _mig_on(store, gpu) and not privilege.can_monitor(store.root)


def _mig_table(store, state, targets) -> list[str]:
    """The summary's "MIG devices" table; its MIG Dev column is the MIG device index."""
    cols = (18, 32, 11, 23)
    rows = []
    for i in targets:
        gpu = state.gpus[i]
        mig = store.facts.skus[gpu.sku].mig
        for n, (gi, ci) in (state.mig_devices(i).items() if _mig_on(store, gpu) else ()):
            gprof = mig.by_id(gi.profile_id)
            used = sum(p.used_mib for p in state.processes_on(i, gi.id, ci.id))
            engines = f"{gprof.copy_engines:>3}{gprof.encoders:>4}{gprof.decoders:>5}{gprof.ofas:>5}{gprof.jpegs:>5}"
            rows += [_row((f"{i:>3}{gi.id:>5}{ci.id:>4}{n:>4}  ", 18),
                          (f"{used:>16}MiB / {gprof.memory_mib:>5}MiB  ", 32),
                          (f" {gprof.ci_profile(ci.profile_id).multiprocessors:<7}{'0':>2} ", 11),
                          (f"{engines} ", 23)),
                     "+" + "+".join("-" * w for w in cols) + "+"]
    if not rows:
        return []
    return ["", _line(89), _row((" MIG devices:", 89)), "+" + "+".join("-" * w for w in cols) + "+",
            _row((" GPU  GI  CI  MIG ", 18), (f"{'Memory-Usage':>31} ", 32), ("        Vol", 11),
                 ("      Shared           ", 23)),
            _row(("      ID  ID  Dev ", 18), (f"{'BAR1-Usage':>31} ", 32), (" SM     Unc", 11),
                 (" CE ENC DEC OFA JPG    ", 23)),
            _row(("", 18), ("", 32), ("        ECC", 11), ("", 23)),
            "|" + "+".join("=" * w for w in cols) + "|", *rows]


# ---- mig subcommand ----------------------------------------------------------------

def _mig(store: SimStore, state: NodeState, targets: list[int], opts: dict) -> int:
    actions = [a for a in MIG_ACTIONS if a in opts]
    if len(actions) != 1 or ("default_ci" in opts and actions != ["cgi"]) \
            or (("gi" in opts or "ci" in opts) and actions[0] in ("lgip", "lgipp", "cgi")) \
            or ("ci" in opts and actions[0] not in ("dci", "lci")):
        raise Exit(EXIT_ARG, BAD_ARGS)
    _check_lost(state, targets)
    gpus = [i for i in targets if _mig_on(store, state.gpus[i])]
    if not gpus:
        raise Exit(EXIT_NOT_FOUND, NO_MIG)
    what = MONITORED.get(actions[0])
    if what and not privilege.can_monitor(store.root):
        raise Exit(NVML_EXIT[N.NVML_ERROR_NO_PERMISSION], f"Failed to display {what}: Insufficient Permissions")
    return globals()[f"_mig_{actions[0]}"](store, state, gpus, opts)


# Listings NVML gives only to privileged callers (the -lgip Free column is such a count).
MONITORED = {"lgip": "GPU instance profiles", "lgipp": "GPU instance possible placements",
             "lgi": "GPU instances", "lci": "compute instances"}


def _ids(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(x) for x in str(text).split(",")}
    except ValueError:
        raise Exit(EXIT_ARG, BAD_ARGS) from None


def _mig_lgip(store, state, gpus, opts) -> int:
    bar = _line(77)
    out = [bar, _row((" GPU instance profiles:", 77)),
           _row((" GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  ", 77)),
           _row(("                              Free/Total   GiB              CE    JPEG  OFA  ", 77)),
           _line(77, fill="=", edge="|")]
    for i in gpus:
        for p in store.facts.skus[state.gpus[i].sku].mig.gi_profiles:
            free = state.gi_remaining(store.facts, i, p)
            out += [_row((f"{i:>4}  {'MIG ' + p.name:<16}{p.id:>4}{free:>6}/{p.instances:<9}"
                          f"{p.memory_mib / 1024:<11.2f}{'No':<5}{p.multiprocessors:>4}"
                          f"{p.decoders:>6}{p.encoders:>6}   ", 77)),
                    _row((f"{'':58}{p.copy_engines:>4}{p.jpegs:>6}{p.ofas:>6}   ", 77)), bar]
    print("\n".join(out))
    return 0


def _mig_lgipp(store, state, gpus, opts) -> int:
    for i in gpus:
        for p in store.facts.skus[state.gpus[i].sku].mig.gi_profiles:
            starts = ",".join(str(s) for s in p.placements)
            print(f"GPU {i:>2} Profile ID {p.id:>2} Placements: {{{starts}}}:{p.memory_slices}")
    return 0


def _selected_gis(state, gpus, opts):
    wanted = _ids(opts.get("gi"))
    return [(i, gi) for i in gpus for gi in state.gpus[i].gis if wanted is None or gi.id in wanted]


def _selected_cis(state, gpus, opts):
    wanted = _ids(opts.get("ci"))
    return [(i, gi, ci) for i, gi in _selected_gis(state, gpus, opts) for ci in gi.cis
            if wanted is None or ci.id in wanted]


def _mig_lgi(store, state, gpus, opts) -> int:
    found = _selected_gis(state, gpus, opts)
    if not found:
        raise Exit(EXIT_NOT_FOUND, "No GPU instances found: Not Found")
    bar = _line(55)
    out = [bar, _row((" GPU instances:", 55)),
           _row((" GPU   Name             Profile  Instance   Placement  ", 55)),
           _row(("                          ID       ID       Start:Size ", 55)),
           _line(55, fill="=", edge="|")]
    for i, gi in found:
        name = "MIG " + store.facts.skus[state.gpus[i].sku].mig.by_id(gi.profile_id).name
        placement = f"{gi.start}:{gi.size}"
        out += [_row((f"{i:>4}  {name:<16}{gi.profile_id:>6}{gi.id:>9}{placement:>13}     ", 55)), bar]
    print("\n".join(out))
    return 0


def _mig_lci(store, state, gpus, opts) -> int:
    found = _selected_cis(state, gpus, opts)
    if not found:
        raise Exit(EXIT_NOT_FOUND, "No compute instances found: Not Found")
    bar = _line(68)
    out = [bar, _row((" Compute instances:", 68)),
           _row((" GPU     GPU       Name             Profile   Instance   Placement  ", 68)),
           _row(("       Instance                       ID        ID       Start:Size ", 68)),
           _row(("         ID                                                         ", 68)),
           _line(68, fill="=", edge="|")]
    for i, gi, ci in found:
        name = "MIG " + _mig_name(store, state.gpus[i], gi, ci)
        out += [_row((f"{i:>4}{gi.id:>7}       {name:<16}{ci.profile_id:>5}{ci.id:>10}"
                      f"{f'{ci.start}:{ci.size}':>13}      ", 68)), bar]
    print("\n".join(out))
    return 0


def _split_spec(spec: str) -> tuple[str, int | None]:
    name, _, start = spec.strip().partition(":")
    if start:
        try:
            return name.strip(), int(start)
        except ValueError:
            raise Exit(EXIT_ARG, BAD_ARGS) from None
    return name.strip(), None


def _gi_profile(mig, name: str):
    if name.isdigit():
        return mig.by_id(int(name))
    name = name.lower().removeprefix("mig ").strip()
    return next((p for p in mig.gi_profiles if p.name.lower() == name), None)


def _ci_profile(gprof, name: str):
    if name.isdigit():
        return gprof.ci_profile(int(name))
    name = name.lower().removeprefix("mig ").strip()
    for c in gprof.ci_profiles:
        label = gprof.name if c.slices == gprof.slices else f"{c.slices}c.{gprof.name}"
        if name == label.lower():
            return c
    return None


def _instances(store: SimStore):
    """The node's state to create or destroy instances in, for callers with the mig/config
    privilege (others: NO_PERMISSION, printed "Insufficient Permissions")."""
    if not privilege.can_configure(store.root):
        raise SimNvmlError(N.NVML_ERROR_NO_PERMISSION, "MIG instances need the mig/config capability")
    return store.mutate()


def _create_ci(store, i, gi_id, cprof_id, placement=None):
    with _instances(store) as st:
        ci = st.create_ci(store.facts, i, gi_id, cprof_id, placement)
        gpu, gi = st.find_gi(i, gi_id)
        return ci, _mig_name(store, gpu, gi, ci)


def _mig_cgi(store, state, gpus, opts) -> int:
    specs = [_split_spec(s) for s in str(opts["cgi"]).split(",") if s.strip()]
    if not specs:
        raise Exit(EXIT_ARG, BAD_ARGS)
    for i in gpus:
        mig = store.facts.skus[state.gpus[i].sku].mig
        for name, start in specs:
            try:
                prof = _gi_profile(mig, name)
                if prof is None:
                    raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no profile {name}")
                placement = None if start is None else (start, prof.memory_slices)
                with _instances(store) as st:
                    gi = st.create_gi(store.facts, i, prof.id, placement)
            except SimNvmlError as e:
                text, code = _fail(e)
                print(f"Unable to create a GPU instance on GPU {i:>2} using profile {name}: {text}")
                print(f"Failed to create GPU instances: {text}")
                return code
            print(f"Successfully created GPU instance ID {gi.id:>2} on GPU {i:>2} using profile "
                  f"MIG {prof.name} (ID {prof.id:>2})")
            if opts.get("default_ci"):
                full = next(c for c in prof.ci_profiles if c.slices == prof.slices)
                try:
                    ci, ci_name = _create_ci(store, i, gi.id, full.id)
                except SimNvmlError as e:
                    text, code = _fail(e)
                    print(f"Unable to create a compute instance on GPU {i:>2} GPU instance ID "
                          f"{gi.id:>2} using profile {full.id}: {text}")
                    print(f"Failed to create compute instances: {text}")
                    return code
                print(f"Successfully created compute instance ID {ci.id:>2} on GPU {i:>2} GPU "
                      f"instance ID {gi.id:>2} using profile MIG {ci_name} (ID {ci.profile_id:>2})")
    return 0


def _mig_cci(store, state, gpus, opts) -> int:
    found = _selected_gis(state, gpus, opts)
    if not found:
        raise Exit(EXIT_NOT_FOUND, "No GPU instances found: Not Found")
    specs = [_split_spec(s) for s in str(opts["cci"] or "").split(",") if s.strip()] or [(None, None)]
    for i, gi in found:
        gprof = store.facts.skus[state.gpus[i].sku].mig.by_id(gi.profile_id)
        for name, start in specs:
            try:
                cprof = (next(c for c in gprof.ci_profiles if c.slices == gprof.slices)
                         if name is None else _ci_profile(gprof, name))
                if cprof is None:
                    raise SimNvmlError(N.NVML_ERROR_INVALID_ARGUMENT, f"no CI profile {name}")
                placement = None if start is None else (start, cprof.slices)
                ci, ci_name = _create_ci(store, i, gi.id, cprof.id, placement)
            except SimNvmlError as e:
                text, code = _fail(e)
                print(f"Unable to create a compute instance on GPU {i:>2} GPU instance ID "
                      f"{gi.id:>2} using profile {name if name is not None else 'default'}: {text}")
                print(f"Failed to create compute instances: {text}")
                return code
            print(f"Successfully created compute instance ID {ci.id:>2} on GPU {i:>2} GPU "
                  f"instance ID {gi.id:>2} using profile MIG {ci_name} (ID {ci.profile_id:>2})")
    return 0


def _destroy(store, items, destroy, ok_text, fail_text, what) -> int:
    failed: tuple[str, int] | None = None
    for item in items:
        try:
            with _instances(store) as st:
                destroy(st, *item)
        except SimNvmlError as e:
            text, code = _fail(e)
            print(f"{fail_text(*item)}: {text}")
            failed = failed or (text, code)
            continue
        print(ok_text(*item))
    if failed:
        print(f"Failed to destroy {what}: {failed[0]}")
        return failed[1]
    return 0


def _mig_dci(store, state, gpus, opts) -> int:
    found = [(i, gi.id, ci.id) for i, gi, ci in _selected_cis(state, gpus, opts)]
    if not found:
        raise Exit(EXIT_NOT_FOUND, "No compute instances found: Not Found")
    def what(i, g, c):
        return f"compute instance ID {c:>2} from GPU {i:>2} GPU instance ID {g:>2}"

    return _destroy(store, found, lambda st, i, g, c: st.destroy_ci(i, g, c),
                    lambda *item: f"Successfully destroyed {what(*item)}",
                    lambda *item: f"Unable to destroy {what(*item)}", "compute instances")


def _mig_dgi(store, state, gpus, opts) -> int:
    found = [(i, gi.id) for i, gi in _selected_gis(state, gpus, opts)]
    if not found:
        raise Exit(EXIT_NOT_FOUND, "No GPU instances found: Not Found")
    return _destroy(
        store, found, lambda st, i, g: st.destroy_gi(i, g),
        lambda i, g: f"Successfully destroyed GPU instance ID {g:>2} from GPU {i:>2}",
        lambda i, g: f"Unable to destroy GPU instance ID {g:>2} from GPU {i:>2}",
        "GPU instances")
