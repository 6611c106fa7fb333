"""Which functions go to vfio-pci with a GPU, pure: its IOMMU group's, the GPU first; a group
holding a bridge of any kind, or another GPU, refused."""

import pytest

from hostagent.vfio.pci import Function, PciGpu, VfioFacts
from hostagent.vfio.plan import PassthroughRefused, PassthroughUnavailable, plan_bind

ON = VfioFacts(iommu=True, iommufd=False, vfio_pci=True)


def gpu(*others: Function, group=24) -> PciGpu:
    return PciGpu(0, Function("0000:17:00.0", "0x10de", "0x2230", 0x030000, "nvidia"), group, others, 0,
                  "GA102GL [RTX A6000]", 1 << 36, None)


def test_the_gpu_and_its_audio_function_move_the_gpu_first():
    audio = Function("0000:17:00.1", "0x10de", "0x1aef", 0x040300, "snd_hda_intel")
    assert plan_bind(gpu(audio), ON).record() == [{"bdf": "0000:17:00.0", "driver": "nvidia"},
                                                  {"bdf": "0000:17:00.1", "driver": "snd_hda_intel"}]


@pytest.mark.parametrize("cls", [0x060400, 0x060000, 0x060100], ids=["pcie-port", "host-bridge", "isa-bridge"])
def test_a_group_holding_a_bridge_is_refused(cls):
    bridge = Function("0000:16:01.0", "0x8086", "0x2030", cls, "pcieport" if cls == 0x060400 else "")
    with pytest.raises(PassthroughRefused, match="holds the PCI bridge 0000:16:01.0"):
        plan_bind(gpu(bridge), ON)


def test_another_gpu_in_the_group_or_the_iommu_off_is_refused():
    other = Function("0000:18:00.0", "0x10de", "0x2230", 0x030200, "nvidia")
    with pytest.raises(PassthroughRefused, match="holds the GPU 0000:18:00.0 too"):
        plan_bind(gpu(other), ON)
    with pytest.raises(PassthroughUnavailable, match="the IOMMU is off"):
        plan_bind(gpu(group=None), VfioFacts(iommu=False, iommufd=False, vfio_pci=True))
