"""Labels as an NFD local-features file: one ``key=value`` line each, sorted, atomic."""

from __future__ import annotations

from ..fileio import ensure_dir, write_atomic
from ..hostroot import HostRoot

__all__ = ["FEATURES_FILE", "render", "write_labels"]

FEATURES_FILE = "/etc/kubernetes/node-feature-discovery/features.d/hostagent"


def render(labels: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def write_labels(host: HostRoot, labels: dict[str, str]) -> bool:
    """Write the features file if its content changed; True if it was written."""
    path = host.host(FEATURES_FILE)
    text = render(labels)
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    ensure_dir(path.parent, 0o755)
    write_atomic(path, text, mode=0o644)
    return True
