"""NVML's MIG mutations: the narrow interface the MIG executor changes the node through.

Lives beside the reader so pynvml handles never leave ``hostagent.devices``: callers name
GPUs by index and instances by id, and get plain values back. Every NVML error becomes an
``NvmlError`` that says which call failed on which GPU and keeps NVML's return code, so
the executor can tell IN_USE from INSUFFICIENT_RESOURCES without importing pynvml.

Use inside ``nvml_session(host)``.
"""

from __future__ import annotations

import pynvml as N

from ..errors import NvmlError
from .records import GpuProcess

__all__ = ["MigControl", "NVML_IN_USE", "NVML_RESET_REQUIRED", "NVML_SUCCESS"]

NVML_SUCCESS = N.NVML_SUCCESS
NVML_IN_USE = N.NVML_ERROR_IN_USE
NVML_RESET_REQUIRED = N.NVML_ERROR_RESET_REQUIRED
_NONE = 0xFFFFFFFF


class MigControl:
    """Mode changes, GPU/compute instance creation with explicit placements, destruction,
    and the processes that would make a destroy fail."""

    def _call(self, index: int, what: str, fn, *args):
        try:
            return fn(*args)
        except N.NVMLError as e:
            raise NvmlError(f"GPU {index}: {what}: {e}", nvml_code=e.value) from None

    def _gpu(self, index: int):
        return self._call(index, "get device handle", N.nvmlDeviceGetHandleByIndex, index)

    def _gi(self, index: int, gi_id: int):
        return self._call(index, f"get GPU instance {gi_id}", N.nvmlDeviceGetGpuInstanceById,
                          self._gpu(index), gi_id)

    def mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending) MIG mode, True = enabled."""
        current, pending = self._call(index, "get MIG mode", N.nvmlDeviceGetMigMode, self._gpu(index))
        return current == N.NVML_DEVICE_MIG_ENABLE, pending == N.NVML_DEVICE_MIG_ENABLE

    def set_mode(self, index: int, enabled: bool) -> int:
        """Returns NVML's activation status: SUCCESS, IN_USE (not idle) or RESET_REQUIRED."""
        mode = N.NVML_DEVICE_MIG_ENABLE if enabled else N.NVML_DEVICE_MIG_DISABLE
        return self._call(index, f"{'enable' if enabled else 'disable'} MIG mode",
                          N.nvmlDeviceSetMigMode, self._gpu(index), mode)

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        """Create a GPU instance at an explicit placement; returns its id."""
        placement = N.c_nvmlGpuInstancePlacement_t(start, size)
        gi = self._call(index, f"create GPU instance (profile {profile_id}) at {start}:{size}",
                        N.nvmlDeviceCreateGpuInstanceWithPlacement, self._gpu(index), profile_id,
                        N.byref(placement))
        return self._call(index, "read new GPU instance", N.nvmlGpuInstanceGetInfo, gi).id

    def create_compute_instance(self, index: int, gi_id: int, profile_id: int,
                                start: int, size: int) -> int:
        placement = N.c_nvmlComputeInstancePlacement_t(start, size)
        ci = self._call(index, f"create compute instance (profile {profile_id}) at {start}:{size} "
                        f"in GPU instance {gi_id}", N.nvmlGpuInstanceCreateComputeInstanceWithPlacement,
                        self._gi(index, gi_id), profile_id, N.byref(placement))
        return self._call(index, "read new compute instance", N.nvmlComputeInstanceGetInfo, ci).id

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        ci = self._call(index, f"get compute instance {gi_id}/{ci_id}",
                        N.nvmlGpuInstanceGetComputeInstanceById, self._gi(index, gi_id), ci_id)
        self._call(index, f"destroy compute instance {ci_id} of GPU instance {gi_id}",
                   N.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._call(index, f"destroy GPU instance {gi_id}", N.nvmlGpuInstanceDestroy,
                   self._gi(index, gi_id))

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes on the GPU, each with the MIG instance it runs in."""
        procs = self._call(index, "list running processes",
                           N.nvmlDeviceGetComputeRunningProcesses, self._gpu(index))
        out = []
        for p in procs:
            gi = getattr(p, "gpuInstanceId", _NONE)
            ci = getattr(p, "computeInstanceId", _NONE)
            used = p.usedGpuMemory
            out.append(GpuProcess(pid=p.pid, gpu=index, gi=None if gi == _NONE else gi,
                                  ci=None if ci == _NONE else ci,
                                  used_mib=None if used is None else used >> 20))
        return out
