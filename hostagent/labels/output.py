"""Labels as an NFD local-features file: one ``key=value`` line each, sorted, atomic.

The file is rewritten only when the labels change. ``nvidia.com/gfd.timestamp`` (GFD writes
it by default) is left out of that comparison: it says when the labels last changed, and a
rewrite for a new timestamp alone would relabel the node for nothing.
"""

from __future__ import annotations

from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot
from .gfd import TIMESTAMP

__all__ = ["FEATURES_FILE", "render", "parse", "read_labels", "write_labels"]

FEATURES_FILE = "/etc/kubernetes/node-feature-discovery/features.d/hostagent"


def render(labels: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def read_labels(host: HostRoot) -> dict[str, str] | None:
    """The features file's labels; None when there is none."""
    try:
        return parse(host.host(FEATURES_FILE).read_text())
    except FileNotFoundError:
        return None


def write_labels(host: HostRoot, labels: dict[str, str], *,
                 timestamp: int | None = None) -> tuple[bool, dict[str, str]]:
    """Write the features file if ``labels`` differ from its labels; with ``timestamp`` the
    file carries ``gfd.timestamp`` too, set when it is written. Returns (written, the
    labels the file now holds)."""
    current = read_labels(host)
    if current is not None:
        stamp = current.pop(TIMESTAMP, None)
        if current == labels and (stamp is None) == (timestamp is None):
            return False, dict(labels, **({TIMESTAMP: stamp} if stamp is not None else {}))
    out = dict(labels, **({TIMESTAMP: str(timestamp)} if timestamp is not None else {}))
    path = host.host(FEATURES_FILE)
    ensure_dir(path.parent, 0o755)
    write_atomic(path, render(out), mode=0o644)
    return True, out
