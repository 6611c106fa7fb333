"""Stand-ins for the Debian and Ubuntu package tools, as far as the driver installer uses them,
backed by the simulated node's package model (``hostagent.sim.packages``, ``sim.upgrade``):

* ``dpkg-query -W -f FORMAT [NAME...]``: the installed packages (``${Package}``,
  ``${Version}``, ``${db:Status-Abbrev}``: ``ii`` installed, ``hi`` held);
* ``apt-cache madison NAME...``: one line per version the repositories offer, newest first;
* ``apt-mark hold|unhold|showhold [NAME...]``;
* ``apt-get install [options] NAME=VERSION...``: apt's refusals (``E: Version '...' for
  '...' was not found``, a held package changed without ``--allow-change-held-packages``,
  exit 100), else the packages are installed and the node's driver files move to their
  version. ``apt-get update`` does nothing.
"""

from __future__ import annotations

import sys

__all__ = ["dpkg_query", "apt_cache", "apt_mark", "apt_get"]


def _model(root: str):
    from pathlib import Path
    from ..packages import PackageDb, distro_of
    from ..store import SimStore
    store = SimStore(root)
    return store, distro_of(Path(root)), PackageDb.load(Path(root))


def dpkg_query(root: str, argv: list[str]) -> int:
    _, _, db = _model(root)
    fmt = argv[argv.index("-f") + 1] if "-f" in argv else "${Package}\t${Version}\n"
    names = [a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] != "-f")]
    missing = [n for n in names if n not in db.installed]
    for name, version in sorted(db.installed.items()):
        if names and name not in names:
            continue
        status = "hi " if name in db.held else "ii "
        line = fmt.replace("${Package}", name).replace("${Version}", version).replace("${db:Status-Abbrev}", status)
        sys.stdout.write(line.replace("\\t", "\t").replace("\\n", "\n"))
    for name in missing:
        print(f"dpkg-query: no packages found matching {name}", file=sys.stderr)
    return 1 if missing else 0


def apt_cache(root: str, argv: list[str]) -> int:
    from ..packages import offered
    store, distro, _ = _model(root)
    if argv[:1] != ["madison"]:
        print("E: the simulated apt-cache knows only 'madison'", file=sys.stderr)
        return 100
    repo = offered(store.root, distro, _node_version(store))
    suite = distro.os_release.get("VERSION_CODENAME", "stable")
    for name in argv[1:]:
        for version in reversed(repo.get(name, ())):
            print(f" {name} | {version} | http://simulated.invalid/{distro.family} {suite}/main amd64 Packages")
    return 0


def apt_mark(root: str, argv: list[str]) -> int:
    store, _, db = _model(root)
    verb, names = (argv[0] if argv else ""), argv[1:]
    if verb == "showhold":
        for name in sorted(db.held):
            print(name)
        return 0
    if verb not in ("hold", "unhold"):
        print(f"E: Invalid operation {verb}", file=sys.stderr)
        return 100
    for name in names:
        if name not in db.installed:
            print(f"E: Unable to locate package {name}", file=sys.stderr)
            return 100
        (db.held.add if verb == "hold" else db.held.discard)(name)
        print(f"{name} {'set on hold' if verb == 'hold' else 'was already not on hold'}.")
    db.save(store.root)
    return 0


def apt_get(root: str, argv: list[str]) -> int:
    from ..packages import offered
    from ..upgrade import install
    store, distro, db = _model(root)
    words = [a for i, a in enumerate(argv) if not a.startswith("-") and argv[i - 1:i] != ["-o"]]
    if words[:1] == ["update"]:
        return 0
    if words[:1] != ["install"]:
        print("E: the simulated apt-get knows only 'install' and 'update'", file=sys.stderr)
        return 100
    repo = offered(store.root, distro, _node_version(store))
    wanted = {}
    for spec in words[1:]:
        name, _, version = spec.partition("=")
        if name not in repo:
            print(f"E: Unable to locate package {name}", file=sys.stderr)
            return 100
        version = version or repo[name][-1]
        if version not in repo[name]:
            print(f"E: Version '{version}' for '{name}' was not found", file=sys.stderr)
            return 100
        wanted[name] = version
    changed_held = [n for n in wanted if n in db.held and db.installed.get(n) != wanted[n]]
    if changed_held and "--allow-change-held-packages" not in argv:
        print("E: Held packages were changed and -y was used without --allow-change-held-packages.",
              file=sys.stderr)
        return 100
    for name, version in wanted.items():
        print(f"Setting up {name} ({version}) ...")
    install(store, distro, wanted)
    return 0


def _node_version(store) -> str:
    return store.facts.driver_version
