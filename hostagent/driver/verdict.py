"""The result of ``driver verify``: one ``Check`` per question asked of the driver, and the
``Verdict`` over all of them (usable unless a check failed)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Check", "Verdict", "OK", "WARN", "FAIL", "SKIPPED", "RESULTS"]

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
RESULTS = (OK, WARN, FAIL, SKIPPED)


@dataclass(frozen=True)
class Check:
    name: str
    result: str
    summary: str                     # one line: what was found
    evidence: tuple[str, ...] = ()   # what it was found in: "file: value", NVML codes, log lines
    fix: str | None = None           # what to do (failures and warnings)

    def to_dict(self) -> dict:
        return {"name": self.name, "result": self.result, "summary": self.summary,
                "evidence": list(self.evidence), "fix": self.fix}


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]
    driver_version: str | None = None
    cuda_version: str | None = None
    ignored: tuple[str, ...] = ()      # checks whose failure does not make the driver unusable

    @property
    def blocking(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.result == FAIL and c.name not in self.ignored)

    @property
    def usable(self) -> bool:
        return not self.blocking

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def reason(self) -> str:
        """One line: why the driver is not usable (the failing checks' summaries), or that it is."""
        failed = self.blocking
        if not failed:
            return f"driver {self.driver_version or '?'} verified"
        return "; ".join(f"{c.name}: {c.summary}" for c in failed)

    def to_dict(self) -> dict:
        return {"usable": self.usable, "driver_version": self.driver_version,
                "cuda_version": self.cuda_version, "reason": self.reason,
                "failed": [c.name for c in self.blocking], "ignored": list(self.ignored),
                "checks": [c.to_dict() for c in self.checks]}
