"""What a vGPU guest driver answers about its GPU: the virtualization mode and the vGPU
software licence (nvml.h's vGPU queries). A GPU whose state has ``vgpu_license`` set stands
for a VM's virtual GPU; every other one is bare metal.

nvml.h: ``nvmlDeviceGetVirtualizationMode`` is one of ``NVML_GPU_VIRTUALIZATION_MODE_*``
(``VGPU``: "vGPU inside virtual machine"); ``nvmlDeviceGetGridLicensableFeatures_v4``
"identifies whether the system supports vGPU Software Licensing" and, if so, lists the
licensable features with their state. A bare-metal GPU says licensing is not supported.
"""

from __future__ import annotations

from ctypes import c_uint

import pynvml as N

from .cfuncs import P, nvml, put as _put, struct as _struct

__all__ = ["LICENSE_STATES"]

LICENSE_STATES = ("licensed", "unlicensed")


@nvml(P, P)
def nvmlDeviceGetVirtualizationMode(lib, handle, ptr):
    _, gpu = lib._gpu_only(handle)
    mode = N.NVML_GPU_VIRTUALIZATION_MODE_NONE if gpu.vgpu_license is None else N.NVML_GPU_VIRTUALIZATION_MODE_VGPU
    _put(ptr, c_uint, mode)


@nvml(P, P)
def nvmlDeviceGetGridLicensableFeatures_v4(lib, handle, ptr):
    _, gpu = lib._gpu_only(handle)
    info = _struct(ptr, N.c_nvmlGridLicensableFeatures_v4_t)
    if gpu.vgpu_license is None:
        info.isGridLicenseSupported, info.licensableFeaturesCount = 0, 0
        return
    info.isGridLicenseSupported, info.licensableFeaturesCount = 1, 1
    feature = info.gridLicensableFeatures[0]
    feature.featureCode = N.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
    feature.featureEnabled = 1
    feature.featureState = int(gpu.vgpu_license == "licensed")
    feature.productName = b"NVIDIA Virtual PC"
