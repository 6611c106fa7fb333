"""The metrics page on simulated nodes: DCGM exporter's names and labels, values that move,
MIG series, health and allocation labels, and scrapes that never reach NVML."""

import re
import time
import urllib.error
import urllib.request

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostagent.devices import read_inventory
from hostagent.errors import UnavailableError
from hostagent.health import HealthMonitor, HealthOptions
from hostagent.metrics import (AgentMetrics, MetricsOptions, MetricsServer, MetricsService,
                               allocation_labels)
from hostagent.metrics.families import ALL_NAMES, PROF_FAMILIES
from hostagent.sim import control
from hostagent.sim.node import MIG_ENABLE
from tests.waiting import until

DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
COUNTERS = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
# Not on an A100 host: profiling (GPM is Hopper and newer) and a vGPU guest's licence.
NOT_ON_A100 = {f.name for f in PROF_FAMILIES} | {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}


def parse(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def series(families, name, **match):
    return [s for s in families[name].samples if all(s.labels.get(k) == v for k, v in match.items())]


def mig_sevens(store, gpus):
    """Seven 1g.5gb instances on each of ``gpus``."""
    with store.mutate() as s:
        for g in gpus:
            s.set_mig_mode(store.facts, g, MIG_ENABLE)
            s.reset_gpu(g)
            for _ in range(7):
                gi = s.create_gi(store.facts, g, 19)
                s.create_ci(store.facts, g, gi.id, 0)


@pytest.fixture
def service(make_node):
    started = []

    def start(profile="dgx-a100", layout=None, *, interval=3600.0, port=None, monitor=False, **kw):
        host, store = make_node(profile)
        if layout:
            layout(store)
        inv = read_inventory(host)
        agent = AgentMetrics()          # one set of collectors, shared as the daemon shares it
        mon = None
        if monitor:
            mon = HealthMonitor(host, inv, HealthOptions(wait_timeout_ms=200, state_file=False),
                                metrics=agent)
            mon.start()
            started.append(mon)
        svc = MetricsService(host, inv, MetricsOptions(port=port, interval=interval, hostname="node-1"),
                             health_monitor=mon, agent=agent, **kw)
        svc.start()
        started.append(svc)
        return host, store, inv, svc, mon
    yield start
    for s in reversed(started):
        s.stop()


def test_names_types_and_labels_match_dcgm_exporter(service):
    host, store, inv, svc, _ = service("dgx-a100")
    text = svc.render().decode()
    fams = parse(text)
    assert set(ALL_NAMES) - NOT_ON_A100 == set(ALL_NAMES) & set(fams)
    assert not NOT_ON_A100 & set(fams)
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" in fams       # A100 without MIG: rows are read
    for name in set(ALL_NAMES) - NOT_ON_A100:
        assert fams[name].type == ("counter" if name in COUNTERS else "gauge"), name
        assert len(fams[name].samples) == 8, name
    # dcgm-exporter's exact text: TYPE line under the DCGM name, counters without _total,
    # labels in its order
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert not re.search(r"^DCGM_\w+_total\{", text, re.M)
    first = re.search(r"^DCGM_FI_DEV_GPU_TEMP\{(.*)\} \d+$", text, re.M).group(1)
    assert re.findall(r'(\w+)="', first) == DCGM_LABELS
    gpu3 = inv.gpus[3]
    (s,) = series(fams, "DCGM_FI_DEV_FB_TOTAL", gpu="3")
    assert s.labels == {"gpu": "3", "UUID": gpu3.uuid, "pci_bus_id": gpu3.pci_bus_id, "device": "nvidia3",
                        "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": "node-1",
                        "DCGM_FI_DRIVER_VERSION": "550.90.07"}
    assert s.value == 40960
    assert series(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="3")[0].value == 0
    assert 0 < series(fams, "DCGM_FI_DEV_POWER_USAGE", gpu="3")[0].value < 400      # watts
    assert "hostagent_metrics_samples_total" in {s.name for f in fams.values() for s in f.samples}


def test_mig_series_carry_instance_labels(service):
    host, store, inv, svc, _ = service("dgx-a100", lambda st: mig_sevens(st, [0, 1]))
    fams = parse(svc.render().decode())
    gpu0 = inv.gpus[0]
    used = series(fams, "DCGM_FI_DEV_FB_USED", gpu="0")
    assert len(used) == 8                                       # the GPU and its seven instances
    mig = [s for s in used if "GPU_I_ID" in s.labels]
    assert {s.labels["GPU_I_ID"] for s in mig} == {str(gi.id) for gi in gpu0.mig.gpu_instances}
    assert {s.labels["GPU_I_PROFILE"] for s in mig} == {"1g.5gb"}
    assert {s.labels["UUID"] for s in mig} == {gpu0.uuid}       # the parent's, as DCGM does
    assert series(fams, "DCGM_FI_DEV_FB_TOTAL", gpu="0", GPU_I_ID="7")[0].value == 4864
    assert len(series(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="1")) == 8
    # utilisation is not available with MIG enabled: no series rather than a false 0
    assert {s.labels["gpu"] for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples} == {"2", "3", "4", "5", "6", "7"}
    assert not any("GPU_I_ID" in s.labels for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples)
    assert "hostagent_device_healthy" not in fams               # no monitor: no health series


def test_values_move_between_samples(service):
    host, store, inv, svc, _ = service("t4x2")
    before = parse(svc.render().decode())
    control.hold(store, "1", used_mib=2048)
    try:
        time.sleep(0.3)
        svc.sampler.sample_now()
        after = parse(svc.render().decode())
    finally:
        control.release(store)

    def value(fams, name, gpu):
        return series(fams, name, gpu=gpu)[0].value
    for gpu in "01":
        assert value(after, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu) > \
            value(before, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu)
    assert value(before, "DCGM_FI_DEV_GPU_UTIL", "1") == 0 < value(after, "DCGM_FI_DEV_GPU_UTIL", "1")
    assert value(after, "DCGM_FI_DEV_FB_USED", "1") == 2048
    assert value(after, "DCGM_FI_DEV_POWER_USAGE", "1") > value(before, "DCGM_FI_DEV_POWER_USAGE", "1")
    assert value(after, "DCGM_FI_DEV_SM_CLOCK", "1") > value(before, "DCGM_FI_DEV_SM_CLOCK", "1")
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in after                # T4: GDDR6, no sensor


def test_scrapes_never_call_nvml(service):
    host, store, inv, svc, _ = service("dgx-a100", lambda st: mig_sevens(st, [2]), port=0)
    lib = pynvml.nvmlLib
    calls = sum(lib.calls.values())
    url = f"http://127.0.0.1:{svc.port}/metrics"
    for _ in range(20):
        with urllib.request.urlopen(url) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            parse(r.read().decode())
        svc.render()
    assert sum(lib.calls.values()) == calls
    svc.sampler.sample_now()                                   # a sample does call NVML
    assert sum(lib.calls.values()) > calls


def test_sampler_runs_on_its_own_schedule(service):
    host, store, inv, svc, _ = service("t4x2", interval=0.2)
    first = svc.sampler.snapshot
    time.sleep(0.7)
    assert svc.sampler.snapshot is not first and svc.sampler.snapshot.taken_at > first.taken_at
    assert svc.sampler.snapshot.nvml_calls < first.nvml_calls   # refused queries are not repeated


def test_health_in_metrics(service):
    host, store, inv, svc, mon = service("dgx-a100", lambda st: mig_sevens(st, [0]), monitor=True)
    gpu0 = inv.gpus[0]
    scoped = gpu0.mig.devices[2]
    control.inject_xid(store, 0, 94, gi=scoped.gi, ci=scoped.ci)
    control.inject_xid(store, 5, 48)
    until(lambda: not (mon.state.get(inv.gpus[5].uuid).healthy or mon.state.get(scoped.uuid).healthy), 10,
          "XID on the monitor's state")
    fams = parse(svc.render().decode())
    xid = {(s.labels["gpu"], s.labels.get("GPU_I_ID")): s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert xid[("5", None)] == 48 and xid[("0", str(scoped.gi))] == 94
    assert xid[("0", None)] == 0 and sum(v for v in xid.values()) == 48 + 94
    # dcgm-exporter's err_code and err_msg on every series, last, from NVIDIA's XID catalogue
    labelled = {(s.labels["gpu"], s.labels.get("GPU_I_ID")): (s.labels["err_code"], s.labels["err_msg"])
                for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert labelled[("5", None)] == ("48", "Double Bit ECC Error")
    assert labelled[("0", str(scoped.gi))] == ("94", "Contained ECC error")
    assert labelled[("0", None)] == ("0", "No Error")
    assert all(code == str(int(xid[key])) for key, (code, _) in labelled.items())
    text = svc.render().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS{gpu=\"5\""))
    assert re.findall(r'(\w+)="', line)[-2:] == ["err_code", "err_msg"]
    healthy = {s.labels["UUID"]: s.value for s in fams["hostagent_device_healthy"].samples}
    assert len(healthy) == 8 + 7
    assert {u for u, v in healthy.items() if v == 0} == {inv.gpus[5].uuid, scoped.uuid}
    assert set(s.value for s in fams["hostagent_device_monitored"].samples) == {1}
    events = {(s.labels["kind"], s.labels["ignored"]): s.value
              for s in series(fams, "hostagent_health_events") if s.name.endswith("_total")}
    assert events == {("xid", "false"): 2}


def test_allocation_labels(service):
    owners = {}
    host, store, inv, svc, _ = service("dgx-a100", lambda st: mig_sevens(st, [0]),
                                       device_labels=allocation_labels(lambda: owners))
    gpu0, gpu4 = inv.gpus[0], inv.gpus[4]
    owners.update({gpu4.uuid: ["claim-a"], gpu0.mig.devices[1].uuid: ["claim-b", "claim-c"]})
    fams = parse(svc.render().decode())
    (s,) = series(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="4")
    assert s.labels["allocation"] == "claim-a"
    (s,) = series(fams, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID=str(gpu0.mig.devices[1].gi))
    assert s.labels["allocation"] == "claim-b,claim-c"
    assert "allocation" not in series(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="3")[0].labels
    owners.clear()                                            # released: the label goes
    assert "allocation" not in series(parse(svc.render().decode()), "DCGM_FI_DEV_GPU_TEMP", gpu="4")[0].labels


def test_agent_metrics(service):
    host, store, inv, svc, _ = service("t4x2")
    svc.agent.api_request("GET", "/v1/devices", 200, 0.0004)
    svc.agent.mig_apply(ok=False)
    svc.agent.cdi_refresh("written")
    svc.agent.health_event("xid", ignored=True)
    fams = parse(svc.render().decode())
    assert series(fams, "hostagent_api_requests", method="GET", route="/v1/devices", code="200")[0].value == 1
    assert fams["hostagent_api_request_duration_seconds"].type == "histogram"
    assert series(fams, "hostagent_mig_apply_failures")[0].value == 1
    assert series(fams, "hostagent_cdi_refreshes", result="written")[0].value == 1
    assert series(fams, "hostagent_health_events", kind="xid", ignored="true")[0].value == 1


def test_lost_gpu_series_go_away(service):
    host, store, inv, svc, _ = service("a30x4")
    control.lose_gpu(store, 1)
    svc.sampler.sample_now()
    fams = parse(svc.render().decode())
    assert {s.labels["gpu"] for s in fams["DCGM_FI_DEV_GPU_TEMP"].samples} == {"0", "2", "3"}


def test_server_is_loopback_and_serves_only_metrics(service):
    host, store, inv, svc, _ = service("t4x2", port=0)
    assert svc.server.address == "127.0.0.1"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/other")
    assert e.value.code == 404
    taken = MetricsServer(svc.exporter, "127.0.0.1", svc.port)
    with pytest.raises(UnavailableError) as e:
        taken.start()
    assert "metrics.port" in e.value.message


def test_no_driver_means_no_values_until_it_loads(service):
    host, store, inv, svc, _ = service("t4x2", interval=0.2)
    svc.stop()
    control.set_driver_loaded(store, False)
    svc.start()                                        # NVML cannot start: no series, an error
    fams = parse(svc.render().decode())
    assert "DCGM_FI_DEV_GPU_TEMP" not in fams
    assert series(fams, "hostagent_metrics_sample_errors")[0].value >= 1
    control.set_driver_loaded(store, True)
    until(lambda: svc.sampler.snapshot is not None, 5, "sample once the driver is back")
    assert "DCGM_FI_DEV_GPU_TEMP" in parse(svc.render().decode())


def test_label_values_are_escaped():
    from hostagent.metrics.labels import format_labels
    assert format_labels([("a", 'x"y'), ("b", "c\\d"), ("n", "1\n2")]) == \
        '{a="x\\"y",b="c\\\\d",n="1\\n2"}'
    text = "m" + format_labels([("allocation", 'we"ird\nid')]) + " 1\n"
    (fam,) = text_string_to_metric_families(text)
    assert fam.samples[0].labels["allocation"] == 'we"ird\nid'
