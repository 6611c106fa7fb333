"""Every check ``driver verify`` runs, in the order it prints them: each a pure function
from ``DriverFacts`` to a ``Check``."""

from __future__ import annotations

from ..facts import DriverFacts
from ..verdict import Check, Verdict
from .gpus import cuda, device_nodes, fabric, kernel_log, nvml, persistence
from .kernel import gsp_firmware, kernel_module, module_flavour, nouveau, secure_boot, version_match

__all__ = ["CHECKS", "CHECK_NAMES", "judge"]

CHECKS = (kernel_module, nouveau, version_match, module_flavour, gsp_firmware, secure_boot,
          device_nodes, nvml, persistence, fabric, cuda, kernel_log)
CHECK_NAMES = ("kernel-module", "nouveau", "version-match", "module-flavour", "gsp-firmware",
               "secure-boot", "device-nodes", "nvml", "persistence", "fabric", "cuda", "kernel-log")


def judge(facts: DriverFacts, ignored: tuple[str, ...] = ()) -> Verdict:
    checks: tuple[Check, ...] = tuple(check(facts) for check in CHECKS)
    return Verdict(checks, driver_version=facts.module.version or facts.driver_version,
                   cuda_version=facts.cuda_version, ignored=tuple(ignored))
