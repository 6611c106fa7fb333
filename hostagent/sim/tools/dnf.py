"""Stand-ins for the RHEL family's package tools, as far as the driver installer uses them,
backed by the simulated node's package model (``hostagent.sim.packages``, ``sim.upgrade``):

* ``rpm -qa --qf FORMAT``: the installed packages (``%{NAME}``, ``%{EPOCHNUM}:%{VERSION}-%{RELEASE}``);
* ``dnf list --showduplicates --available NAME...``: ``NAME.x86_64  VERSION  REPO``, oldest first;
* ``dnf install [options] NAME-VERSION...``: "No match for argument" (exit 1) for a version
  not offered, else the packages are installed and the node's driver files move to their
  version;
* ``dnf versionlock add|delete|list``, ``dnf module reset|enable`` (accepted).
"""

from __future__ import annotations

import re
import sys

__all__ = ["rpm", "dnf"]


def _model(root: str):
    from pathlib import Path
    from ..packages import PackageDb, distro_of, offered
    from ..store import SimStore
    store = SimStore(root)
    distro = distro_of(Path(root))
    return store, distro, PackageDb.load(Path(root)), offered(store.root, distro, store.facts.driver_version)


def rpm(root: str, argv: list[str]) -> int:
    _, _, db, _ = _model(root)
    fmt = argv[argv.index("--qf") + 1] if "--qf" in argv else "%{NAME}-%{VERSION}-%{RELEASE}\n"
    for name, version in sorted(db.installed.items()):
        epoch, _, rest = version.rpartition(":")
        ver, _, release = rest.partition("-")
        line = (fmt.replace("%{NAME}", name).replace("%{EPOCHNUM}", epoch or "0")
                .replace("%{VERSION}", ver).replace("%{RELEASE}", release))
        sys.stdout.write(line.replace("\\t", "\t").replace("\\n", "\n"))
    return 0


def _split(spec: str) -> tuple[str, str]:
    m = re.fullmatch(r"(.+?)-(\d+:.+)", spec)
    return (m.group(1), m.group(2)) if m else (spec, "")


def dnf(root: str, argv: list[str]) -> int:
    from ..upgrade import install
    store, distro, db, repo = _model(root)
    words = [a for a in argv if not a.startswith("-")]
    verb, rest = (words[0] if words else ""), words[1:]
    if verb == "module":
        return 0
    if verb == "list":
        for name in rest:
            for version in repo.get(name, ()):
                print(f"{name}.x86_64  {version}  cuda-rhel9-x86_64")
        return 0
    if verb == "versionlock":
        action, names = (rest[0] if rest else "list"), rest[1:]
        if action == "list":
            for name in sorted(db.held):
                print(f"{name}-{db.installed.get(name, '0:0-0')}.*")
            return 0
        for spec in names:
            name = _split(spec)[0]
            (db.held.add if action == "add" else db.held.discard)(name)
        db.save(store.root)
        return 0
    if verb != "install":
        print(f"No such command: {verb}.", file=sys.stderr)
        return 1
    wanted = {}
    for spec in rest:
        name, version = _split(spec)
        version = version or (repo.get(name) or [""])[-1]
        if version not in repo.get(name, ()):
            print(f"No match for argument: {spec}\nError: Unable to find a match: {spec}", file=sys.stderr)
            return 1
        wanted[name] = version
    for name, version in wanted.items():
        print(f"  Installing       : {name}-{version}.x86_64")
    install(store, distro, wanted)
    return 0
