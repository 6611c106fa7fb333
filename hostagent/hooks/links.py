"""``--link TARGET::LINK``: symlinks inside the container root.

LINK is a container path resolved inside the root (inroot); missing parent directories are
created (0755). TARGET is written into the link as given and never followed here, so an
absolute or ``..`` target is harmless to the host: inside the container it resolves
against the container's own root.

An existing entry at LINK:
* a symlink to TARGET is left alone (no write at all on a container's second start);
* any other symlink is replaced atomically (temp name, rename);
* a regular file or a directory is left alone with a warning. That is what ldconfig does
  with a non-link at a SONAME path, and it keeps the hook from destroying data the image or
  the engine put there (a bind-mounted file, an image's own library); a link maker has no
  business deleting content it did not create.
"""

from __future__ import annotations

import os

from .errors import HookError
from .fileat import symlink_at
from .inroot import Root, split


def create_links(root: Root, links: list[tuple[str, str]], warn) -> dict[str, int]:
    counts = {"created": 0, "replaced": 0, "unchanged": 0, "kept": 0}
    parents: dict[str, int] = {}       # one walk per directory: drivers put dozens of links in one
    try:
        for target, link in links:
            try:
                folder, name = split(link)
                key = "/".join(folder)
                if key not in parents:
                    parents[key], _ = root.parent(link, create=True)
                dir_fd = parents[key]
            except OSError as e:
                raise HookError(f"cannot reach the directory of link {link} in the container: "
                                f"{e.strerror or e}") from None
            try:
                counts[symlink_at(dir_fd, target, name)] += 1
            except (IsADirectoryError, FileExistsError) as e:
                warn(f"{link} {e.strerror}; left as it is, not linked to {target}")
                counts["kept"] += 1
            except OSError as e:
                raise HookError(f"cannot create link {link} -> {target} in the container: {e.strerror or e}") from None
    finally:
        for fd in parents.values():
            os.close(fd)
    return counts
