import os

import pynvml
import pytest

from hostagent.hostroot import HostRoot
from hostagent.sim.driverroot import create_node


@pytest.fixture
def make_node(tmp_path_factory):
    """Build a simulated node; returns (HostRoot, SimStore)."""
    def make(profile: str = "dgx-a100"):
        root = tmp_path_factory.mktemp(profile)
        store = create_node(root, profile)
        return HostRoot.simulation(root), store
    return make


@pytest.fixture(autouse=True)
def _simulated_nvml_is_complete(request):
    """Every NVML function hostagent calls must exist in the simulator and never crash it."""
    yield
    lib = pynvml.nvmlLib
    if lib is None or not hasattr(lib, "crashes"):
        return
    missing, crashes = list(lib.missing), list(lib.crashes)
    lib.missing.clear()
    lib.crashes.clear()
    if "allow_missing_nvml" not in request.keywords:
        assert not missing, f"simulated NVML lacks functions: {missing}"
    assert not crashes, "simulated NVML crashed:\n" + "\n".join(crashes)


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_missing_nvml: the test calls NVML functions the simulator lacks on purpose")
    os.environ.pop("HOSTAGENT_SIMULATE", None)
