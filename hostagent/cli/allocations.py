"""``hostagent allocations``: the daemon's allocations (``GET /v1/allocations``) and the
release of one (``DELETE /v1/allocations/ID``), for an admin who needs a device back (a MIG
layout change that would take it away, a sharing change) when no kubelet plugin will.

Allocations live in the daemon: without it there is nothing to list or release (its
checkpoint is only read at its next start).
"""

from __future__ import annotations

from .common import host_from_args
from .output import add_output_flag, emit, table

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("allocations", help="list the daemon's allocations, or release one",
                       description="The devices the daemon has handed out (to the device plugin, a DRA "
                                   "driver or a user of its API), through its socket.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    v = verbs.add_parser("list", help="every allocation: id, devices, sharing, owner, client, age")
    add_output_flag(v)
    v.set_defaults(run=run_list)
    v = verbs.add_parser("release", help="release an allocation: its devices are free again",
                         description="Release allocation ID (as DELETE /v1/allocations/ID): its transient CDI "
                                     "spec goes and its devices may be allocated, or taken by a MIG change, "
                                     "again. A container still using them keeps running on them. Only "
                                     "its owner, or root, may release it.")
    v.add_argument("id", metavar="ID", help="the allocation's id (hostagent allocations list)")
    v.set_defaults(run=run_release)
    v = verbs.add_parser("dismiss-unreadable", help="free the devices that unreadable checkpoint records hold",
                         description="The daemon keeps every allocation record of its checkpoint it can read; "
                                     "those it cannot are set aside (GET /v1/checkpoint/unreadable lists them and "
                                     "the files that keep them), and the devices they name are refused to new "
                                     "allocations until an admin decides. Once settled (the devices checked, "
                                     "allocations made again by hand where needed), this dismisses the records "
                                     "(as DELETE /v1/checkpoint/unreadable): the devices are allocatable again, "
                                     "the files stay. Root only.")
    add_output_flag(v)
    v.set_defaults(run=run_dismiss)


def _client(args):
    from ..errors import UnavailableError
    from .common import daemon_client
    host = host_from_args(args)
    client = daemon_client(host)
    if client is None:
        raise UnavailableError("the hostagent daemon does not run: allocations live in it",
                               where=str(host.host("/run/hostagent")),
                               hint="start it: systemctl start hostagent, or hostagent serve")
    return client


def _age(created: float | None) -> str:
    import time
    if not created:
        return "-"
    seconds = int(max(0, time.time() - created))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _user(uid: int | None) -> str | None:
    """The owner's user name (its uid when it has none here)."""
    import pwd
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def render(allocations: list[dict]) -> None:
    """OWNER: the user whose allocation it is (only it, or root, may release it); CLIENT:
    the program that made it, when it says (the device plugin does)."""
    if not allocations:
        print("no allocation")
        return
    rows = [[a["id"], ",".join(a.get("replicas") or a["devices"]), (a.get("sharing") or {}).get("strategy"),
             _user(a.get("owner")), (a.get("labels") or {}).get("owner"), _age(a.get("created"))]
            for a in allocations]
    print(table(["ID", "DEVICES", "SHARING", "OWNER", "CLIENT", "AGE"], rows))


def run_list(args) -> int:
    with _client(args) as client:
        allocations = client.allocations()
    emit(allocations, args.output, render)
    return 0


def run_release(args) -> int:
    with _client(args) as client:
        released = client.release(args.id)
    print(f"released {released['id']}: {', '.join(released['devices'])} free again")
    return 0


def run_dismiss(args) -> int:
    with _client(args) as client:
        out = client.request("DELETE", "/v1/checkpoint/unreadable").json()

    def text(o) -> None:
        if not o["dismissed"]:
            print("no unreadable checkpoint record to dismiss")
        for r in o["dismissed"]:
            print(f"dismissed: {r['reason']} (kept in {r['kept_as']}; held "
                  f"{', '.join(r['devices']) if r['devices'] else 'every device'})")
    emit(out, args.output, text)
    return 0
