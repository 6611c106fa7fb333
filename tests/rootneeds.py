"""Why a test needs root, said once for every test that does. Each is a ``pytest.mark.root``,
which tests/conftest.py turns into a skip giving the reason when the run is not root's."""

import pytest

__all__ = ["GPU_CHANGES", "DEVICE_NODES"]

GPU_CHANGES = pytest.mark.root("changing GPUs (MIG modes and instances, compute modes, resets) needs root: NVML "
                               "refuses it to other users (nvml.h: 'Requires root/admin permissions'), and so does "
                               "the simulated one")
DEVICE_NODES = pytest.mark.root("the GPUs must be in the node's CDI spec (to be allocated, shared, advertised), and a "
                                "simulated node's device nodes are character devices only when root made them: "
                                "regular files otherwise, which the spec leaves out")
