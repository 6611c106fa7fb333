"""Device-name strategies: how a GPU or MIG device is called in the spec."""

from __future__ import annotations

from ..devices import Gpu, MigDevice
from ..errors import UsageError

__all__ = ["STRATEGIES", "parse_strategies", "device_name"]

STRATEGIES = {
    "index": lambda d: str(d.index) if isinstance(d, Gpu) else d.name,      # 0, 0:1
    "uuid": lambda d: d.uuid,                                               # GPU-..., MIG-...
    "type-index": lambda d: f"gpu{d.index}" if isinstance(d, Gpu) else f"mig{d.name}",
}


def parse_strategies(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise UsageError(f"unknown device-name strategy {', '.join(bad) or repr(text)}",
                         hint=f"use a comma list of: {', '.join(STRATEGIES)}")
    return tuple(dict.fromkeys(names))


def device_name(device: Gpu | MigDevice, strategy: str) -> str:
    return STRATEGIES[strategy](device)
