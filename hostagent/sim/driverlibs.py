"""The user-space files of an R550/R570 driver install, as a simulated driver root holds them.

Libraries as NVIDIA's installer lays them out (the file list of a 550.100 install and an
Arch 550 package's): each ``lib*.so.<driver version>`` with its SONAME link (``.so.1``,
``.so.0``, ``.so.2``, ``.so.4``; none where the SONAME is the file's own name), the
platform libraries with versions of their own (``libnvidia-egl-wayland.so.1.1.13``), the
``.so`` links SDKs link against, 32-bit copies in the i386 folder, and the ICD and EGL
platform files that name libraries by SONAME, each naming one that exists here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Library", "LIBRARIES", "LIB_DIR", "LIB32_DIR", "config_files", "libraries"]

LIB_DIR = "usr/lib/x86_64-linux-gnu"
LIB32_DIR = "usr/lib/i386-linux-gnu"


@dataclass(frozen=True)
class Library:
    stem: str                    # "libcuda"
    soname: str | None = "1"     # SONAME suffix: libcuda.so.1; None: the file's own name
    dev_link: bool = False       # a libcuda.so development link
    lib32: bool = False          # also a 32-bit copy
    version: str | None = None   # a version of its own instead of the driver's
    folder: str = ""             # below the library folder ("vdpau")
    since: int = 0               # the first driver branch that has it

    def file(self, driver_version: str) -> str:
        return f"{self.stem}.so.{self.version or driver_version}"

    def soname_of(self, driver_version: str) -> str:
        return self.file(driver_version) if self.soname is None else f"{self.stem}.so.{self.soname}"


LIBRARIES = (
    Library("libcuda", dev_link=True, lib32=True),
    Library("libcudadebugger"),
    Library("libEGL_nvidia", "0", lib32=True),
    Library("libGLESv1_CM_nvidia", lib32=True),
    Library("libGLESv2_nvidia", "2", lib32=True),
    Library("libGLX_nvidia", "0", lib32=True),
    Library("libnvcuvid", dev_link=True, lib32=True),
    Library("libnvidia-allocator", lib32=True),
    Library("libnvidia-api", None, version="1"),
    Library("libnvidia-cfg", dev_link=True),
    Library("libnvidia-eglcore", None, lib32=True),
    Library("libnvidia-egl-gbm", version="1.1.1"),
    Library("libnvidia-egl-wayland", version="1.1.13"),
    # egl-x11 (xcb, xlib) is in neither 550 list; 570/575 installs have it (a toolkit
    # generate log: "Selecting .../libnvidia-egl-xcb.so.1.0.2"). Its 1.0.0 dates from
    # September 2024, so an R560/R565 may already ship it: 570 is inferred.
    Library("libnvidia-egl-xcb", version="1.0.1", since=570),
    Library("libnvidia-egl-xlib", version="1.0.1", since=570),
    Library("libnvidia-encode", dev_link=True, lib32=True),
    Library("libnvidia-fbc", dev_link=True, lib32=True),
    Library("libnvidia-glcore", None, lib32=True),
    Library("libnvidia-glsi", None, lib32=True),
    Library("libnvidia-glvkspirv", None, lib32=True),
    Library("libnvidia-gpucomp", None, lib32=True),
    Library("libnvidia-gtk2", None),
    Library("libnvidia-gtk3", None),
    Library("libnvidia-ml", dev_link=True, lib32=True),
    Library("libnvidia-ngx"),
    Library("libnvidia-nvvm", "4", lib32=True),
    Library("libnvidia-opencl", lib32=True),
    Library("libnvidia-opticalflow"),
    Library("libnvidia-pkcs11", None),
    Library("libnvidia-pkcs11-openssl3", None),
    Library("libnvidia-ptxjitcompiler", dev_link=True, lib32=True),
    Library("libnvidia-rtcore", None),
    Library("libnvidia-tls", None, lib32=True),
    Library("libnvidia-wayland-client", None),
    Library("libnvoptix"),
    Library("libvdpau_nvidia", folder="vdpau", lib32=True),
)


def libraries(branch: int) -> tuple[Library, ...]:
    """The libraries a driver of ``branch`` installs."""
    return tuple(lib for lib in LIBRARIES if branch >= lib.since)


def _egl_platform(soname: str) -> str:
    return f'{{"file_format_version": "1.0.0", "ICD": {{"library_path": "{soname}"}}}}\n'


def config_files(branch: int) -> dict[str, str | bytes]:
    """Host path -> content of the driver's ICD, EGL platform and OptiX data files."""
    files: dict[str, str | bytes] = {
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json": _egl_platform("libEGL_nvidia.so.0"),
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json": _egl_platform("libnvidia-egl-gbm.so.1"),
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json":
            _egl_platform("libnvidia-egl-wayland.so.1"),
        "etc/OpenCL/vendors/nvidia.icd": "libnvidia-opencl.so.1\n",
        "usr/share/vulkan/icd.d/nvidia_icd.json":
            '{"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0", '
            '"api_version": "1.3.277"}}\n',
        "usr/share/nvidia/nvoptix.bin": b"\0" * 64,
    }
    if branch >= 570:
        files["usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json"] = _egl_platform("libnvidia-egl-xcb.so.1")
        files["usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json"] = _egl_platform("libnvidia-egl-xlib.so.1")
    return files
