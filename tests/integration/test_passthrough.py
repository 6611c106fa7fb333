"""Passthrough allocations against the real agent on a simulated node whose GPUs each share
their IOMMU group with an HD-audio function (rtx-a6000x2): the group moves to vfio-pci and
back, NVML loses the GPU and finds it again, refusals are one line that says what to do
(each with its row in docs/troubleshooting.md), and a crash in the middle is settled at the
next start, forward or back."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from hostagent.errors import HostagentError
from hostagent.sim.control import inject_xid
from hostagent.sim.nvmlopen import holders
from hostagent.sim.store import SimStore

from tests.programs import script
from tests.rootneeds import GPU_CHANGES
from tests.waiting import until

from .agentd import FAST, AgentProcess, make_root, running_agent

DOC = (Path(__file__).resolve().parents[2] / "docs/troubleshooting.md").read_text()
GPU, AUDIO, OTHER = "0000:17:00.0", "0000:17:00.1", "0000:65:00.0"


def driver(root, bdf: str) -> str:
    try:
        return os.path.basename(os.readlink(root / f"sys/bus/pci/devices/{bdf}/driver"))
    except OSError:
        return ""


def refused(action, says: str, row: str | None = None) -> str:
    """The refusal's one line says ``says``; its row in the troubleshooting page ``row``."""
    with pytest.raises(HostagentError) as e:
        action()
    assert says in e.value.message and "\n" not in e.value.message, e.value.message
    assert (row or says) in DOC, f"docs/troubleshooting.md lacks {row or says!r}"
    return e.value.message


# Run by another user, the test is that user, named one of the uids that may pass GPUs
# through (api.plugin_uids); root may anyway.
CONFIG = {**FAST, "api": {"plugin_uids": [os.getuid()] if os.getuid() else []}}


@pytest.fixture
def node():
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        yield root, agent


def test_the_gpu_and_its_audio_function_go_to_vfio_pci_and_back(node):
    root, agent = node
    with agent.client() as c:
        before = c.devices()["gpus"]
        assert [(g["index"], g["minor"]) for g in before] == [(0, 0), (1, 1)]
        a = c.pass_through("vm", [GPU])
        assert (driver(root, GPU), driver(root, AUDIO)) == ("vfio-pci", "vfio-pci")
        [rec] = a["passthrough"]
        assert rec["functions"] == [{"bdf": GPU, "driver": "nvidia"}, {"bdf": AUDIO, "driver": "snd_hda_intel"}]
        assert rec["uuid"] == before[0]["uuid"] and a["devices"] == [before[0]["uuid"]]
        group = os.path.basename(os.readlink(root / f"sys/bus/pci/devices/{GPU}/iommu_group"))
        assert rec["group"] == int(group) and (root / f"dev/vfio/{group}").exists()
        assert [n["path"] for n in a["container_edits"]["deviceNodes"]] == [f"/dev/vfio/{group}", "/dev/vfio/vfio"]
        assert a["container_edits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"] and not a["container_edits"]["mounts"]
        # NVML counts the GPUs the nvidia driver holds: the other is index 0 now, its minor its own.
        after = c.devices()["gpus"]
        assert [(g["index"], g["minor"], g["uuid"]) for g in after] == [(0, 1, before[1]["uuid"])]
        # The command line lists it as passed through, with its allocation, not as a usable GPU.
        listing = subprocess.run([script("hostagent"), "--simulate", str(root), "devices"], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
        assert listing[0].split()[-2:] == ["DRIVER", "HEALTH"] and len(listing) == 3
        assert listing[1].split()[0] == "0" and listing[1].split()[-2:] == ["nvidia", "healthy"]
        assert listing[2].split()[:3] == ["-", "-", before[0]["uuid"]]
        assert listing[2].endswith(f"{GPU}      -    -       -    vfio-pci  passed through (vm)")
        vfio = c.node()["vfio"]
        assert vfio["iommu"] and vfio["vfio_pci"]
        assert [(g["pci_bus_id"], g["driver"], g["allocation"]) for g in vfio["gpus"]] == [
            (GPU, "vfio-pci", "vm"), ("0000:65:00.0", "nvidia", None)]
        c.release("vm")
        assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")
        assert not (root / f"dev/vfio/{group}").exists()
        assert [(g["index"], g["minor"], g["uuid"]) for g in c.devices()["gpus"]] == [
            (g["index"], g["minor"], g["uuid"]) for g in before]
        assert not os.path.exists(a["spec_path"])


def test_an_unhealthy_gpu_passed_through_comes_back_unhealthy(node):
    root, agent = node
    with agent.client() as c:
        inject_xid(SimStore(root), 0, 48)
        until(lambda: c.devices()["gpus"][0]["health"]["state"] == "unhealthy", what="the XID seen")
        before = c.devices()["gpus"][0]["health"]
        c.pass_through("vm", [GPU])
        c.release("vm")
        [back] = [g for g in c.devices()["gpus"] if g["pci_bus_id"].lower().endswith(GPU)]
        assert back["health"]["state"] == "unhealthy" and back["health"]["problems"] == before["problems"]


@GPU_CHANGES                            # persistence mode: root's, as nvidia-smi -pm and NVML say
def test_persistence_mode_goes_off_first_and_comes_back(node):
    root, agent = node
    persistenced = subprocess.run([str(root / "usr/bin/nvidia-persistenced")], capture_output=True, text=True)
    assert persistenced.returncode == 0, persistenced.stderr
    try:
        with agent.client() as c:
            c.pass_through("vm", ["0"])
            assert driver(root, GPU) == "vfio-pci"
            c.release("vm")
        # Back on, through the driver's own flag (nvidia-persistenced does not take it again).
        state = SimStore(root).read()
        assert state.gpus[0].persistence and state.gpus[0].persistenced_released
    finally:
        pid = int((root / "var/run/nvidia-persistenced/nvidia-persistenced.pid").read_text())
        os.kill(pid, signal.SIGTERM)


def test_refusals_say_what_to_do_and_change_nothing(node):
    root, agent = node
    store = SimStore(root)
    with agent.client() as c:
        # No vfio_pci module to load.
        module = next(root.glob("lib/modules/*/kernel/drivers/vfio/pci/vfio-pci.ko"))
        module.rename(module.with_suffix(".away"))
        refused(lambda: c.pass_through("vm", ["0"]), "the vfio_pci kernel module is not loaded and cannot be")
        module.with_suffix(".away").rename(module)
        # A process on the GPU.
        holder = subprocess.Popen(["sleep", "60"])
        try:
            with store.mutate() as s:
                from hostagent.sim.node import SimProcess
                s.processes.append(SimProcess(pid=holder.pid, gpu=0))
            refused(lambda: c.pass_through("vm", ["0"]), "process(es) run on it")
        finally:
            holder.kill()
            holder.wait()
        # Another allocation holds it.
        c.allocate("job", ["0"])
        refused(lambda: c.pass_through("vm", ["0"]), "is in use: allocation job holds it")
        c.release("job")
        assert driver(root, GPU) == "nvidia"
        # The IOMMU off.
        from hostagent.sim.pcibus import set_iommu
        set_iommu(store, False, False)
        refused(lambda: c.pass_through("vm", ["0"]), "cannot be passed through: the IOMMU is off")
        set_iommu(store, True, False)
        assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")
        assert c.allocations() == []


@GPU_CHANGES                            # a MIG layout, time-slicing
def test_a_gpu_with_mig_devices_or_shared_by_the_node_is_refused():
    root = make_root("dgx-a100")
    layout = {"version": "v1", "mig-configs": {"t": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.20gb": 1}},
        {"devices": [1, 2, 3, 4, 5, 6, 7], "mig-enabled": False}]}}
    sharing = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "devices": [1], "replicas": 2}]}}}
    with running_agent(root, CONFIG) as agent, agent.client() as c:
        c.mig_apply("t", layout)
        c.sharing_apply(sharing)
        refused(lambda: c.pass_through("vm", ["0"]), "is in use: it has 1 MIG device(s)", "is in use: it has")
        refused(lambda: c.pass_through("vm", ["1"]), "is in use: the node's sharing configuration shares it",
                "the node's sharing configuration shares it")
        assert c.allocations() == [] and [g["index"] for g in c.devices()["gpus"]] == list(range(8))


def test_a_group_holding_a_bridge_cannot_move(node):
    root, agent = node
    store = SimStore(root)
    facts = json.loads((store.dir / "node.json").read_text())
    bridge = "0000:16:01.0"
    facts["iommu_groups"][bridge] = facts["iommu_groups"][GPU]
    (store.dir / "node.json").write_text(json.dumps(facts))
    folder = root / f"sys/bus/pci/devices/{bridge}"
    if not folder.exists():
        os.makedirs(root / "sys/devices/pci0000:16/0000:16:01.0", exist_ok=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.symlink_to("../../../devices/pci0000:16/0000:16:01.0")
    (folder / "class").write_text("0x060400\n")
    (folder / "vendor").write_text("0x8086\n")
    from hostagent.sim.pcibus import sync
    sync(root, SimStore(root).facts, store.read())
    with agent.client() as c:
        refused(lambda: c.pass_through("vm", ["0"]), "holds the PCI bridge 0000:16:01.0, which vfio-pci cannot take",
                "which vfio-pci cannot take")
    assert driver(root, GPU) == "nvidia"


def test_a_crash_half_way_is_rolled_back_at_start():
    root = make_root("rtx-a6000x2")
    agent = AgentProcess(root, CONFIG)
    agent.env = {"HOSTAGENT_FAULT": "passthrough:bound_one"}
    agent.start()
    try:
        with agent.client() as c:
            with pytest.raises(HostagentError):
                c.pass_through("vm", ["0"])
        assert agent.proc.wait(10) == -9
        # Died with the GPU on vfio-pci and its audio function still on its driver.
        assert (driver(root, GPU), driver(root, AUDIO)) == ("vfio-pci", "snd_hda_intel")
        agent.env = {}
        agent.start()
        assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")
        assert "rolled back after a crash" in agent.log()
        assert not (root / "var/lib/hostagent/passthrough/journal.json").exists()
        with agent.client() as c:
            assert c.allocations() == [] and len(c.devices()["gpus"]) == 2
    finally:
        agent.stop()
        agent.cleanup()


def test_a_crash_while_releasing_finishes_the_release_and_a_live_one_stays_on_vfio():
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        with agent.client() as c:
            c.pass_through("stays", ["1"])
            c.pass_through("goes", ["0"])
        agent.stop()
        agent.env = {"HOSTAGENT_FAULT": "passthrough:released"}
        agent.start()
        with agent.client() as c:
            with pytest.raises(HostagentError):
                c.release("goes")
        assert agent.proc.wait(10) == -9
        agent.env = {}
        agent.start()
        assert "release of GPU 0000:17:00.0 from goes finished after a crash" in agent.log()
        with agent.client() as c:
            assert [a["id"] for a in c.allocations()] == ["stays"]
            assert driver(root, GPU) == "nvidia" and driver(root, "0000:65:00.0") == "vfio-pci"
            [alloc] = c.allocations()
            assert os.path.exists(alloc["spec_path"])
            c.release("stays")
            assert driver(root, "0000:65:00.0") == "nvidia"


def test_the_agent_lets_go_of_its_own_nvml_around_the_move_and_watches_again_after(node):
    root, agent = node
    store = SimStore(root)
    with agent.client() as c:
        moved, other = (g["uuid"] for g in c.devices()["gpus"])
        # The monitor and the sampler hold both GPUs open through NVML while they run.
        assert holders(root, GPU) == [agent.proc.pid]
        c.pass_through("vm", [GPU])
        assert f"health monitor and metrics sampler paused: GPU {GPU} to vfio-pci for vm" in agent.log()
        # Before the answer they run again, on the GPU NVML still lists.
        assert holders(root, OTHER) == [agent.proc.pid] and holders(root, GPU) == []
        until(lambda: f'UUID="{other}"' in c.metrics(), what="the sampler back")
        assert f'UUID="{moved}"' not in c.metrics()
        inject_xid(store, 1, 48)
        until(lambda: c.devices()["gpus"][0]["health"]["state"] == "unhealthy", what="the XID seen")
        c.release("vm")
        assert f"health monitor and metrics sampler paused: GPU {GPU} back to nvidia" in agent.log()
        assert holders(root, GPU) == [agent.proc.pid]


def crashed_at(agent, point: str, action) -> None:
    """``action(client)`` reaching crash point ``point`` kills the agent there."""
    agent.stop()
    agent.env = {"HOSTAGENT_FAULT": point}
    agent.start()
    with agent.client() as c:
        with pytest.raises(HostagentError):
            action(c)
    assert agent.proc.wait(10) == -9
    agent.env = {}


def test_a_crash_after_a_replacement_commits_sends_the_replaced_allocations_other_gpu_back_at_start():
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        with agent.client() as c:
            c.pass_through("old", [GPU, OTHER])
        # Committed: "new" holds the GPU it kept; the other GPU, "old"'s, not yet journaled back.
        crashed_at(agent, "passthrough:committed", lambda c: c.pass_through("new", [GPU], replaces=["old"]))
        assert (driver(root, GPU), driver(root, OTHER)) == ("vfio-pci", "vfio-pci")
        agent.start()
        assert f"GPU {OTHER}, left on vfio-pci by the agent with no allocation holding it, bound back" in agent.log()
        assert (driver(root, GPU), driver(root, AUDIO), driver(root, OTHER)) == ("vfio-pci", "vfio-pci", "nvidia")
        with agent.client() as c:
            [new] = c.allocations()
            assert new["id"] == "new" and len(c.devices()["gpus"]) == 1
            # The GPU it took over on vfio-pci named by its UUID, as a GPU it moved itself.
            assert new["devices"] == [new["passthrough"][0]["uuid"]] and new["devices"][0].startswith("GPU-")
            c.release("new")
        assert (driver(root, GPU), driver(root, AUDIO)) == ("nvidia", "snd_hda_intel")


def test_a_crash_releasing_one_of_two_gpus_sends_both_back_at_start():
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        with agent.client() as c:
            c.pass_through("vm", [GPU, OTHER])
        # The first GPU back; the journal says so, and nothing yet of the second.
        crashed_at(agent, "passthrough:released", lambda c: c.release("vm"))
        assert (driver(root, GPU), driver(root, OTHER)) == ("nvidia", "vfio-pci")
        agent.start()
        assert (driver(root, GPU), driver(root, AUDIO), driver(root, OTHER)) == ("nvidia", "snd_hda_intel", "nvidia")
        with agent.client() as c:
            assert c.allocations() == [] and len(c.devices()["gpus"]) == 2


def test_a_crash_before_a_two_gpu_passthrough_commits_sends_both_back_at_start():
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        # Both GPUs moved, the checkpoint being written (a restarted agent's first save is a
        # snapshot): the journal names the second GPU only.
        crashed_at(agent, "write:allocations.json", lambda c: c.pass_through("vm", [GPU, OTHER]))
        assert (driver(root, GPU), driver(root, OTHER)) == ("vfio-pci", "vfio-pci")
        agent.start()
        assert (driver(root, GPU), driver(root, AUDIO), driver(root, OTHER)) == ("nvidia", "snd_hda_intel", "nvidia")
        with agent.client() as c:
            assert c.allocations() == [] and len(c.devices()["gpus"]) == 2


def to_vfio_by_hand(root, bdf: str) -> None:
    """What an admin does (modprobe vfio_pci, the kernel's driver_override recipe), the
    agent stopped."""
    from hostagent.sim.pcibus import load_vfio
    from hostagent.sim.platform import simulated_host
    load_vfio(SimStore(root))
    host = simulated_host(root)
    for path, value in ((f"/sys/bus/pci/devices/{bdf}/driver_override", "vfio-pci"),
                        (f"/sys/bus/pci/drivers/{driver(root, bdf)}/unbind", bdf),
                        ("/sys/bus/pci/drivers_probe", bdf)):
        host.platform.write_attribute(host, path, value)
    assert driver(root, bdf) == "vfio-pci"


def test_at_start_a_gpu_kept_for_vms_and_one_an_admin_bound_stay_on_vfio_pci():
    root = make_root("rtx-a6000x2")
    with running_agent(root, {**CONFIG, "passthrough": {"vm_gpus": [OTHER]}}) as agent:
        with agent.client() as c:
            c.pass_through("vm", [GPU, OTHER])
        crashed_at(agent, "passthrough:committed", lambda c: c.pass_through("new", [GPU], replaces=["vm"]))
        agent.start()
        # The agent's, held by nothing, but kept for VMs: it waits on vfio-pci for the next VM.
        assert driver(root, OTHER) == "vfio-pci" and "bound back" not in agent.log()
        with agent.client() as c:
            c.release("new")
            # Passed through again and released, it goes back to nvidia, where it came from.
            [rec] = c.pass_through("vm", [OTHER])["passthrough"]
            assert [f["driver"] for f in rec["functions"]] == ["nvidia", "snd_hda_intel"] and rec["uuid"]
            c.release("vm")
        assert driver(root, OTHER) == "nvidia"
        agent.stop()
        to_vfio_by_hand(root, GPU)
        agent.start()
        # Not the agent's doing: left where the admin put it.
        assert (driver(root, GPU), driver(root, AUDIO)) == ("vfio-pci", "snd_hda_intel")
        with agent.client() as c:
            assert [g["pci_bus_id"].lower()[4:] for g in c.devices()["gpus"]] == [OTHER]


def test_a_journal_older_than_the_allocation_holding_its_gpu_leaves_the_gpu_where_it_is(tmp_path):
    # A release whose bind back failed leaves its journal; the GPU, still on vfio-pci, is
    # then passed through for another allocation. The old journal must not take it.
    from hostagent.daemon.allocations import Allocation
    from hostagent.sim.driverroot import create_node
    from hostagent.sim.platform import simulated_host
    from hostagent.vfio import executor, pci
    from hostagent.vfio.plan import plan_bind
    create_node(tmp_path, "rtx-a6000x2")
    host = simulated_host(tmp_path)
    executor.ensure_vfio_pci(host)
    gpu = next(g for g in pci.read_gpus(host) if g.bdf == GPU)
    rec = executor.bind(host, plan_bind(gpu, pci.read_facts(host)), "new", None)
    executor.done(host)
    executor.PassthroughJournal(host, {"op": "release", **rec, "id": "old"})._write()
    holder = Allocation(id="new", devices=(GPU,), request={"id": "new", "devices": []}, created=0.0,
                        passthrough=({**rec},))
    kept, notes = executor.settle(host, [holder])
    assert kept == [holder] and driver(tmp_path, GPU) == "vfio-pci"
    assert notes == [f"passthrough journal of old dropped, GPU {GPU} left as it is: allocation new holds it now"]
    assert executor.PassthroughJournal.load(host) is None


def test_the_unbind_lock_is_tried_as_nvidias_script_tries_it(make_node):
    # NVIDIA's unbind_from_driver.sh: 5 tries, 1, 2, 3 and 4 s between them. The platform's
    # pause is where a real host sleeps; here it records, and the GPU's holder lets go.
    import pynvml as N
    from hostagent.devices.reader import load_nvml
    from hostagent.hostroot import HostRoot
    from hostagent.sim.platform import SimulatedNode
    from hostagent.vfio.executor import _unbind_lock

    class Paused(SimulatedNode):
        def __init__(self, on_pause=lambda: None):
            self.pauses, self.on_pause = [], on_pause

        def pause(self, seconds):
            self.pauses.append(seconds)
            self.on_pause()

    node, _ = make_node("rtx-a6000x2")
    load_nvml(node)
    N.nvmlInit()
    try:
        N.nvmlDeviceGetHandleByPciBusId(GPU.encode())          # this process holds the GPU open
        held = Paused()
        refused(lambda: _unbind_lock(HostRoot.simulation(node.root, held), GPU),
                "the nvidia driver will not let it go")
        assert held.pauses == [1, 2, 3, 4]
        letting_go = Paused(on_pause=N.nvmlShutdown)           # it shuts NVML down meanwhile
        _unbind_lock(HostRoot.simulation(node.root, letting_go), GPU)
        assert letting_go.pauses == [1]
        assert (node.root / f"proc/driver/nvidia/gpus/{GPU}/unbindLock").read_text().strip() == "1"
    finally:
        while N.nvmlLib._initialised:
            N.nvmlShutdown()


def test_after_a_reboot_the_allocation_goes_and_the_agent_forgets_the_gpu_it_had_moved():
    from hostagent.sim.control import reboot
    root = make_root("rtx-a6000x2")
    with running_agent(root, CONFIG) as agent:
        with agent.client() as c:
            c.pass_through("vm", [GPU])
        agent.stop()
        reboot(SimStore(root))                          # bindings live in the running kernel
        agent.start()
        assert f"allocation vm dropped: PCI function {GPU} of GPU {GPU} is on nvidia, not vfio-pci" in agent.log()
        with agent.client() as c:
            assert c.allocations() == [] and len(c.devices()["gpus"]) == 2
        # Bound to vfio-pci by an admin since: not the agent's any more, left where it is.
        agent.stop()
        to_vfio_by_hand(root, GPU)
        agent.start()
        assert driver(root, GPU) == "vfio-pci"


def test_the_simulated_kernel_keeps_vfio_pci_and_the_iommu_while_vfio_pci_holds_a_function(make_node):
    from hostagent.sim.pcibus import set_iommu, unload_vfio
    node, store = make_node("rtx-a6000x2")
    to_vfio_by_hand(node.root, AUDIO)
    refused(lambda: unload_vfio(store), "modprobe: FATAL: Module vfio_pci is in use.")
    refused(lambda: set_iommu(store, False, False), "vfio-pci holds functions of the node: bind them back first")
    for path, value in ((f"/sys/bus/pci/devices/{AUDIO}/driver_override", ""),
                        ("/sys/bus/pci/drivers/vfio-pci/unbind", AUDIO), ("/sys/bus/pci/drivers_probe", AUDIO)):
        node.platform.write_attribute(node, path, value)
    assert driver(node.root, AUDIO) == "snd_hda_intel"
    set_iommu(store, True, True)
    unload_vfio(store)
    assert not (node.root / "sys/module/vfio_pci").exists() and (node.root / "dev/iommu").exists()
