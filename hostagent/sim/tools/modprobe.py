"""``modprobe`` stand-in for the NVIDIA modules (what the driver installer runs).

Reproduced behaviour (kmod's modprobe, for the modules the driver ships):

* ``modprobe nvidia`` (and ``nvidia-uvm``, ``nvidia-modeset``, ``nvidia-drm``,
  ``nvidia-peermem``, Debian's ``nvidia-current``; ``-`` and ``_`` alike) loads the module on
  disk (``lib/modules/<release>/updates/dkms/nvidia.ko``, see ``hostagent.sim.kmod``): a
  no-op when loaded, "modprobe: FATAL: Module nvidia not found in directory
  /lib/modules/<release>" (exit 1) without one, "modprobe: ERROR: could not insert 'nvidia':
  No such device" (exit 1) while nouveau holds the GPUs.
* ``modprobe -r MODULE...`` unloads them: "modprobe: FATAL: Module nvidia is in use." (exit
  1) while processes use GPUs; nothing to do when not loaded. ``-r nouveau`` unloads nouveau.
* ``modprobe vfio_pci`` (``vfio-pci``) loads the kernel's vfio-pci module
  (``lib/modules/<release>/kernel/drivers/vfio/pci/vfio-pci.ko``: "Module vfio_pci not
  found" without it); ``-r vfio_pci`` is refused while it holds a device ("Module vfio_pci
  is in use.").
* Other modules are accepted and ignored; ``-q``, ``-v``, ``-a`` are accepted.

The simulator loads and unloads the nvidia modules together, as one unit.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

NVIDIA = {"nvidia", "nvidia_current", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem"}
VFIO = {"vfio_pci"}


def main(root: str, argv: list[str]) -> int:
    from ...errors import StateError
    from .. import kmod
    from ..store import SimStore
    flags = {a for a in argv if a.startswith("-")}
    names = {a.replace("-", "_") for a in argv if not a.startswith("-")}
    if not names:
        print("modprobe: ERROR: missing module name.", file=sys.stderr)
        return 1
    store = SimStore(root)
    if names & VFIO:
        from .. import pcibus
        try:
            (pcibus.unload_vfio if flags & {"-r", "--remove"} else pcibus.load_vfio)(store)
        except StateError as e:
            print(e.what, file=sys.stderr)
            return 1
        names -= VFIO
    if flags & {"-r", "--remove"}:
        if "nouveau" in names:
            with store.mutate() as state:
                state.driver.pop("nouveau", None)
                kmod.nouveau_files(store.root, False)
                kmod.bind_all(store.root, state, None)
        if names & NVIDIA:
            try:
                kmod.unload(store)
            except StateError:
                print("modprobe: FATAL: Module nvidia is in use.", file=sys.stderr)
                return 1
        return 0
    if names & NVIDIA:
        try:
            loaded = kmod.load(store)
        except StateError as e:
            print(e.what, file=sys.stderr)
            return 1
        if loaded is None:
            print("modprobe: ERROR: could not insert 'nvidia': No such device", file=sys.stderr)
            return 1
    return 0
