"""Sanity checks for the simulator's YAML data (SKUs and node profiles).

Loader-free on purpose: reads the files with yaml.safe_load only, so it does
not depend on hostagent.sim code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

DATA_DIR = Path(__file__).parents[2] / "hostagent/sim/data"
PROFILES_DIR = DATA_DIR / "profiles"

EXPECTED_SKUS = {
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "A30-24GB",
    "H100-SXM5-80GB",
    "H200-SXM-141GB",
    "T4",
    "V100-SXM2-32GB",
    "L40S",
    "RTX-A6000",
}
EXPECTED_PROFILES = {
    "dgx-a100": 8,
    "hgx-h100": 8,
    "hgx-h200": 8,
    "a30x4": 4,
    "t4x2": 2,
    "mixed": 3,
    "dgx1-v100": 8,
    "l40s-pcie": 8,
    "rtx-a6000x2": 2,
}
ARCHITECTURES = {"volta", "turing", "ampere", "ada", "hopper", "blackwell"}
NVIDIA_VENDOR = 0x10DE
PROFILE_NAME_RE = re.compile(r"^\d+g\.\d+gb(\+me)?$")
BUS_ID_RE = re.compile(r"^0000:[0-9A-F]{2}:00\.0$")
ME_INDICES = {7, 8}  # 1_SLICE_REV1, 2_SLICE_REV1
DEVICE_KEYS = {
    "name",
    "pci_device_id",
    "pci_subsystem_id",
    "architecture",
    "compute_capability",
    "memory_mib",
    "multiprocessors",
    "power_limit_w",
    "max_sm_clock_mhz",
    "max_mem_clock_mhz",
    "pcie_generation",
    "pcie_width",
}
GI_KEYS = {
    "index",
    "id",
    "name",
    "slices",
    "memory_slices",
    "instances",
    "memory_mib",
    "multiprocessors",
    "copy_engines",
    "decoders",
    "encoders",
    "jpegs",
    "ofas",
    "placements",
}


def _load(path: Path):
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


SKUS = _load(DATA_DIR / "skus.yaml")
PROFILE_FILES = sorted(PROFILES_DIR.glob("*.yaml"))
MIG_SKUS = sorted(k for k, v in SKUS.items() if "mig" in v)


def test_expected_skus_present():
    assert set(SKUS) == EXPECTED_SKUS


def test_expected_profiles_present():
    assert {p.stem for p in PROFILE_FILES} == set(EXPECTED_PROFILES)


@pytest.mark.parametrize("key", sorted(EXPECTED_SKUS))
def test_sku_device_fields(key):
    sku = SKUS[key]
    assert DEVICE_KEYS <= set(sku), DEVICE_KEYS - set(sku)
    assert set(sku) <= DEVICE_KEYS | {"mig", "older_branches", "nvlink", "pci_name", "audio"}, set(sku) - DEVICE_KEYS
    if "nvlink" in sku:        # links a GPU has, and their nvmlNvlinkVersion_t
        assert set(sku["nvlink"]) == {"links", "version"} and 0 < sku["nvlink"]["links"] <= 36
    for older in sku.get("older_branches", ()):      # what earlier driver branches report
        assert isinstance(older["before"], int) and set(older) - {"before"} <= DEVICE_KEYS
    assert isinstance(sku["name"], str) and sku["name"]
    for field in ("pci_device_id", "pci_subsystem_id"):
        value = sku[field]
        assert isinstance(value, int), (field, value)
        assert value & 0xFFFF == NVIDIA_VENDOR, hex(value)
        assert value >> 16, hex(value)
    assert sku["architecture"] in ARCHITECTURES
    assert isinstance(sku["compute_capability"], str)
    assert re.fullmatch(r"\d+\.\d+", sku["compute_capability"])
    for field in DEVICE_KEYS - {"name", "architecture", "compute_capability",
                                "pci_device_id", "pci_subsystem_id"}:
        assert isinstance(sku[field], int) and sku[field] > 0, field


def test_t4_has_no_mig():
    assert "mig" not in SKUS["T4"]
    assert SKUS["T4"]["architecture"] == "turing"


@pytest.mark.parametrize("key", MIG_SKUS)
def test_mig_profiles(key):
    sku = SKUS[key]
    mig = sku["mig"]
    total_mem = mig["memory_slices"]
    total_compute = mig["compute_slices"]
    profiles = mig["gpu_instance_profiles"]
    assert profiles

    assert mig["multiprocessors"] <= sku["multiprocessors"]

    ids = [p["id"] for p in profiles]
    indices = [p["index"] for p in profiles]
    names = [p["name"] for p in profiles]
    assert len(ids) == len(set(ids)), ids
    assert len(indices) == len(set(indices)), indices
    assert len(names) == len(set(names)), names

    for p in profiles:
        assert set(p) - {"since"} == GI_KEYS, (p["name"], set(p) ^ GI_KEYS)
        assert p.get("since", 450) >= 450, p["name"]          # MIG came with R450
        name = p["name"]
        assert PROFILE_NAME_RE.match(name), name
        # "<G>g" in the name is the compute-slice count.
        assert int(name.split("g.", 1)[0]) == p["slices"], name

        assert 1 <= p["slices"] <= total_compute, name
        assert 1 <= p["memory_slices"] <= total_mem, name
        assert p["instances"] >= 1, name
        assert p["instances"] * p["memory_slices"] <= total_mem, name
        assert p["instances"] * p["slices"] <= total_compute, name
        if name.endswith("+me"):
            assert p["instances"] == 1, name
            assert p["index"] in ME_INDICES, name
        else:
            assert p["index"] not in ME_INDICES, name

        placements = p["placements"]
        assert placements, name
        assert placements == sorted(set(placements)), name
        assert len(placements) >= p["instances"], name
        for start in placements:
            assert start >= 0, name
            assert start + p["memory_slices"] <= total_mem, (name, start)
            assert start % p["memory_slices"] == 0, (name, start)

        assert 0 < p["memory_mib"] <= sku["memory_mib"], name
        assert 0 < p["multiprocessors"] <= mig["multiprocessors"], name
        for eng in ("copy_engines", "decoders", "encoders", "jpegs", "ofas"):
            assert isinstance(p[eng], int) and p[eng] >= 0, (name, eng)
        assert p["copy_engines"] >= 1, name

    full = max(profiles, key=lambda p: (p["slices"], p["memory_slices"]))
    assert full["placements"] == [0]
    assert full["memory_slices"] == total_mem
    assert full["slices"] == total_compute
    assert full["instances"] == 1
    assert full["multiprocessors"] == mig["multiprocessors"]
    assert max(p["memory_mib"] for p in profiles) == full["memory_mib"]


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_node_profile(path):
    prof = _load(path)
    assert set(prof) - {"minors", "nvswitches", "topology"} == {"description", "machine", "driver_version", "numa_nodes",
                                                    "cuda_driver_version", "gpus"}
    assert isinstance(prof["numa_nodes"], int) and prof["numa_nodes"] >= 0
    assert isinstance(prof.get("nvswitches", 0), int) and prof.get("nvswitches", 0) >= 0
    assert isinstance(prof["description"], str) and prof["description"]
    assert isinstance(prof["driver_version"], str)
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", prof["driver_version"])
    assert isinstance(prof["cuda_driver_version"], int)
    assert prof["cuda_driver_version"] >= 10000

    bus_ids = []
    for group in prof["gpus"]:
        assert {"sku", "pci_bus_ids"} <= set(group) <= {"sku", "pci_bus_ids", "audio"}
        assert group["sku"] in SKUS, group["sku"]
        assert group["pci_bus_ids"], group["sku"]
        for bus_id in group["pci_bus_ids"]:
            assert isinstance(bus_id, str) and BUS_ID_RE.match(bus_id), bus_id
        bus_ids.extend(group["pci_bus_ids"])

    assert len(bus_ids) == len(set(bus_ids)), bus_ids
    # NVML index order is assumed to equal PCI bus order (mig.md 1.1).
    assert bus_ids == sorted(bus_ids), bus_ids
    assert len(bus_ids) == EXPECTED_PROFILES[path.stem]
    if "minors" in prof:            # each GPU's device minor, a permutation of the indices
        assert sorted(prof["minors"]) == list(range(len(bus_ids))) != prof["minors"]


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_node_profile_topology(path):
    """Each GPU's NUMA node (with CPUs) and PCIe path from a host bridge; NVLinks no more than
    the SKUs have."""
    prof = _load(path)
    topo = prof["topology"]
    assert set(topo) <= {"cpus", "sockets", "gpus", "nvlink", "nvswitch"}
    skus = [group["sku"] for group in prof["gpus"] for _ in group["pci_bus_ids"]]
    assert len(topo["gpus"]) == len(skus) == EXPECTED_PROFILES[path.stem]
    for gpu in topo["gpus"]:
        assert set(gpu) == {"numa", "pcie"} and gpu["numa"] in topo["cpus"]
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", gpu["pcie"][0]), gpu["pcie"]
    assert sorted(n for s in topo.get("sockets", [[n] for n in topo["cpus"]]) for n in s) == sorted(topo["cpus"])
    links = [0] * len(skus)
    for pair, count in (topo.get("nvlink") or {}).items():
        a, b = map(int, pair.split("-"))
        assert a < b < len(skus) and count > 0, pair
        links[a] += count
        links[b] += count
    switched = sum((topo.get("nvswitch") or {}).get("links", ()))
    for i, sku in enumerate(skus):
        assert links[i] + switched <= SKUS[sku].get("nvlink", {}).get("links", 0), (i, sku)
