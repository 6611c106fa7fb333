"""``--link TARGET::LINK`` and ``--device-link TARGET::LINK``: symlinks inside the container root.

LINK is a container path resolved inside the root (inroot); missing parent directories are
created (0755). TARGET is written into the link as given and never followed here, so an
absolute or ``..`` target is harmless to the host: inside the container it resolves
against the container's own root.

A device link (``../card1::/dev/dri/by-path/pci-0000:3b:00.0-card``) is made only when the
node its TARGET names is one of the container's device nodes: the spec's one hook carries
the links of every GPU, and each container gets those of the GPUs it was given.

Every parent directory is reached, or its missing part checked to be makeable
(inroot.Root.probe), before the first write, so a link whose directory cannot be reached (a
file or a loop on the way, even past a missing directory) fails the call with nothing
changed. Links are then made in order, and a link's path may go through a link made before
it in the same call (``gbm/.`` then ``gbm/x``); the check saw the root as it was before the
call, so only such a path can still fail after a write.

An existing entry at LINK:
* a symlink to TARGET is left alone (no write at all on a container's second start);
* a missing link, or any other symlink, is made under a temporary name and renamed into
  place;
* a regular file or a directory is left alone with a warning. That is what ldconfig does
  with a non-link at a SONAME path, and it keeps the hook from destroying data the image or
  the engine put there (a bind-mounted file, an image's own library); a link maker has no
  business deleting content it did not create.
"""

import posix

from .errors import HookError
from .fileat import symlink_at
from .inroot import Root, split


def present_device_links(device_links: list[tuple[str, str]], devices: set[str]) -> list[tuple[str, str]]:
    """The device links whose node (TARGET taken from LINK's directory) is in ``devices``."""
    out = []
    for target, link in device_links:
        node = _normalized(target if target.startswith("/") else f"/{link.lstrip('/')}/../{target}")
        if node in devices:
            out.append((target, link))
    return out


def _normalized(path: str) -> str:
    """posixpath.normpath of an absolute path (``..`` at the top stays at the top)."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def create_links(root: Root, links: list[tuple[str, str]], warn) -> dict[str, int]:
    counts = {"created": 0, "replaced": 0, "unchanged": 0, "kept": 0}
    parents: dict[str, int | None] = {}   # one walk per directory: drivers put dozens of links in one
    try:
        # Reach every parent, or check that it can be made, before the first write.
        planned = []
        for target, link in links:
            folder, name = split(link)
            key = "/".join(folder)
            if key not in parents:
                try:
                    parents[key] = root.probe(key)
                except OSError as e:
                    raise _unreachable(link, e) from None
            planned.append((target, link, key, name))
        for target, link, key, name in planned:
            if parents[key] is None:
                try:
                    parents[key] = root.opendir(key, create=True)
                except OSError as e:
                    raise _unreachable(link, e) from None
            try:
                counts[symlink_at(parents[key], target, name)] += 1
            except (IsADirectoryError, FileExistsError) as e:
                warn(f"{link} {e.strerror}; left as it is, not linked to {target}")
                counts["kept"] += 1
            except OSError as e:
                raise HookError(f"cannot create link {link} -> {target} in the container: {e.strerror or e}") from None
    finally:
        for fd in parents.values():
            if fd is not None:
                posix.close(fd)
    return counts


def _unreachable(link: str, e: OSError) -> HookError:
    return HookError(f"cannot reach the directory of link {link} in the container: {e.strerror or e}")
