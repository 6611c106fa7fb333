"""Moving a GPU's IOMMU group to vfio-pci and back, through the kernel's attributes, with a
journal: a crash at any point leaves a record the next start settles (``settle``).

To vfio-pci, as NVIDIA's DRA driver does it and the kernel's driver_override recipe says
(sysfs-bus-pci ABI): persistence mode off first (``nvidia-smi -i <bdf> -pm 0``, which asks
nvidia-persistenced to let the GPU go while it runs), the nvidia driver's unbind lock taken
(``/proc/driver/nvidia/gpus/<bdf>/unbindLock``: 1 written and read back, refused while
anything has the GPU open), then for each function of the group ``driver_override`` set to
vfio-pci, the function unbound from its driver and probed again (``drivers_probe``), which
binds it to vfio-pci. Back: ``driver_override`` cleared, unbound from vfio-pci, probed (its
own driver takes it), and persistence mode set again through NVML's legacy flag where it was
on (nvidia-persistenced does not take back a GPU bound after its start).
"""

from __future__ import annotations

import logging
import os

from ..errors import HostagentError, StateError
from ..hostroot import HostRoot
from ..journalfile import JournalFile
from . import ledger
from .plan import VFIO_DRIVER, VFIO_DRIVERS, BindPlan, PassthroughRefused, PassthroughUnavailable

__all__ = ["PassthroughJournal", "bind", "unbind", "settle", "sweep", "ensure_vfio_pci", "persistence_of",
           "driver_of"]

log = logging.getLogger("hostagent.daemon")

# The pauses between the tries at the nvidia driver's unbind lock: NVIDIA's DRA driver
# (scripts/unbind_from_driver.sh, acquire_unbind_lock) tries 5 times, sleeping 1, 2, 3 and
# 4 s between them (10 s in all) while a program closes the GPU (nvidia-persistenced
# letting it go, a monitoring agent's NVML shutting down); its sleep after the last try
# waits for nothing.
UNBIND_LOCK_PAUSES = (1, 2, 3, 4)


class PassthroughJournal(JournalFile):
    folder = ledger.FOLDER
    what = "the passthrough journal"
    hint = "remove it after checking each GPU's driver in /sys/bus/pci/devices/<bdf>/driver"

    def _write(self) -> None:
        from ..fileio import ensure_dir
        ensure_dir(self.directory(self.host), 0o700)
        super()._write()


def driver_of(host: HostRoot, bdf: str) -> str:
    try:
        # The device's folder resolved, its driver link read (not followed).
        return os.path.basename(os.readlink(host.host(f"/sys/bus/pci/devices/{bdf}") / "driver"))
    except OSError:
        return ""


def _write(host: HostRoot, path: str, value: str) -> None:
    try:
        host.platform.write_attribute(host, path, value)
    except OSError as e:
        raise StateError(f"writing {value.strip() or 'nothing'} to {path} failed: {e.strerror or e}",
                         where=path) from None


def ensure_vfio_pci(host: HostRoot) -> None:
    """vfio-pci loaded, as NVIDIA's DRA driver loads it (``modprobe vfio_pci``)."""
    if os.path.isdir(host.host("/sys/module/vfio_pci")):
        return
    from ..driver.system import CommandFailed, Runner
    try:
        Runner(host, timeout=60).run(["modprobe", "vfio_pci"])
    except (CommandFailed, HostagentError) as e:
        raise PassthroughUnavailable(f"the vfio_pci kernel module is not loaded and cannot be: {e.message}",
                                     hint="install the kernel's VFIO modules and run modprobe vfio_pci") from None


def persistence_of(host: HostRoot, bdf: str) -> bool:
    """Whether the GPU at ``bdf`` is in persistence mode (False when NVML cannot say)."""
    import pynvml as N
    from ..devices import nvml_session
    try:
        with nvml_session(host):
            handle = N.nvmlDeviceGetHandleByPciBusId(bdf.encode())
            return N.nvmlDeviceGetPersistenceMode(handle) == N.NVML_FEATURE_ENABLED
    except (N.NVMLError, HostagentError):
        return False


def _persistence_off(host: HostRoot, bdf: str) -> None:
    import subprocess
    tool = host.driver_command("nvidia-smi")
    if tool is None:
        raise StateError(f"GPU {bdf}: persistence mode is on and nvidia-smi, which turns it off, was not found",
                         hint="install the NVIDIA driver utilities, or turn persistence mode off yourself")
    done = subprocess.run([*tool, "-i", bdf, "-pm", "0"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        out = " ".join((done.stdout + done.stderr).split()) or "no output"
        raise StateError(f"GPU {bdf}: persistence mode not turned off (nvidia-smi exit {done.returncode}: {out})")


def _persistence_on(host: HostRoot, bdf: str) -> None:
    import pynvml as N
    from ..devices import nvml_session
    try:
        with nvml_session(host):
            handle = N.nvmlDeviceGetHandleByPciBusId(bdf.encode())
            N.nvmlDeviceSetPersistenceMode(handle, N.NVML_FEATURE_ENABLED)
    except (N.NVMLError, HostagentError) as e:
        log.warning("GPU %s: persistence mode not restored: %s", bdf, getattr(e, "message", e))


def _unbind_lock(host: HostRoot, bdf: str) -> None:
    path = f"/proc/driver/nvidia/gpus/{bdf}/unbindLock"
    if not os.path.exists(host.host(path)):
        return
    for pause in (*UNBIND_LOCK_PAUSES, None):
        _write(host, path, "1")
        try:
            if open(host.host(path)).read().strip() == "1":
                return
        except OSError:
            pass
        if pause is not None:
            host.platform.pause(pause)
    raise PassthroughRefused(f"GPU {bdf} is in use: the nvidia driver will not let it go (its unbind lock is "
                             "refused while a program has the GPU open)", gpu=bdf,
                             hint="stop what has it open (a CUDA program, DCGM, a monitoring agent), then try again")


def _to(host: HostRoot, bdf: str, driver: str, override: str) -> None:
    """One function to ``driver`` (none for ""): override set, unbound, probed."""
    _write(host, f"/sys/bus/pci/devices/{bdf}/driver_override", override + "\n")
    current = driver_of(host, bdf)
    if current == driver:
        return
    if current:
        if current == "nvidia":
            _unbind_lock(host, bdf)
        _write(host, f"/sys/bus/pci/drivers/{current}/unbind", bdf)
    if driver:
        _write(host, "/sys/bus/pci/drivers_probe", bdf)
        if driver_of(host, bdf) != driver:
            _write(host, f"/sys/bus/pci/drivers/{driver}/bind", bdf)
    if driver_of(host, bdf) != driver:
        raise StateError(f"PCI function {bdf} is bound to {driver_of(host, bdf) or 'no driver'}, not {driver}",
                         where=f"/sys/bus/pci/devices/{bdf}/driver")


def bind(host: HostRoot, plan: BindPlan, alloc_id: str, uuid: str | None, step=lambda name: None) -> dict:
    """Worker, under the node lock: the plan's functions on vfio-pci, recorded (``ledger``)
    and journaled first; its record (what goes back where). Nothing is left moved when it
    fails (what could not go back stays in the ledger, for the next start); the journal
    stays until the allocation's commit (``done``). ``step(name)`` is called after each
    function moved (the daemon's crash points)."""
    functions = plan.record()
    persistence = persistence_of(host, plan.gpu.bdf) if plan.gpu.driver == "nvidia" else False
    known = ledger.load(host).get(plan.gpu.bdf)
    if known is not None:
        # The agent put it on vfio-pci before and it was not bound back (a release that
        # failed): its functions still on vfio-pci go back to the drivers they came from.
        back = {f["bdf"]: f["driver"] for f in known["functions"]}
        functions = [{**f, "driver": back.get(f["bdf"], f["driver"])} if f["driver"] in VFIO_DRIVERS else f
                     for f in functions]
        if plan.gpu.driver in VFIO_DRIVERS:
            persistence = bool(known.get("persistence"))
        uuid = uuid or known.get("uuid")
    record = {"id": alloc_id, "gpu": plan.gpu.bdf, "uuid": uuid, "group": plan.gpu.iommu_group,
              "functions": functions, "persistence": persistence}
    ledger.keep(host, record)
    journal = PassthroughJournal(host, {"op": "bind", **record})
    journal._write()
    try:
        if persistence and plan.gpu.driver == "nvidia":
            _persistence_off(host, plan.gpu.bdf)
        for move in plan.moves:
            _to(host, move.bdf, VFIO_DRIVER, VFIO_DRIVER)
            step("passthrough:bound_one")
    except BaseException:
        try:
            unbind(host, record)
        except HostagentError as e:
            log.error("GPU %s not bound back after a failed passthrough: %s", plan.gpu.bdf, e.message)
        journal.finish()
        raise
    return record


def unbind(host: HostRoot, record: dict) -> None:
    """Worker, under the node lock: the record's functions back on their drivers, the GPU
    last, and its persistence mode again."""
    errors = []
    for f in reversed(record["functions"]):
        try:
            _to(host, f["bdf"], f["driver"], "")
        except HostagentError as e:
            errors.append(e.message)
    if record.get("persistence") and driver_of(host, record["gpu"]) == "nvidia":
        _persistence_on(host, record["gpu"])
    if errors:
        raise StateError(f"GPU {record['gpu']} not bound back: {'; '.join(errors)}",
                         hint="see /sys/bus/pci/devices/<bdf>/driver; the agent tries again at its next start")
    ledger.forget(host, record["gpu"])


def release(host: HostRoot, record: dict) -> None:
    """Worker: journaled, the record's functions back (the journal stays until the
    checkpoint drops the allocation: ``done``)."""
    PassthroughJournal(host, {"op": "release", **record})._write()
    unbind(host, record)


def done(host: HostRoot) -> None:
    j = PassthroughJournal.load(host)
    if j is not None:
        j.finish()


def settle(host: HostRoot, saved: list) -> tuple[list, list[str]]:
    """Worker, at start, under the node lock: a passthrough interrupted by a crash settled
    from its journal. A bind whose allocation the checkpoint holds goes forward (every
    function on vfio-pci), one it does not goes back; a release goes forward (the functions
    back, the allocation dropped). The allocations to keep, and what was done."""
    try:
        journal = PassthroughJournal.load(host)
    except StateError as e:
        return saved, [e.message]
    if journal is None:
        return saved, []
    rec = journal.record
    notes = []
    committed = any(a.id == rec.get("id") for a in saved)
    # A journal older than the checkpoint (left by a release that failed) must not take a
    # GPU from the allocation that holds it now.
    holder = next((a.id for a in saved for r in a.passthrough if r["gpu"] == rec.get("gpu")), None)
    try:
        if rec.get("op") == "bind" and committed:
            for f in rec["functions"]:
                _to(host, f["bdf"], VFIO_DRIVER, VFIO_DRIVER)
            notes.append(f"passthrough of GPU {rec['gpu']} for {rec['id']} finished after a crash")
        elif holder not in (None, rec.get("id")):
            saved = [a for a in saved if a.id != rec.get("id") or rec.get("op") != "release"]
            notes.append(f"passthrough journal of {rec.get('id')} dropped, GPU {rec['gpu']} left as it is: "
                         f"allocation {holder} holds it now")
        else:
            unbind(host, rec)
            if rec.get("op") == "release":
                saved = [a for a in saved if a.id != rec.get("id")]
                notes.append(f"release of GPU {rec['gpu']} from {rec['id']} finished after a crash")
            else:
                notes.append(f"passthrough of GPU {rec['gpu']} for {rec['id']} rolled back after a crash")
    except HostagentError as e:
        notes.append(f"passthrough journal of {rec.get('id')} not settled: {e.message}")
        return saved, notes
    journal.finish()
    return saved, notes


def sweep(host: HostRoot, kept: list, for_vms) -> list[str]:
    """Worker, at start, after ``settle``, under the node lock: each GPU the agent put on
    vfio-pci (``ledger``) that no allocation of ``kept`` holds goes back to its drivers,
    but one the admin keeps for VMs (``for_vms(bdf)``), which stays for the next VM; one
    on no VFIO driver any more (a reboot, bound back by hand) is forgotten. A GPU the
    agent did not move is not looked at. What was done."""
    try:
        moved = ledger.load(host)
    except StateError as e:
        return [e.message]
    held = {rec["gpu"] for a in kept for rec in a.passthrough}
    notes = []
    for bdf, rec in moved.items():
        if bdf in held:
            continue
        if not any(driver_of(host, f["bdf"]) in VFIO_DRIVERS for f in rec["functions"]):
            ledger.forget(host, bdf)
        elif not for_vms(bdf):
            try:
                unbind(host, rec)
            except HostagentError as e:
                notes.append(e.message)
                continue
            notes.append(f"GPU {bdf}, left on vfio-pci by the agent with no allocation holding it, bound back to "
                         f"{', '.join(sorted({f['driver'] or 'no driver' for f in rec['functions']}))}")
    return notes
