"""The NVIDIA driver: facts read from host files and NVML, the checks of ``driver verify``,
and (``install``) its installation through the distribution's package manager."""
