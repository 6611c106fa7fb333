"""Settings of the health monitor: the ``health:`` section of the config file."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import XidPolicy

__all__ = ["HealthOptions"]


@dataclass(frozen=True)
class HealthOptions:
    enabled: bool = True
    quiet_period: float | None = 300.0    # seconds without a critical event before recovery; None/0: never
    disable_xids: tuple = ()              # XIDs (or "all") ignored on top of the defaults
    enable_xids: tuple = ()               # XIDs (or "all") that count whatever else says
    wait_timeout_ms: int = 1000           # longest single NVML wait: bounds stop and recovery latency
    state_file: bool = True               # publish /run/hostagent/health.json and take clear requests

    @classmethod
    def from_config(cls, section: dict | None) -> "HealthOptions":
        """From the validated ``health`` section (missing keys take the defaults above)."""
        section = {k: v for k, v in (section or {}).items() if v is not None or k == "quiet_period"}
        for key in ("disable_xids", "enable_xids"):
            if key in section:
                section[key] = tuple(section[key])
        if section.get("quiet_period") == 0:
            section["quiet_period"] = None
        return cls(**section)

    @property
    def policy(self) -> XidPolicy:
        return XidPolicy.from_lists(self.disable_xids, self.enable_xids)
