"""``hostagent devices``: the node's GPUs and MIG devices, with their health when the
daemon runs (its API carries the health monitor's view; without it health is ``unknown``).

A lost GPU reads here as an unreadable one and, once the daemon has re-read the inventory,
is missing from its device list too; its health record stays in ``GET /v1/health`` under
its UUID, marked ``lost``, and is shown from there: a row of the GPU table saying ``lost``,
and ``uuid``, ``lost`` and ``health`` on its ``unreadable`` entry in JSON/YAML."""

from __future__ import annotations

from dataclasses import dataclass, field

from .common import PRIVILEGE_HINT, daemon_client, host_from_args, unread_lines
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("devices", help="list GPUs and MIG devices",
                       description="List GPUs and MIG devices as NVML reports them.")
    p.add_argument("--profiles", action="store_true",
                   help="also list each GPU's MIG GPU-instance profiles and placements")
    add_output_flag(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..devices import read_inventory
    host = host_from_args(args)
    inv = read_inventory(host)
    health = device_health(host, lost=bool(inv.unreadable))
    if args.output != "table":
        emit(document(inv, health, profiles=args.profiles), args.output, None)
        return 0
    from ..vfio.pci import read_gpus
    elsewhere = _elsewhere_rows(read_gpus(host), passthrough_holders(host))
    print(render(inv, profiles=args.profiles, health=health, elsewhere=elsewhere))
    return 0


@dataclass
class DaemonHealth:
    """What the daemon knows of the devices' health, as its devices carry it ({state,
    reason, message, since}) by UUID (GPUs also by ``gpu:<index>``); and the GPUs its health
    monitor holds as lost: index -> the key of their record (the UUID; ``gpu:<index>`` for
    a GPU lost before the daemon ever read it)."""
    by_key: dict[str, dict] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)

    def get(self, key: str) -> dict:
        from ..model import UNKNOWN_HEALTH
        return self.by_key.get(key, UNKNOWN_HEALTH)

    def key_for(self, index: int) -> str:
        """The key of GPU ``index``'s record: its UUID when the daemon holds it as lost."""
        return self.lost.get(index) or f"gpu:{index}"


def device_health(host, *, lost: bool = False) -> DaemonHealth:
    """Health from the daemon (``GET /v1/devices``; with ``lost``, for GPUs NVML could not
    read here, also ``GET /v1/health``: the daemon no longer lists a lost GPU, only keeps
    its record); empty when none answers."""
    client = daemon_client(host, timeout=5.0)
    if client is None:
        return DaemonHealth()
    from ..client import DaemonNotRunning
    from ..errors import PermissionDenied, UnavailableError
    try:
        with client:
            data = client.devices()
            records = client.health() if lost else None
    except (DaemonNotRunning, PermissionDenied, UnavailableError):
        return DaemonHealth()  # health unknown; the inventory below is still the node's
    out = DaemonHealth()
    if records is not None:
        from ..daemon.health import api_health
        from ..health.statefile import state_from_dict
        for dev in state_from_dict(records).devices.values():
            # The API's summary of a record, as the daemon puts it on its devices.
            out.by_key[dev.key] = api_health(dev).to_dict()
            if dev.lost and not dev.is_mig:
                out.lost[dev.gpu] = dev.key
    # The devices' own health wins: it is the daemon's view, "unmonitored" included.
    out.by_key.update({d["uuid"]: d["health"] for d in (*data["gpus"], *data["mig_devices"])})
    out.by_key.update({f"gpu:{g['index']}": g["health"] for g in data["gpus"]})
    return out


def _uuid(key: str) -> str | None:
    return None if key.startswith("gpu:") else key


def document(inv, health: DaemonHealth, *, profiles: bool = False) -> dict:
    """The JSON/YAML listing: the API's ``DeviceList`` (``hostagent.model``) without what
    only the daemon knows, health from it (``unknown`` without it), and on each unreadable
    GPU the daemon holds as lost its ``uuid``, ``lost`` and ``health``."""
    from .. import model
    parts = model.inventory_devices(inv, profiles=profiles)
    data = model.device_list((model.device(part, health.get(uuid)) for uuid, part in parts.items()), inv)
    for bad in data["unreadable"]:
        key = health.key_for(bad["index"])
        bad["uuid"] = _uuid(key)
        bad["lost"] = bad["index"] in health.lost
        bad["health"] = health.get(key)
    return data


def _mig_mode(gpu) -> str:
    if gpu.mig is None:
        return "n/a"
    mode = "enabled" if gpu.mig.enabled else "disabled"
    if gpu.mig.change_pending:
        mode += f" (pending {'enabled' if gpu.mig.pending else 'disabled'})"
    return mode


def _mib(value) -> str:
    return "-" if value is None else f"{value} MiB"


def _state(health: DaemonHealth, uuid: str) -> str:
    return health.get(uuid)["state"]


def _gpu_rows(inv, health: DaemonHealth) -> list[list]:
    """The GPU table's rows by index: each GPU read, and each unreadable one the daemon holds
    as lost (it knows its UUID and health; NVML here knows nothing more of it)."""
    rows = {g.index: [g.index, g.minor, g.uuid, g.name, _mib(g.memory_mib), g.pci_bus_id,
                      g.compute_capability, g.architecture, _mig_mode(g), "nvidia", _state(health, g.uuid)]
            for g in inv.gpus}
    for bad in inv.unreadable:
        key = health.lost.get(bad.index)
        if key is not None:
            rows[bad.index] = [bad.index, "-", _uuid(key) or "-", "lost", "-", "-", "-", "-", "-", "nvidia",
                               _state(health, key)]
    return [rows[i] for i in sorted(rows)]


def _elsewhere_rows(gpus: list, holders: dict[str, tuple[str, str | None]]) -> list[list]:
    """GPUs on the PCI bus that the nvidia driver does not hold (NVML does not see them):
    passed through to a VM (with the allocation, from the daemon), or on another driver."""
    rows = []
    for g in gpus:
        if g.driver == "nvidia":
            continue
        alloc, uuid = holders.get(g.bdf, (None, None))
        state = f"passed through ({alloc})" if alloc else ("passed through" if g.driver in ("vfio-pci",
                                                           "nvgrace_gpu_vfio_pci") else "not usable")
        rows.append(["-", "-", uuid or "-", g.product, "-", g.bdf, "-", "-", "-", g.driver or "none", state])
    return rows


def passthrough_holders(host) -> dict[str, tuple[str, str | None]]:
    """bus id -> (allocation, GPU uuid) of the GPUs the daemon passed through; empty without it."""
    client = daemon_client(host, timeout=5.0)
    if client is None:
        return {}
    from ..client import DaemonNotRunning
    from ..errors import PermissionDenied, UnavailableError
    try:
        with client:
            allocations = client.allocations()
    except (DaemonNotRunning, PermissionDenied, UnavailableError):
        return {}
    return {rec["gpu"]: (a["id"], rec.get("uuid")) for a in allocations for rec in a.get("passthrough") or ()}


def render(inv, *, profiles: bool = False, health: DaemonHealth | None = None, elsewhere: list | None = None) -> str:
    """``elsewhere``: rows of the GPUs NVML does not see (``_elsewhere_rows``)."""
    health = health or DaemonHealth()
    out = [table(["GPU", "MINOR", "UUID", "PRODUCT", "MEMORY", "PCI BUS ID", "CC", "ARCH", "MIG", "DRIVER",
                  "HEALTH"], _gpu_rows(inv, health) + (elsewhere or []))]
    for bad in inv.unreadable:
        known = health.by_key.get(health.key_for(bad.index))
        out.append(f"GPU {bad.index}: unreadable: {bad.error}" + (f"; health: {known['state']}" if known else ""))
    unread = unread_lines(inv)
    if unread:
        out += unread + [f"  ({PRIVILEGE_HINT} to read them)"]
    migs = inv.mig_devices
    if migs:
        gpu_by_index = {g.index: g for g in inv.gpus}
        rows = [[d.name, d.uuid, d.profile, d.gi, d.ci, str(d.placement or "-"), _mib(d.memory_mib),
                 d.multiprocessors, f"{d.copy_engines}/{d.decoders}/{d.encoders}/{d.jpegs}/{d.ofas}",
                 _state(health, d.uuid)] for d in migs]
        out += ["", "MIG devices:",
                table(["DEVICE", "UUID", "PROFILE", "GI", "CI", "PLACEMENT", "MEMORY", "SMS",
                       "CE/DEC/ENC/JPG/OFA", "HEALTH"], rows, indent="  ")]
        empty = [(g.index, gi) for g in gpu_by_index.values() if g.mig
                 for gi in g.mig.gpu_instances if not gi.compute_instances]
        for index, gi in empty:
            out.append(f"  GPU {index}: GPU instance {gi.id} ({gi.profile} at {gi.placement}) "
                       "has no compute instance")
    if profiles:
        for (name, gpu_profiles), indices in profile_groups(inv).items():
            head = f"{'GPUs' if len(indices) > 1 else 'GPU'} {_ranges(indices)} ({name})"
            out.append("")
            if gpu_profiles is None:
                out.append(f"{head}: not MIG capable")
                continue
            rows = [[p.id, p.name, p.instances, f"{p.slices}/{p.memory_slices}", f"{p.memory_mib} MiB",
                     p.multiprocessors, f"{p.copy_engines}/{p.decoders}/{p.encoders}/{p.jpegs}/{p.ofas}",
                     (",".join(str(pl.start) for pl in p.placements) + f" (size {p.memory_slices})"
                      if p.placements else "-")]
                    for p in gpu_profiles]
            out += [f"{head} MIG GPU-instance profiles:",
                    table(["ID", "NAME", "INSTANCES", "SLICES C/M", "MEMORY", "SMS",
                           "CE/DEC/ENC/JPG/OFA", "PLACEMENTS"], rows, indent="  ")]
    return "\n".join(out)


def profile_groups(inv) -> dict[tuple, list[int]]:
    """(product, MIG profiles or None) -> the indices of the GPUs that have them: identical
    GPUs share one entry."""
    groups: dict[tuple, list[int]] = {}
    for g in inv.gpus:
        groups.setdefault((g.name, g.mig and g.mig.profiles), []).append(g.index)
    return groups


def _ranges(indices: list[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
