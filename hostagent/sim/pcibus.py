"""The simulated PCI bus and its VFIO side: which driver holds each GPU and the functions
beside it, what writing the kernel's attributes does, the IOMMU groups and the VFIO nodes.

Reproduced (the kernel's sysfs-bus-pci and sysfs-kernel-iommu_groups ABI documents,
Documentation/driver-api/vfio.rst, NVIDIA's open kernel modules):

* ``/sys/bus/pci/devices/<bdf>/driver`` links the driver holding a function;
  ``driver_override`` reads ``(null)`` until a driver name is written, after which only
  that driver may bind it (an empty write restores normal matching; writing it binds and
  unbinds nothing). ``/sys/bus/pci/drivers/<driver>/unbind`` and ``bind`` take a
  ``DDDD:BB:DD.F`` address: unbinding a function the driver does not hold is ENODEV, binding
  a bound one EBUSY, one the driver does not match (its ids, or the override) ENODEV.
  ``/sys/bus/pci/drivers_probe`` binds an unbound function to the driver that matches it
  (the override's, else its own: nvidia for a GPU, snd_hda_intel for an HD-audio function,
  vfio-pci for an id written to its ``new_id``). vfio-pci's probe fails (EINVAL) on a
  function without an IOMMU group (the IOMMU off).
* The nvidia driver's ``/proc/driver/nvidia/gpus/<bdf>/unbindLock``: writing 1 takes it only
  while nothing has the GPU open (``usage_count`` 0 in ``nv-procfs.c``; here a process
  holding the GPU, nvidia-persistenced not having let it go, or a process whose NVML
  attached the GPU and has not shut down: ``nvmlopen``), reading says ``1`` or
  ``0``. The GPU's ``/proc/driver/nvidia/gpus/<bdf>`` folder goes when the driver lets the
  GPU go and comes back when it binds it again, with the lowest free device minor
  (``nv_linux_assign_minor_locked``: ``find_first_zero_bit``), so a GPU usually gets its
  old minor back, but not when others were bound meanwhile.
* IOMMU groups: ``/sys/kernel/iommu_groups/<n>/devices/<bdf>`` and each function's relative
  ``iommu_group`` link, while the IOMMU is on (empty without it: how userspace, NVIDIA's
  DRA driver included, tells it is off).
* ``/dev/vfio/vfio`` while the vfio module is loaded; ``/dev/vfio/<group>`` while a
  function of the group is bound to vfio-pci; with iommufd, ``/dev/iommu`` and a
  ``/dev/vfio/devices/vfio<N>`` cdev per bound function, its number in sysfs
  ``<bdf>/vfio-dev/vfio<N>/dev``.

The simulator's choices: unbinding the nvidia driver from a GPU something has open is
EBUSY (the real driver waits for it to close); group numbers are the simulator's; the misc
devices ``/dev/vfio/vfio`` and ``/dev/iommu`` get a major this host does not use instead of
misc's 10, so nothing given them reaches this machine's VFIO.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..fileio import ensure_dir
from . import nvmlopen
from .files import NodeFiles, release

__all__ = ["write", "sync", "gpu_information", "VFIO_DRIVER", "AUDIO_DRIVER", "GPU_DRIVER", "load_vfio", "unload_vfio",
           "vfio_module_file", "set_iommu", "in_use", "persistenced_holds"]

GPU_DRIVER, VFIO_DRIVER, AUDIO_DRIVER = "nvidia", "vfio-pci", "snd_hda_intel"
VFIO_MODULE = "kernel/drivers/vfio/pci/vfio-pci.ko"
MISC_VFIO_MINOR = 196          # /dev/vfio/vfio: misc minor VFIO_MINOR


def _fail(code: int, what: str) -> OSError:
    return OSError(code, os.strerror(code), what)


def vfio_module_file(root: Path) -> Path:
    return root / "lib/modules" / release(root) / VFIO_MODULE


def gpu_information(facts, gpu, version: str) -> str:
    """/proc/driver/nvidia/gpus/<bdf>/information of a GPU the driver holds."""
    from .catalog import skus
    return (f"Model: \t\t {skus()[gpu.sku].name}\nIRQ:   \t\t {120 + gpu.index}\nGPU UUID: \t {gpu.uuid}\n"
            "Video BIOS: \t 92.00.45.00.06\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            "DMA Mask: \t 0x7fffffffffff\n"
            f"Bus Location: \t {gpu.pci_bus_id}\nDevice Minor: \t {gpu.minor}\n"
            f"GPU Firmware: \t {version}\nGPU Excluded:\t No\n")


def _persistenced_running(root: Path) -> bool:
    from ..fileio import pid_alive
    from .tools import read_pid
    from .tools.persistenced import PID_FILE
    pid = read_pid(root / PID_FILE)
    return bool(pid and pid_alive(pid))


def persistenced_holds(root: Path, gpu) -> bool:
    return not gpu.persistenced_released and _persistenced_running(root)


def in_use(root: Path, state, gpu) -> str | None:
    """What keeps the GPU's device open (the nvidia driver's usage count), or None: a
    process on it, nvidia-persistenced, a process with NVML attached to it (sim/nvmlopen.py)."""
    if state.processes_on(gpu.index):
        return "a process holds it"
    if persistenced_holds(root, gpu):
        return "nvidia-persistenced holds it"
    opened = nvmlopen.holders(root, gpu.pci_bus_id)
    if opened:
        return f"NVML holds it open in pid {', '.join(map(str, opened))}"
    return None


# ---- the functions ---------------------------------------------------------------------

class _Function:
    """A PCI function of the node as the bus sees it: a GPU or a function beside one."""

    def __init__(self, facts, state, bdf: str):
        self.bdf = bdf
        self.gpu = next((g for g in state.gpus if g.pci_bus_id == bdf), None)
        self.info = facts.functions.get(bdf)
        if self.gpu is None and self.info is None:
            raise _fail(errno.ENODEV, f"no PCI device {bdf}")
        if self.gpu is None:
            self.binding = state.functions.setdefault(bdf, {"driver": AUDIO_DRIVER, "override": ""})

    @property
    def driver(self) -> str:
        return self.gpu.driver if self.gpu else self.binding["driver"]

    @driver.setter
    def driver(self, value: str) -> None:
        if self.gpu:
            self.gpu.driver = value
        else:
            self.binding["driver"] = value

    @property
    def override(self) -> str:
        return self.gpu.driver_override if self.gpu else self.binding["override"]

    @override.setter
    def override(self, value: str) -> None:
        if self.gpu:
            self.gpu.driver_override = value
        else:
            self.binding["override"] = value

    def ids(self, facts) -> str:
        if self.gpu:
            return f"10de {facts.skus[self.gpu.sku].pci_device_id >> 16:04x}"
        return f"{self.info['vendor'][2:]} {self.info['device'][2:]}"

    def own_driver(self) -> str:
        return GPU_DRIVER if self.gpu else AUDIO_DRIVER


def _loaded(state, driver: str) -> bool:
    if driver == GPU_DRIVER:
        return state.driver_loaded and not state.driver.get("nouveau")
    if driver == VFIO_DRIVER:
        return bool(state.kernel.get("vfio_pci"))
    return driver == AUDIO_DRIVER


def _matches(facts, state, fn: _Function, driver: str) -> bool:
    if fn.override:
        return fn.override == driver
    if driver == VFIO_DRIVER:
        return fn.ids(facts) in state.kernel.get("vfio_ids", [])
    return driver == fn.own_driver()


def _attach(root: Path, facts, state, fn: _Function, driver: str) -> None:
    if driver == VFIO_DRIVER and fn.bdf not in facts.iommu_groups or driver == VFIO_DRIVER and \
            not state.kernel.get("iommu"):
        # vfio-pci's probe: "vfio-pci: probe of ... failed with error -22" without a group.
        raise _fail(errno.EINVAL, f"{fn.bdf} has no IOMMU group")
    fn.driver = driver
    if fn.gpu is not None and driver == GPU_DRIVER:
        taken = {g.minor for g in state.gpus if g.on_nvidia and g is not fn.gpu}
        fn.gpu.minor = next(m for m in range(len(state.gpus) + 1) if m not in taken)
        # Probed after nvidia-persistenced started: it does not take the GPU back.
        fn.gpu.persistenced_released, fn.gpu.persistence, fn.gpu.unbind_lock = True, False, False
    if driver == VFIO_DRIVER and state.kernel.get("iommufd"):
        cdevs = state.kernel.setdefault("cdevs", {})
        cdevs[fn.bdf] = next(n for n in range(len(cdevs) + 1) if n not in cdevs.values())


def _detach(root: Path, state, fn: _Function) -> None:
    if fn.gpu is not None and fn.driver == GPU_DRIVER:
        why = in_use(root, state, fn.gpu)
        if why and not fn.gpu.unbind_lock:
            raise _fail(errno.EBUSY, f"{fn.bdf}: {why}")
        fn.gpu.unbind_lock = False
        fn.gpu.persistenced_released, fn.gpu.persistence = True, False
    fn.driver = ""
    state.kernel.setdefault("cdevs", {}).pop(fn.bdf, None)


def _probe(root: Path, facts, state, fn: _Function) -> None:
    if fn.driver:
        return
    for driver in ([fn.override] if fn.override else [fn.own_driver(), VFIO_DRIVER]):
        if _loaded(state, driver) and _matches(facts, state, fn, driver):
            _attach(root, facts, state, fn, driver)
            return


def _bdf(value: str) -> str:
    return value.strip().lower()


def write(store, rel: str, value: str) -> None:
    """What writing ``value`` to the kernel attribute ``rel`` (relative to the root) does,
    applied to the node's state under its lock, its files brought in step. OSError as the
    kernel's write fails."""
    parts = rel.strip("/").split("/")
    root = store.root
    with store.mutate() as state:
        facts = store.facts
        if parts[:4] == ["sys", "bus", "pci", "devices"] and len(parts) == 6 and parts[5] == "driver_override":
            fn = _Function(facts, state, parts[4])
            fn.override = value.strip()
        elif parts == ["sys", "bus", "pci", "drivers_probe"]:
            _probe(root, facts, state, _Function(facts, state, _bdf(value)))
        elif parts[:4] == ["sys", "bus", "pci", "drivers"] and len(parts) == 6:
            driver, attr = parts[4], parts[5]
            if not _loaded(state, driver):
                raise _fail(errno.ENOENT, f"/{rel}")
            if attr in ("new_id", "remove_id") and driver == VFIO_DRIVER:
                ident = " ".join(value.split()[:2]).lower()
                ids = state.kernel.setdefault("vfio_ids", [])
                if attr == "remove_id":
                    if ident not in ids:
                        raise _fail(errno.ENODEV, ident)
                    ids.remove(ident)
                elif ident not in ids:
                    ids.append(ident)
                    # new_id binds every unbound function it matches, now.
                    for bdf in [g.pci_bus_id for g in state.gpus] + list(facts.functions):
                        fn = _Function(facts, state, bdf)
                        if not fn.driver and _matches(facts, state, fn, VFIO_DRIVER):
                            _attach(root, facts, state, fn, VFIO_DRIVER)
            elif attr == "unbind":
                fn = _Function(facts, state, _bdf(value))
                if fn.driver != driver:
                    raise _fail(errno.ENODEV, f"{fn.bdf} is not bound to {driver}")
                _detach(root, state, fn)
            elif attr == "bind":
                fn = _Function(facts, state, _bdf(value))
                if fn.driver:
                    raise _fail(errno.EBUSY, f"{fn.bdf} is bound to {fn.driver}")
                if not _matches(facts, state, fn, driver):
                    raise _fail(errno.ENODEV, f"{driver} does not match {fn.bdf}")
                _attach(root, facts, state, fn, driver)
            else:
                raise _fail(errno.EACCES, f"/{rel}")
        elif parts[:4] == ["proc", "driver", "nvidia", "gpus"] and len(parts) == 6 and parts[5] == "unbindLock":
            gpu = next((g for g in state.gpus if g.pci_bus_id == parts[4] and g.on_nvidia), None)
            if gpu is None or not _loaded(state, GPU_DRIVER):
                raise _fail(errno.ENOENT, f"/{rel}")
            wanted = value.strip()
            if wanted == "1" and not gpu.unbind_lock and in_use(root, state, gpu) is None:
                gpu.unbind_lock = True
            elif wanted == "0":
                gpu.unbind_lock = False
            elif wanted not in ("0", "1"):
                raise _fail(errno.EINVAL, value)
        else:
            raise _fail(errno.EACCES, f"/{rel} is not an attribute the simulated kernel acts on")
    sync(root, store.facts, store.read())


# ---- modules and the IOMMU ----------------------------------------------------------------

def _vfio_holds(state) -> bool:
    return any(g.driver == VFIO_DRIVER for g in state.gpus) or any(
        f["driver"] == VFIO_DRIVER for f in state.functions.values())


def load_vfio(store) -> None:
    """modprobe vfio_pci: StateError as modprobe fails without the module on disk."""
    from ..errors import StateError
    if not vfio_module_file(store.root).is_file():
        raise StateError(f"modprobe: FATAL: Module vfio_pci not found in directory /lib/modules/"
                         f"{release(store.root)}")
    with store.mutate() as state:
        state.kernel["vfio_pci"] = True
        for fn in [g.pci_bus_id for g in state.gpus] + list(store.facts.functions):
            f = _Function(store.facts, state, fn)
            if not f.driver and f.override == VFIO_DRIVER:
                _attach(store.root, store.facts, state, f, VFIO_DRIVER)
    sync(store.root, store.facts, store.read())


def unload_vfio(store) -> None:
    """modprobe -r vfio_pci: StateError while it holds a function."""
    from ..errors import StateError
    with store.mutate() as state:
        if _vfio_holds(state):
            raise StateError("modprobe: FATAL: Module vfio_pci is in use.")
        state.kernel["vfio_pci"] = False
    sync(store.root, store.facts, store.read())


def set_iommu(store, iommu: bool, iommufd: bool) -> None:
    """The kernel's IOMMU (its command line) and iommufd, as after a boot with them; refused
    while vfio-pci holds a function."""
    from ..errors import StateError
    with store.mutate() as state:
        if _vfio_holds(state):
            raise StateError("vfio-pci holds functions of the node: bind them back first")
        state.kernel.update(iommu=iommu, iommufd=iommu and iommufd, cdevs={})
    sync(store.root, store.facts, store.read())


# ---- files -----------------------------------------------------------------------------

def _link(path: Path, target: str) -> None:
    ensure_dir(path.parent)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def _driver_link(root: Path, bdf: str, driver: str) -> None:
    link = root / f"sys/bus/pci/devices/{bdf}/driver"
    if not driver:
        if link.is_symlink():
            link.unlink()
        return
    target = root / f"sys/bus/pci/drivers/{driver}"
    ensure_dir(target)
    want = os.path.relpath(os.path.realpath(target), os.path.realpath(link.parent))
    if not (link.is_symlink() and os.readlink(link) == want):
        _link(link, want)


def _attribute(path: Path, text: str, mode: int = 0o644) -> None:
    ensure_dir(path.parent)
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)
    os.chmod(path, mode)


def sync(root: Path, facts, state) -> None:
    """Make the bus's files say what the state says."""
    w = NodeFiles(root, facts.real_device_nodes)
    kernel = state.kernel
    majors = facts.majors
    functions = [(g.pci_bus_id, g.driver if (g.driver != GPU_DRIVER or _loaded(state, GPU_DRIVER)) else "",
                  g.driver_override) for g in state.gpus]
    functions += [(bdf, (state.functions.get(bdf) or {}).get("driver", AUDIO_DRIVER),
                   (state.functions.get(bdf) or {}).get("override", "")) for bdf in facts.functions]
    nouveau = state.driver.get("nouveau")
    for bdf, driver, override in functions:
        if not (nouveau and driver == GPU_DRIVER):        # nouveau's links are kmod's
            _driver_link(root, bdf, driver)
        _attribute(root / f"sys/bus/pci/devices/{bdf}/driver_override", f"{override or '(null)'}\n")
    for name in ("bind", "unbind"):
        for driver in (GPU_DRIVER, AUDIO_DRIVER) + ((VFIO_DRIVER,) if kernel.get("vfio_pci") else ()):
            if _loaded(state, driver):
                _attribute(root / f"sys/bus/pci/drivers/{driver}/{name}", "", 0o200)
    _attribute(root / "sys/bus/pci/drivers_probe", "", 0o200)
    vfio_dir = root / "sys/bus/pci/drivers" / VFIO_DRIVER
    if kernel.get("vfio_pci"):
        for name in ("new_id", "remove_id"):
            _attribute(vfio_dir / name, "", 0o200)
        _attribute(root / "sys/module/vfio_pci/refcnt", "0\n", 0o444)
    else:
        shutil.rmtree(vfio_dir, ignore_errors=True)
        shutil.rmtree(root / "sys/module/vfio_pci", ignore_errors=True)
    # The nvidia driver's per-GPU folder, for the GPUs it holds.
    if _loaded(state, GPU_DRIVER):
        version = state.driver.get("module_version") or facts.driver_version
        for gpu in state.gpus:
            folder = root / f"proc/driver/nvidia/gpus/{gpu.pci_bus_id}"
            if gpu.on_nvidia:
                w.file(f"proc/driver/nvidia/gpus/{gpu.pci_bus_id}/information",
                       gpu_information(facts, gpu, version), mode=0o444)
                _attribute(folder / "unbindLock", f"{int(gpu.unbind_lock)}\n")
            else:
                shutil.rmtree(folder, ignore_errors=True)
    # IOMMU groups.
    groups_dir = root / "sys/kernel/iommu_groups"
    shutil.rmtree(groups_dir, ignore_errors=True)
    ensure_dir(groups_dir)
    for bdf, group in facts.iommu_groups.items():
        device = root / f"sys/bus/pci/devices/{bdf}"
        link = Path(os.path.realpath(device)) / "iommu_group"
        if kernel.get("iommu"):
            _link(groups_dir / str(group) / "devices" / bdf,
                  os.path.relpath(os.path.realpath(device), groups_dir / str(group) / "devices"))
            _link(link, os.path.relpath(groups_dir / str(group), link.parent))
        elif link.is_symlink():
            link.unlink()
    # /dev/vfio and /dev/iommu.
    dev = root / "dev/vfio"
    bound = {bdf for bdf, driver, _ in functions if driver == VFIO_DRIVER}
    live = {str(facts.iommu_groups[b]) for b in bound if b in facts.iommu_groups}
    if kernel.get("vfio_pci"):
        w.chardev("dev/vfio/vfio", majors.get("vfio-misc", 0), MISC_VFIO_MINOR)
    for node in (dev.iterdir() if dev.is_dir() else ()):
        if node.name == "vfio" and kernel.get("vfio_pci") or node.name in live or node.name == "devices":
            continue
        node.unlink()
    ordinal = {g: i for i, g in enumerate(sorted(set(facts.iommu_groups.values())))}
    for group in sorted(live, key=int):
        if not (dev / group).exists():
            w.chardev(f"dev/vfio/{group}", majors.get("vfio", 0), ordinal[int(group)])
    cdevs = kernel.get("cdevs") or {}
    cdev_dir = dev / "devices"
    for node in (cdev_dir.iterdir() if cdev_dir.is_dir() else ()):
        if node.name not in {f"vfio{n}" for n in cdevs.values()}:
            node.unlink()
    for bdf in facts.iommu_groups:
        folder = Path(os.path.realpath(root / f"sys/bus/pci/devices/{bdf}")) / "vfio-dev"
        shutil.rmtree(folder, ignore_errors=True)
    for bdf, n in cdevs.items():
        w.chardev(f"dev/vfio/devices/vfio{n}", majors.get("vfio-dev", 0), n, 0o600)
        folder = Path(os.path.realpath(root / f"sys/bus/pci/devices/{bdf}")) / "vfio-dev" / f"vfio{n}"
        _attribute(folder / "dev", f"{majors.get('vfio-dev', 0)}:{n}\n", 0o444)
    if kernel.get("iommufd"):
        w.chardev("dev/iommu", majors.get("vfio-misc", 0), 0)
    elif (root / "dev/iommu").exists():
        (root / "dev/iommu").unlink()
