"""Apply CDI devices to an OCI runtime config, with the CDI library's semantics and order.

Like ``Cache.InjectDevices``: the edits of every requested device are collected, each
spec's top-level edits once, before the first device it supplies; then they are applied in
one pass: env (a name already set is replaced), device nodes (an existing node at the same
path is replaced; ``b``/``c`` nodes get a cgroup allow rule), mounts (same destination
replaced, then all mounts stably sorted by path depth so parents come before children),
hooks (appended to their OCI list), additional GIDs and intelRdt.

``inject`` is pure apart from stat()ing device nodes a spec does not fully describe; it
returns a new config and never changes its input, so a failure leaves nothing half-applied.
"""

from __future__ import annotations

import copy
import os
import stat as st

from ..errors import ConfigError, NotFoundError

__all__ = ["collect_edits", "apply_edits", "inject", "HOOK_LISTS"]

# CDI hookName -> OCI hooks list (same names; prestart is deprecated by OCI but still valid).
HOOK_LISTS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


def collect_edits(cache, names, *, driver_only_kinds=()) -> list[dict]:
    """The containerEdits to apply for ``names`` (fully qualified), in CDI's order.

    ``driver_only_kinds``: kinds whose spec-level edits are wanted without any device
    (NVIDIA_VISIBLE_DEVICES=none). An unknown name raises NotFoundError naming it and
    every device the directories offer.
    """
    wanted = list(dict.fromkeys(names))            # de-duplicated, first order kept
    missing = [n for n in wanted if n not in cache.devices]
    if missing:
        kinds = {n.split("=", 1)[0] for n in missing}
        offered = sorted(d for d in cache.devices if d.split("=", 1)[0] in kinds) or sorted(cache.devices)
        hint = "devices offered: " + (", ".join(offered) if offered else "none")
        if cache.errors:
            hint += "; specs skipped: " + "; ".join(cache.errors)
        raise NotFoundError(f"unresolvable CDI device{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}", hint=hint)
    out, seen_specs = [], set()

    def spec_edits(path, spec):
        if path not in seen_specs:
            seen_specs.add(path)
            if spec.get("containerEdits"):
                out.append(spec["containerEdits"])

    for kind in driver_only_kinds:
        found = cache.spec_for_kind(kind)
        if found is None:
            raise NotFoundError(f"no CDI spec of kind {kind} for the driver files",
                                hint="devices offered: " + (", ".join(sorted(cache.devices)) or "none"))
        spec_edits(*found)
    for name in wanted:
        dev = cache.devices[name]
        spec_edits(dev.path, dev.spec)
        out.append(dev.edits)
    return out


def _host_node(node: dict, lstat) -> dict:
    """Fill type, major, minor (and fileMode) from the host unless the spec gives them."""
    kind = node.get("type", "")
    if kind and (node.get("major", 0) != 0 or kind == "p"):
        return node
    host_path = node.get("hostPath") or node["path"]
    try:
        info = lstat(host_path)
    except OSError as e:
        raise ConfigError(f"failed to stat CDI host device {host_path}: {e.strerror}") from None
    if st.S_ISCHR(info.st_mode):
        found = "c"
    elif st.S_ISBLK(info.st_mode):
        found = "b"
    elif st.S_ISFIFO(info.st_mode):
        found = "p"
    else:
        raise ConfigError(f"CDI host device {host_path} is not a device node")
    if kind and kind != found:
        raise ConfigError(f"CDI device {node['path']}: host type mismatch, spec says {kind}, host has {found}")
    out = dict(node, type=found, major=os.major(info.st_rdev), minor=os.minor(info.st_rdev))
    out.setdefault("fileMode", st.S_IMODE(info.st_mode))
    return out


def _oci_device(node: dict, user: dict) -> dict:
    dev = {"path": node["path"], "type": node["type"]}
    if node["type"] != "p":
        dev.update(major=node.get("major", 0), minor=node.get("minor", 0))
    for key in ("fileMode", "uid", "gid"):
        if node.get(key) is not None:
            dev[key] = node[key]
    # As the CDI library: unset owner -> the container's non-root user.
    for key in ("uid", "gid"):
        if key not in dev and user.get(key, 0) > 0:
            dev[key] = user[key]
    return dev


def _depth(mount: dict) -> int:
    return len([p for p in os.path.normpath(mount.get("destination", "/")).split("/") if p])


def apply_edits(config: dict, edits_list: list[dict], *, lstat=os.lstat) -> dict:
    """A copy of the OCI ``config`` with ``edits_list`` (CDI containerEdits) applied."""
    cfg = copy.deepcopy(config)
    merged = {k: [] for k in ("env", "deviceNodes", "mounts", "hooks", "additionalGids")}
    intel_rdt = None
    for edits in edits_list:
        for key in merged:
            merged[key] += edits.get(key) or []
        if edits.get("intelRdt") is not None:
            intel_rdt = edits["intelRdt"]     # the last one wins, as in the library

    process = cfg.setdefault("process", {})
    if merged["env"]:
        env = list(process.get("env") or [])
        for item in merged["env"]:
            name = item.split("=", 1)[0]
            index = next((i for i, e in enumerate(env) if e.split("=", 1)[0] == name), None)
            if index is None:
                env.append(item)
            else:
                env[index] = item
        process["env"] = env

    if merged["deviceNodes"]:
        linux = cfg.setdefault("linux", {})
        user = process.get("user") or {}
        devices = list(linux.get("devices") or [])
        rules = (linux.setdefault("resources", {})).setdefault("devices", [])
        for node in merged["deviceNodes"]:
            node = _host_node(node, lstat)
            dev = _oci_device(node, user)
            devices = [d for d in devices if d.get("path") != dev["path"]] + [dev]
            if dev["type"] in ("b", "c"):
                rules.append({"allow": True, "type": dev["type"], "major": dev["major"],
                              "minor": dev["minor"], "access": node.get("permissions") or "rwm"})
        linux["devices"] = devices

    if merged["mounts"]:
        mounts = list(cfg.get("mounts") or [])
        for m in merged["mounts"]:
            oci = {"destination": m["containerPath"], "source": m["hostPath"]}
            if m.get("type"):
                oci["type"] = m["type"]
            if m.get("options"):
                oci["options"] = list(m["options"])
            mounts = [x for x in mounts if x.get("destination") != oci["destination"]] + [oci]
        cfg["mounts"] = sorted(mounts, key=_depth)     # stable: equal depths keep their order

    if merged["hooks"]:
        hooks = cfg.setdefault("hooks", {})
        for h in merged["hooks"]:
            oci = {"path": h["path"]}
            for key in ("args", "env", "timeout"):
                if h.get(key) is not None:
                    oci[key] = list(h[key]) if isinstance(h[key], list) else h[key]
            hooks.setdefault(h["hookName"], []).append(oci)

    gids = [g for g in merged["additionalGids"] if g != 0]
    if gids:
        user = process.setdefault("user", {"uid": 0, "gid": 0})
        user["additionalGids"] = list(user.get("additionalGids") or []) + gids
    if intel_rdt is not None:
        cfg.setdefault("linux", {})["intelRdt"] = dict(intel_rdt)
    return cfg


def inject(config: dict, cache, names, *, driver_only_kinds=(), lstat=os.lstat) -> dict:
    """A copy of ``config`` with the devices ``names`` from ``cache`` applied."""
    return apply_edits(config, collect_edits(cache, names, driver_only_kinds=driver_only_kinds), lstat=lstat)
