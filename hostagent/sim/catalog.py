"""GPU SKU and node-profile data shipped with the simulator, as typed records."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

__all__ = ["GiProfileSpec", "CiProfileSpec", "MigSpec", "SkuSpec", "NodeProfile",
           "skus", "raw_skus", "sku_from_dict", "profile_names", "load_profile", "ci_profile_index",
           "driver_branch", "cuda_version", "check_driver_version"]

ARCHITECTURES = {"volta": 5, "turing": 6, "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10}
# nvmlBrandType_t values a SKU may name in skus.yaml (brand: nvidia is the data-center GPUs':
# NVIDIA's go-nvml mocks give BRAND_NVIDIA to A100, A30, H100, H200 and B200).
BRANDS = {"tesla": 2, "nvidia": 14}

# NVML_COMPUTE_INSTANCE_PROFILE_<N>_SLICE values, keyed by slice count.
_CI_INDEX_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


def ci_profile_index(slices: int) -> int:
    return _CI_INDEX_BY_SLICES[slices]


@dataclass(frozen=True)
class CiProfileSpec:
    id: int                 # NVML compute-instance profile value, which is also its id
    slices: int
    instances: int
    multiprocessors: int
    placements: tuple[int, ...]   # starts on the GPU instance's compute-slice axis


@dataclass(frozen=True)
class GiProfileSpec:
    index: int              # NVML_GPU_INSTANCE_PROFILE_* value
    id: int                 # nvmlGpuInstanceProfileInfo.id
    name: str               # e.g. "1g.5gb", "1g.5gb+me"
    slices: int             # compute slices
    memory_slices: int      # placement size
    instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    placements: tuple[int, ...]
    # SMs of a compute instance of C slices, by C, for each C it offers (see ci_multiprocessors).
    ci_sms: tuple[tuple[int, int], ...]

    @property
    def all_media(self) -> bool:
        return self.name.endswith("+me.all")

    @property
    def no_media(self) -> bool:
        return self.name.endswith("-me")

    @functools.cached_property
    def ci_profiles(self) -> tuple[CiProfileSpec, ...]:
        """Compute-instance profiles a GI of this profile offers.

        C compute slices fit a G-slice GI when C == G or 2C <= G+1 (the rule the
        published CI tables follow), G // C of them, packed from slice 0.
        """
        out = []
        for c in sorted(_CI_INDEX_BY_SLICES):
            if c <= self.slices and (c == self.slices or 2 * c <= self.slices + 1):
                n = self.slices // c
                out.append(CiProfileSpec(
                    id=ci_profile_index(c), slices=c, instances=n,
                    multiprocessors=dict(self.ci_sms)[c],
                    placements=tuple(k * c for k in range(n))))
        return tuple(out)

    def ci_profile(self, profile_id: int) -> CiProfileSpec | None:
        return next((p for p in self.ci_profiles if p.id == profile_id), None)


@dataclass(frozen=True)
class MigSpec:
    memory_slices: int
    compute_slices: int
    multiprocessors: int
    gi_profiles: tuple[GiProfileSpec, ...]

    def by_id(self, profile_id: int) -> GiProfileSpec | None:
        return next((p for p in self.gi_profiles if p.id == profile_id), None)

    def by_index(self, index: int) -> GiProfileSpec | None:
        return next((p for p in self.gi_profiles if p.index == index), None)

    @property
    def full(self) -> GiProfileSpec:
        return max(self.gi_profiles, key=lambda p: (p.memory_slices, p.slices))


@dataclass(frozen=True)
class SkuSpec:
    key: str
    name: str
    pci_device_id: int
    pci_subsystem_id: int
    architecture: str
    compute_capability: tuple[int, int]
    memory_mib: int
    multiprocessors: int
    power_limit_w: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    pcie_generation: int
    pcie_width: int
    mig: MigSpec | None
    nvlink_links: int = 0       # NVLinks the GPU has (0: none)
    nvlink_version: int = 0     # nvmlNvlinkVersion_t of its links
    brand: str = "nvidia"

    @property
    def nvml_architecture(self) -> int:
        return ARCHITECTURES[self.architecture]

    @property
    def mig_mode_persists(self) -> bool:
        """Ampere keeps MIG mode in InfoROM across reboots; Hopper and newer lose it."""
        return self.nvml_architecture < ARCHITECTURES["hopper"]


@dataclass(frozen=True)
class GpuSlot:
    sku: SkuSpec
    pci_bus_id: str          # "0000:07:00.0"
    audio: bool = False      # an HD-audio function at .1, in the GPU's IOMMU group


@dataclass(frozen=True)
class NodeProfile:
    name: str
    description: str
    machine: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSlot, ...]
    numa_nodes: int = 1      # GPUs spread over them in order; 0: the platform reports none
    minors: tuple[int, ...] = ()   # device minor of each GPU, by index; () means minor = index
    nvswitches: int = 0      # NVSwitch chips on the baseboard (/proc/driver/nvidia-nvswitch)
    topology: dict | None = None   # the profile's topology section (sim/topology.py)

    def minor(self, index: int) -> int:
        return self.minors[index] if self.minors else index

    def numa_node(self, index: int) -> int:
        """The NUMA node sysfs reports for GPU ``index`` (-1: none)."""
        if self.numa_nodes < 1:
            return -1
        if self.topology:
            return int(self.topology["gpus"][index]["numa"])
        return index * self.numa_nodes // len(self.gpus)


DATA = Path(__file__).parent / "data"


def _data(name: str):
    import yaml   # only the simulator's data files need it
    return yaml.safe_load((DATA / name).read_text())


# NVML_GPU_INSTANCE_PROFILE_<N>_SLICE values of the plain profiles, keyed by slice count.
_GI_INDEX_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def ci_multiprocessors(profiles: list[dict]) -> dict[int, tuple[tuple[int, int], ...]]:
    """Per GI profile id, the SMs of its compute instances by slice count.

    A CI of all the GI's slices has the GI's SMs; one of C < G slices has the SMs of the
    plain C-slice GPU instance, so a 1c CI on H100 has the 16 SMs the reference lists for
    1g.10gb, not 132 * 1 // 7 = 18 (SM slices are not equal shares of the whole GPU's SMs
    there). Proportional only where the SKU has no such profile.
    """
    plain = {p["slices"]: p["multiprocessors"] for p in profiles
             if _GI_INDEX_BY_SLICES.get(p["slices"]) == p["index"]}
    return {p["id"]: tuple((c, p["multiprocessors"] if c == p["slices"]
                            else plain.get(c, p["multiprocessors"] * c // p["slices"]))
                           for c in _CI_INDEX_BY_SLICES if c <= p["slices"])
            for p in profiles}


# The CUDA driver API each driver branch ships: nvidia-smi's "CUDA Version" (450.80.02 11.0,
# 495.29.05 11.5, 535.129.03 12.2, 545.23.08 12.3, 550 12.4, 580.65.06 13.0 in published output).
CUDA_BY_BRANCH = {450: 11000, 460: 11020, 470: 11040, 495: 11050, 510: 11060, 515: 11070,
                  520: 11080, 525: 12000, 530: 12010, 535: 12020, 545: 12030, 550: 12040,
                  555: 12050, 560: 12060, 565: 12070, 570: 12080, 575: 12090, 580: 13000}
_VERSION = re.compile(r"\d{3}\.\d{1,3}(\.\d{1,3})?")


def driver_branch(version: str) -> int:
    """``550`` for ``550.90.07``."""
    return int(version.split(".")[0])


def check_driver_version(version: str) -> str:
    """The version if it is one of a MIG-capable branch (R450 and later); UsageError otherwise."""
    if not _VERSION.fullmatch(version or ""):
        raise UsageError(f"{version!r} is not an NVIDIA driver version",
                         hint="give one such as 550.90.07 or 495.29.05")
    if driver_branch(version) < min(CUDA_BY_BRANCH):
        raise UsageError(f"driver {version} is older than R450, the first with MIG",
                         hint=f"give a version of R{min(CUDA_BY_BRANCH)} or later")
    return version


def cuda_version(version: str) -> int:
    """The CUDA driver version of a driver version's branch (nvmlSystemGetCudaDriverVersion)."""
    branch = driver_branch(check_driver_version(version))
    return CUDA_BY_BRANCH[max(b for b in CUDA_BY_BRANCH if b <= branch)]


def _on_branch(raw: dict, branch: int | None) -> dict:
    """``raw`` with the values older driver branches report instead (``older_branches``:
    each entry applies to branches before its ``before``, the oldest winning)."""
    out = {k: v for k, v in raw.items() if k != "older_branches"}
    for older in sorted(raw.get("older_branches", ()), key=lambda o: -o["before"]):
        if branch is not None and branch < older["before"]:
            out.update({k: v for k, v in older.items() if k != "before"})
    return out


def sku_from_dict(key: str, raw: dict, driver_version: str | None = None) -> SkuSpec:
    """The SKU as a driver of ``driver_version`` shows it (None: the newest branch): its
    figures on that branch, and only the MIG profiles the branch has (``since``)."""
    branch = None if driver_version is None else driver_branch(driver_version)
    raw = _on_branch(raw, branch)
    mig = raw.get("mig")
    if mig:
        profiles = [_on_branch(p, branch) for p in mig["gpu_instance_profiles"]
                    if branch is None or branch >= p.get("since", 0)]
        ci_sms = ci_multiprocessors(profiles)
        mig = MigSpec(
            memory_slices=mig["memory_slices"], compute_slices=mig["compute_slices"],
            multiprocessors=mig["multiprocessors"],
            gi_profiles=tuple(GiProfileSpec(
                index=p["index"], id=p["id"], name=p["name"], slices=p["slices"],
                memory_slices=p["memory_slices"], instances=p["instances"],
                memory_mib=p["memory_mib"], multiprocessors=p["multiprocessors"],
                copy_engines=p["copy_engines"], decoders=p["decoders"],
                encoders=p["encoders"], jpegs=p["jpegs"], ofas=p["ofas"],
                placements=tuple(p["placements"]), ci_sms=ci_sms[p["id"]]) for p in profiles))
    major, minor = str(raw["compute_capability"]).split(".")
    return SkuSpec(
        key=key, name=raw["name"], pci_device_id=raw["pci_device_id"],
        pci_subsystem_id=raw["pci_subsystem_id"], architecture=raw["architecture"],
        compute_capability=(int(major), int(minor)), memory_mib=raw["memory_mib"],
        multiprocessors=raw["multiprocessors"], power_limit_w=raw["power_limit_w"],
        max_sm_clock_mhz=raw["max_sm_clock_mhz"], max_mem_clock_mhz=raw["max_mem_clock_mhz"],
        pcie_generation=raw["pcie_generation"], pcie_width=raw["pcie_width"], mig=mig,
        nvlink_links=int((raw.get("nvlink") or {}).get("links", 0)),
        nvlink_version=int((raw.get("nvlink") or {}).get("version", 0)),
        brand=raw.get("brand", "nvidia"))


@functools.cache
def raw_skus() -> dict[str, dict]:
    return _data("skus.yaml")


@functools.cache
def skus() -> dict[str, SkuSpec]:
    return {key: sku_from_dict(key, raw) for key, raw in raw_skus().items()}


def profile_names() -> list[str]:
    return sorted(p.stem for p in (DATA / "profiles").glob("*.yaml"))


@functools.cache
def load_profile(name: str) -> NodeProfile:
    if name not in profile_names():
        from ..suggest import unknown
        # A name from the command line (--profile): a usage error.
        raise UsageError(unknown("simulated node profile", name, profile_names()),
                         hint=f"choose one of: {', '.join(profile_names())} (hostagent sim profiles)")
    raw = _data(f"profiles/{name}.yaml")
    table = skus()
    slots = tuple(GpuSlot(table[group["sku"]], bus.lower(), bool(group.get("audio")))
                  for group in raw["gpus"] for bus in group["pci_bus_ids"])
    minors = tuple(int(m) for m in raw.get("minors", ()))
    if minors and sorted(minors) != list(range(len(slots))):
        raise ValueError(f"profile {name}: minors must number the {len(slots)} GPUs once each")
    return NodeProfile(name=name, description=raw["description"], machine=raw["machine"],
                       driver_version=str(raw["driver_version"]),
                       cuda_driver_version=int(raw["cuda_driver_version"]), gpus=slots,
                       numa_nodes=int(raw.get("numa_nodes", 1)), minors=minors,
                       nvswitches=int(raw.get("nvswitches", 0)), topology=raw.get("topology"))
