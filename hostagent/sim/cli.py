"""``hostagent sim``: create and drive a simulated GPU node (registered by ``cli/main.py``
beside the other commands)."""

from __future__ import annotations

import os

from ..cli.output import add_output_flag, emit, table
from ..errors import UsageError

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("sim", help="create and drive a simulated GPU node",
                       description="A simulated node: a fake NVML beneath pynvml and a generated "
                                   "driver root. Other commands use it with --simulate DIR.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)

    v = verbs.add_parser("profiles", help="list the node profiles")
    add_output_flag(v)
    v.set_defaults(run=profiles)

    v = verbs.add_parser("create", help="build a simulated node in a directory")
    v.add_argument("--profile", default="dgx-a100", help="node profile (default: dgx-a100)")
    v.add_argument("--root", required=True, help="directory to build the node in")
    v.add_argument("--force", action="store_true",
                   help="replace the simulated node already in that directory (everything under it "
                        "is removed first; a directory without one is never cleared)")
    v.add_argument("--engines", type=_engines, default=(), metavar="LIST",
                   help="comma list of container engines installed on the node (containerd, crio, "
                        "docker): their configuration folders, and /usr/local/sbin for the runtime "
                        "shim, so 'hostagent runtime' has engines to configure")
    v.add_argument("--driver-version", metavar="VERSION",
                   help="install this driver instead of the profile's (e.g. 495.29.05): NVML then "
                        "answers as that branch does")
    v.add_argument("--distro", metavar="NAME", default=None,
                   help="the node's distribution, with its package tools and the driver's packages, so "
                        "'hostagent driver install' works on it: " + ", ".join(_distros())
                        + " (default: debian-12)")
    v.set_defaults(run=create)

    v = verbs.add_parser("demo", help="create a node in a temporary directory and show it")
    v.add_argument("--profile", default="dgx-a100", help="node profile (default: dgx-a100)")
    v.set_defaults(run=demo)

    v = _verb(verbs, "hold", "make a process hold a GPU or MIG device (destroy then gets IN_USE)")
    v.add_argument("device", help="GPU index or UUID, MIG UUID, or GPU:MIG")
    v.add_argument("--pid", type=int, help="an existing process (default: start one)")
    v.add_argument("--name", default="cuda-app", help="process name NVML reports")
    v.add_argument("--memory", type=int, default=512, metavar="MIB", help="memory it uses")
    v.set_defaults(run=hold)

    v = _verb(verbs, "load", "set what the programs on a GPU or MIG device keep busy, as GPU performance "
                             "monitoring (Hopper and newer) and the NVLink and PCIe counters see it")
    v.add_argument("device", help="GPU index or UUID, MIG UUID, or GPU:MIG")
    for name, what in (("gr", "graphics/compute engine active (default: --sm)"), ("sm", "SMs busy"),
                       ("occupancy", "warps resident, of what the SMs hold"), ("tensor", "tensor pipes busy"),
                       ("fp64", "FP64 pipes busy"), ("fp32", "FP32 pipes busy"), ("fp16", "FP16 pipes busy"),
                       ("dram", "DRAM bandwidth used (a MIG device: of its GPU instance's)")):
        v.add_argument(f"--{name}", type=_percentage, metavar="PCT", help=f"percent of time: {what}")
    for name, what in (("pcie-tx", "out of the GPU over PCIe"), ("pcie-rx", "into the GPU over PCIe"),
                       ("nvlink-tx", "sent over all NVLinks"), ("nvlink-rx", "received over all NVLinks")):
        v.add_argument(f"--{name}", type=float, default=0.0, metavar="MIB_S", help=f"MiB/s {what}")
    v.add_argument("--clear", action="store_true", help="the device goes idle")
    v.set_defaults(run=load)

    v = _verb(verbs, "release", "drop process holds (all, or one process's)")
    v.add_argument("pid", type=int, nargs="?", help="process id (default: all)")
    v.set_defaults(run=release)

    v = _verb(verbs, "xid", "inject an XID error event")
    v.add_argument("--gpu", type=int, required=True)
    v.add_argument("--xid", type=int, required=True)
    v.add_argument("--gi", type=int, help="GPU instance the error is scoped to")
    v.add_argument("--ci", type=int, help="compute instance the error is scoped to")
    v.set_defaults(run=xid)

    v = _verb(verbs, "ecc", "inject a double-bit ECC error event")
    v.add_argument("--gpu", type=int, required=True)
    v.set_defaults(run=ecc)

    v = _verb(verbs, "lose", "make a GPU fall off the bus (XID 79, then GPU_IS_LOST)")
    v.add_argument("--gpu", type=int, required=True)
    v.set_defaults(run=lose)

    v = _verb(verbs, "events", "make event registration on a GPU fail with NOT_SUPPORTED (off) "
                               "or work (on)")
    v.add_argument("--gpu", type=int, required=True)
    v.add_argument("support", choices=["on", "off"])
    v.set_defaults(run=events)

    v = _verb(verbs, "topology", "make NVML's topology calls on a GPU fail with NOT_SUPPORTED (off), "
                                 "as on a virtual GPU, or work (on)")
    v.add_argument("--gpu", type=int, required=True)
    v.add_argument("support", choices=["on", "off"])
    v.set_defaults(run=topology)

    v = _verb(verbs, "iommu", "the kernel's IOMMU as a boot with it gives it: off (no IOMMU groups: VFIO "
                              "refuses), on (groups, legacy VFIO), iommufd (also /dev/iommu and the VFIO "
                              "device cdevs); refused while vfio-pci holds a device")
    v.add_argument("mode", choices=["off", "on", "iommufd"])
    v.set_defaults(run=iommu)

    v = _verb(verbs, "reboot", "reboot the node: instances vanish, pending MIG modes apply, "
                               "Hopper and newer lose MIG mode, the driver loads")
    v.set_defaults(run=reboot)

    v = _verb(verbs, "driver", "unload (MIG instances go, Hopper and newer lose MIG mode; refused "
                               "while processes hold GPUs) or load the kernel driver")
    v.add_argument("action", choices=["load", "unload"])
    v.set_defaults(run=driver)

    from .faults import FAULTS
    v = _verb(verbs, "fault", "break the node's driver as a real host breaks (or, with --clear, "
                              "apply the admin's fix): " + "; ".join(f"{k}: {t}" for k, t in FAULTS.items()))
    v.add_argument("name", choices=list(FAULTS), metavar="FAULT", help=", ".join(FAULTS))
    v.add_argument("--gpu", type=int, help="the GPU (gpu-lost)")
    v.add_argument("--version", help="the version the packages move to (mismatch; default: the next)")
    v.add_argument("--clear", action="store_true", help="undo it the way an admin would")
    v.set_defaults(run=fault)


def _distros() -> list[str]:
    from ..sim.packages import DISTROS
    return list(DISTROS)


def _engines(text: str) -> tuple[str, ...]:
    import argparse
    from .rootdir import ENGINE_DIRS
    from ..suggest import unknown
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if name not in ENGINE_DIRS:
            raise argparse.ArgumentTypeError(f"{unknown('engine', name, ENGINE_DIRS)}; known: {', '.join(ENGINE_DIRS)}")
    return names


def _verb(verbs, name, text):
    v = verbs.add_parser(name, help=text, description=text)
    v.add_argument("--root", help="the simulated node (default: --simulate or $HOSTAGENT_SIMULATE)")
    return v


def _store(args):
    from .store import SimStore
    if args.root is not None and not args.root.strip():
        raise UsageError("--root needs a directory", hint="pass the simulated node's directory")
    root = args.root or args.simulate or os.environ.get("HOSTAGENT_SIMULATE")
    if not root:
        raise UsageError("no simulated node given", hint="pass --root DIR, --simulate DIR or set HOSTAGENT_SIMULATE")
    store = SimStore(root)
    store.check()
    return store


def profiles(args) -> int:
    from . import catalog
    data = []
    for name in catalog.profile_names():
        prof = catalog.load_profile(name)
        data.append({"name": name, "description": prof.description, "gpus": len(prof.gpus),
                     "driver_version": prof.driver_version})
    emit(data, args.output, lambda d: print(table(
        ["PROFILE", "GPUS", "DRIVER", "DESCRIPTION"],
        [[p["name"], p["gpus"], p["driver_version"], p["description"]] for p in d])))
    return 0


def _node_kind(store) -> str:
    if store.facts.real_device_nodes:
        return "character devices"
    return "regular files, as this process may not create device nodes"


def create(args) -> int:
    from .rootdir import build_node
    store = build_node(args.root, args.profile, replace=args.force, engines=args.engines,
                       driver_version=args.driver_version, distro=args.distro)
    print(f"created simulated node '{args.profile}' (driver {store.facts.driver_version}) in {store.root}; "
          f"device nodes: {_node_kind(store)}"
          + (f"; engines: {', '.join(args.engines)}" if args.engines else ""))
    print(f"use it with: hostagent --simulate {store.root} devices")
    return 0


def demo(args) -> int:
    import shutil
    import tempfile
    from ..cli import devices
    from ..devices import read_inventory
    from .driverroot import create_node
    from .platform import simulated_host
    root = tempfile.mkdtemp(prefix="hostagent-sim-")
    try:
        store = create_node(root, args.profile)
        inv = read_inventory(simulated_host(root))
        kind = _node_kind(store)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # The folder is gone once this prints: it is not named (sim create keeps a node).
    print(f"Simulated node '{args.profile}', built in a temporary folder and removed again: "
          f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}, NVML {inv.nvml_version}; "
          f"device nodes: {kind}\n")
    print(devices.render(inv, profiles=False))
    print(f"\nTo keep a node and use the other commands on it: hostagent sim create --profile "
          f"{args.profile} --root DIR, then hostagent --simulate DIR devices")
    return 0


def _percentage(text: str) -> float:
    """An argparse type: a percentage, 0 to 100 (the option that got it names itself)."""
    import argparse
    import math
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:          # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not a percentage (0-100)")
    return value


def hold(args) -> int:
    from . import control
    proc = control.hold(_store(args), args.device, pid=args.pid, name=args.name, used_mib=args.memory)
    where = f"GPU {proc.gpu}" + (f" GI {proc.gi} CI {proc.ci}" if proc.gi is not None else "")
    print(f"process {proc.pid} ({proc.name}) holds {where}")
    return 0


def load(args) -> int:
    from ..sim import workload
    if args.clear:
        _, where = workload.set_load(_store(args), args.device, None)
        print(f"{where} is idle")
        return 0
    percent = {name: getattr(args, name) or 0.0 for name in workload.Load.PERCENT}
    if args.gr is None:
        percent["gr"] = percent["sm"]
    load = workload.Load(**percent, pcie_tx=args.pcie_tx, pcie_rx=args.pcie_rx,
                         nvlink_tx=args.nvlink_tx, nvlink_rx=args.nvlink_rx)
    _, where = workload.set_load(_store(args), args.device, load)
    busy = ", ".join(f"{name} {value:g}%" for name, value in percent.items() if value)
    traffic = ", ".join(f"{name.replace('_', ' ')} {getattr(load, name):g} MiB/s"
                        for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx") if getattr(load, name))
    print(f"{where}: {'; '.join(x for x in (busy, traffic) if x) or 'idle'}")
    return 0


def release(args) -> int:
    from . import control
    gone = control.release(_store(args), args.pid)
    print(f"released {len(gone)} hold(s)")
    return 0


def xid(args) -> int:
    from . import control
    ev = control.inject_xid(_store(args), args.gpu, args.xid, args.gi, args.ci)
    print(f"XID {args.xid} on GPU {args.gpu} (event {ev.seq})")
    return 0


def ecc(args) -> int:
    from . import control
    ev = control.inject_ecc(_store(args), args.gpu)
    print(f"double-bit ECC error on GPU {args.gpu} (event {ev.seq})")
    return 0


def lose(args) -> int:
    from . import control
    control.lose_gpu(_store(args), args.gpu)
    print(f"GPU {args.gpu} has fallen off the bus")
    return 0


def events(args) -> int:
    from . import control
    control.set_event_support(_store(args), args.gpu, args.support == "on")
    state = "works" if args.support == "on" else "fails with NOT_SUPPORTED"
    print(f"event registration on GPU {args.gpu} {state} (from the next registration)")
    return 0


def topology(args) -> int:
    from . import control
    control.set_topology_support(_store(args), args.gpu, args.support == "on")
    print(f"topology calls on GPU {args.gpu} {'work' if args.support == 'on' else 'fail with NOT_SUPPORTED'}")
    return 0


def iommu(args) -> int:
    from . import pcibus
    pcibus.set_iommu(_store(args), args.mode != "off", args.mode == "iommufd")
    print(f"IOMMU {args.mode}")
    return 0


def reboot(args) -> int:
    from . import control
    control.reboot(_store(args))
    print("node rebooted")
    return 0


def driver(args) -> int:
    from . import control
    control.set_driver_loaded(_store(args), args.action == "load")
    print(f"driver {args.action}ed")
    return 0


def fault(args) -> int:
    from . import faults
    store = _store(args)
    if args.clear:
        print(faults.clear(store, args.name, gpu=args.gpu))
    else:
        print(f"{args.name}: {faults.inject(store, args.name, gpu=args.gpu, version=args.version)}")
    return 0
