"""Settings of the health monitor: the ``health:`` section of the config file."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import XidPolicy, parse_xids

__all__ = ["HealthOptions"]

_ENV = {"disable_xids": "DP_DISABLE_HEALTHCHECKS", "enable_xids": "DP_ENABLE_HEALTHCHECKS"}


@dataclass(frozen=True)
class HealthOptions:
    enabled: bool = True
    quiet_period: float | None = 300.0    # seconds without a critical event before recovery; None/0: never
    disable_xids: tuple = ()              # XIDs (or "all") ignored on top of the defaults
    enable_xids: tuple = ()               # XIDs (or "all") that count whatever else says
    wait_timeout_ms: int = 1000           # longest single NVML wait: bounds stop and recovery latency
    state_file: bool = True               # publish /run/hostagent/health.json and take clear requests

    @classmethod
    def from_config(cls, section: dict | None, environ=None) -> "HealthOptions":
        """From the validated ``health`` section (missing keys take the defaults above).

        ``environ`` (the process environment): the device plugin's ``DP_DISABLE_HEALTHCHECKS``
        and ``DP_ENABLE_HEALTHCHECKS`` stand for ``disable_xids`` and ``enable_xids`` where
        the section leaves them empty, so a DaemonSet's settings carry over; a list in the
        file wins over its variable."""
        section = {k: v for k, v in (section or {}).items() if v is not None or k == "quiet_period"}
        for key in ("disable_xids", "enable_xids"):
            value = (environ or {}).get(_ENV[key], "").strip()
            if not section.get(key) and value:
                parse_xids(value, _ENV[key])         # a bad value names its variable
                section[key] = (value,)
            if key in section:
                section[key] = tuple(section[key])
        if section.get("quiet_period") == 0:
            section["quiet_period"] = None
        return cls(**section)

    @property
    def policy(self) -> XidPolicy:
        return XidPolicy.from_lists(self.disable_xids, self.enable_xids)
