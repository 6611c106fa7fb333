"""Plain edits: a device set as env, mounts and device nodes that work without any hook.

For callers that cannot hand CDI names to the runtime (a device plugin's AllocateResponse
carries env, mounts and device specs, never hooks). What the hook would do at container
start is done with those three instead:

* each link to a library (``libcuda.so.1``, ``libcuda.so``) becomes one more read-only
  mount of the versioned library at the link's path. With the SONAME present as a file in
  the driver's folder, the dynamic linker finds it without a linker cache, in the default
  directories (``/usr/lib/x86_64-linux-gnu`` and the other multiarch folders);
* each link to a device node (``/dev/dri/by-path/...``) becomes one more device node at
  the link's path;
* ``NVIDIA_VISIBLE_DEVICES`` names the devices themselves (not ``void``, which only makes
  sense beside a CDI hook): a legacy NVIDIA hook in the same engine then injects the same
  devices, and an image's own ``NVIDIA_VISIBLE_DEVICES=all`` cannot widen the set.

Field names are CDI's (``containerEdits`` minus ``hooks``), with ``hostPath`` always given.
"""

from __future__ import annotations

import posixpath

from .edits import LIBRARY_MOUNT_OPTIONS, Edits

__all__ = ["plain_edits"]

_MAX_HOPS = 8          # a SONAME link to the library, a .so link to the SONAME: 2 in practice


def plain_edits(edits: Edits, visible_devices: list[str]) -> dict:
    """``edits`` (common edits merged with the devices') without the hook's work."""
    mounts = {m.container_path: m for m in edits.mounts}
    nodes = {n.path: n for n in edits.device_nodes}
    links = {link: target for target, link in edits.links + edits.device_links}
    out_mounts = [{"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
                  for m in edits.mounts]
    out_nodes = [{"path": n.path, "hostPath": n.host_path, "permissions": "rwm"} for n in edits.device_nodes]
    for link in links:
        end = _resolve(link, links)
        if end in mounts and link not in mounts:
            out_mounts.append({"hostPath": mounts[end].host_path, "containerPath": link,
                               "options": list(LIBRARY_MOUNT_OPTIONS)})
        elif end in nodes and link not in nodes:
            out_nodes.append({"path": link, "hostPath": nodes[end].host_path, "permissions": "rwm"})
    env = [e for e in edits.env if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    env.append("NVIDIA_VISIBLE_DEVICES=" + ",".join(visible_devices))
    return {"env": env, "deviceNodes": out_nodes, "mounts": out_mounts}


def _resolve(link: str, links: dict[str, str]) -> str:
    """Where ``link`` ends up through the other links (container paths, lexically)."""
    path = link
    for _ in range(_MAX_HOPS):
        if path not in links:
            return path
        path = posixpath.normpath(posixpath.join(posixpath.dirname(path), links[path]))
    return path
