"""Why a test needs root, said once for every test that does. Each is a ``pytest.mark.root``,
which tests/conftest.py turns into a skip giving the reason when the run is not root's."""

import pytest

__all__ = ["GPU_CHANGES"]

GPU_CHANGES = pytest.mark.root("changing GPUs (MIG modes and instances, compute modes, time-slices, resets) needs "
                               "root: NVML and nvidia-smi refuse it to other users (nvml.h: 'Requires root/admin "
                               "permissions'), and so do the simulated ones")
