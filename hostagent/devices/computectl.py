"""NVML's compute mode: read and set per GPU, the narrow interface GPU sharing changes the node
through (MPS wants EXCLUSIVE_PROCESS, time-slicing DEFAULT). GPUs are named by UUID and modes
by nvidia-smi's names; NVML errors become ``NvmlError`` naming the GPU.

nvml.h (nvmlDeviceSetComputeMode): "For all products. Requires root/admin permissions." and
"Under Linux it is not persistent across reboots and always resets to 'Default'."

Use inside ``nvml_session(host)``.
"""

from __future__ import annotations

import pynvml as N

from ..errors import NvmlError

__all__ = ["ComputeControl", "MODES"]

MODES = {"DEFAULT": N.NVML_COMPUTEMODE_DEFAULT, "PROHIBITED": N.NVML_COMPUTEMODE_PROHIBITED,
         "EXCLUSIVE_PROCESS": N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS}
_NAMES = {v: k for k, v in MODES.items()}


class ComputeControl:
    def _handle(self, uuid: str):
        try:
            return N.nvmlDeviceGetHandleByUUID(uuid.encode())
        except N.NVMLError as e:
            raise NvmlError(f"GPU {uuid}: get device handle: {e}", nvml_code=e.value) from None

    def mode(self, uuid: str) -> str:
        try:
            value = N.nvmlDeviceGetComputeMode(self._handle(uuid))
        except N.NVMLError as e:
            raise NvmlError(f"GPU {uuid}: get compute mode: {e}", nvml_code=e.value) from None
        return _NAMES.get(value, f"UNKNOWN({value})")

    def set_mode(self, uuid: str, mode: str) -> None:
        try:
            N.nvmlDeviceSetComputeMode(self._handle(uuid), MODES[mode])
        except N.NVMLError as e:
            raise NvmlError(f"GPU {uuid}: set compute mode {mode}: {e}", nvml_code=e.value,
                            hint="compute modes need root") from None
