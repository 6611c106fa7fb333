"""The lowest ``cdiVersion`` a spec's content needs, by the CDI library's own rule."""

from __future__ import annotations

__all__ = ["KNOWN_VERSIONS", "minimum_version", "version_key"]

KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _edits(spec: dict) -> list[dict]:
    return [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices") or []]


def minimum_version(spec: dict) -> str:
    """Newest rule first, as ``MinimumRequiredVersion`` checks them; never below 0.3.0."""
    edits = _edits(spec)
    kind_class = str(spec.get("kind", "")).partition("/")[2]
    rdts = [e["intelRdt"] for e in edits if e.get("intelRdt") is not None]
    if any(e.get("netDevices") for e in edits) or any(
            r.get("schemata") is not None or r.get("enableMonitoring") for r in rdts):
        return "1.1.0"
    if rdts or any(e.get("additionalGids") for e in edits):
        return "0.7.0"
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices") or []) \
            or "." in kind_class:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices") or []) or any(
            n.get("hostPath") for e in edits for n in e.get("deviceNodes") or []):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"
