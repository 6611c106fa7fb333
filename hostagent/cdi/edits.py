"""Container edits as plain records, merged and converted to CDI's ``containerEdits``.

Discoverers return ``Edits``; only ``to_cdi`` knows CDI's field names and which keys to
leave out (never an empty optional key: older parsers reject unknown or empty fields).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceNode", "Mount", "Hook", "Edits", "LIBRARY_MOUNT_OPTIONS", "IPC_MOUNT_OPTIONS"]

LIBRARY_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# Sockets cannot be connected to through a read-only mount.
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")


@dataclass(frozen=True)
class DeviceNode:
    path: str                  # in the container
    host_path: str             # on the host (same as path when the host root is /)
    major: int
    minor: int
    file_mode: int             # permission bits only

    def to_cdi(self) -> dict:
        out = {"path": self.path}
        if self.host_path != self.path:
            out["hostPath"] = self.host_path
        out.update(type="c", major=self.major, minor=self.minor, fileMode=self.file_mode,
                   permissions="rwm")
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = LIBRARY_MOUNT_OPTIONS

    def to_cdi(self) -> dict:
        return {"hostPath": self.host_path, "containerPath": self.container_path,
                "options": list(self.options)}


@dataclass(frozen=True)
class Hook:
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    hook_name: str = "createContainer"

    def to_cdi(self) -> dict:
        return {"hookName": self.hook_name, "path": self.path, "args": list(self.args),
                "env": list(self.env)}


@dataclass(frozen=True)
class Edits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    # Links and folders the hook needs; the spec builder turns those of every device and
    # the common ones into the spec's one Hook.
    links: tuple[tuple[str, str], ...] = ()     # (target, link) in container terms
    # Links to device nodes (/dev/dri/by-path/...), made only in containers given the node.
    device_links: tuple[tuple[str, str], ...] = ()
    folders: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return any((self.env, self.device_nodes, self.mounts, self.hooks, self.links, self.device_links,
                    self.folders))

    @staticmethod
    def merge(*parts: "Edits") -> "Edits":
        """Concatenate, keeping the first of any duplicate (same node path, same mount
        destination, same env name, same link)."""
        def unique(items, key):
            seen, out = set(), []
            for item in items:
                k = key(item)
                if k not in seen:
                    seen.add(k)
                    out.append(item)
            return tuple(out)
        return Edits(
            env=unique((e for p in parts for e in p.env), lambda e: e.split("=", 1)[0]),
            device_nodes=unique((n for p in parts for n in p.device_nodes), lambda n: n.path),
            mounts=unique((m for p in parts for m in p.mounts), lambda m: m.container_path),
            hooks=unique((h for p in parts for h in p.hooks), lambda h: (h.path, h.args)),
            links=unique((lk for p in parts for lk in p.links), lambda lk: lk[1]),
            device_links=unique((lk for p in parts for lk in p.device_links), lambda lk: lk[1]),
            folders=unique((f for p in parts for f in p.folders), lambda f: f))

    def to_cdi(self, hooks: tuple[Hook, ...] = ()) -> dict:
        out = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_cdi() for n in self.device_nodes]
        all_hooks = self.hooks + hooks
        if all_hooks:
            out["hooks"] = [h.to_cdi() for h in all_hooks]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        return out
