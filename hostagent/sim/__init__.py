"""The simulated GPU node: a fake NVML beneath pynvml plus a generated driver root."""
