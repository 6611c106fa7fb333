"""Facts about the installed NVIDIA driver read from host files (not NVML)."""
