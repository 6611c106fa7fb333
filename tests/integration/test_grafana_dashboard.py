"""The Grafana dashboard under packaging/grafana works on hostagent's metrics: every metric
its panels and variables query is on the page of a simulated node, with every label they
select or group by; and it keeps the queries of NVIDIA's dcgm-exporter dashboard."""

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hostagent.devices import read_inventory
from hostagent.health import HealthMonitor, HealthOptions
from hostagent.metrics import AgentMetrics, MetricsOptions, MetricsService
from hostagent.sim import workload
from hostagent.sim.node import MIG_ENABLE
from hostagent.sim.workload import Load

from .test_metrics_pods import SOCKET, PodResources

DASHBOARD = Path(__file__).resolve().parents[2] / "packaging/grafana/hostagent-dashboard.json"
# The queries of NVIDIA/dcgm-exporter's grafana/dcgm-exporter-dashboard.json (d5e5f51).
G = 'instance=~"$instance", gpu=~"$gpu"'
NVIDIA_QUERIES = {f"DCGM_FI_DEV_GPU_TEMP{{{G}}}", f"avg(DCGM_FI_DEV_GPU_TEMP{{{G}}})",
                  f"DCGM_FI_DEV_POWER_USAGE{{{G}}}", f"sum(DCGM_FI_DEV_POWER_USAGE{{{G}}})",
                  f"DCGM_FI_DEV_SM_CLOCK{{{G}}} * 1000000", f"DCGM_FI_DEV_GPU_UTIL{{{G}}}",
                  f"DCGM_FI_DEV_FB_USED{{{G}}}", f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{G}}}",
                  "label_values(DCGM_FI_DEV_GPU_TEMP, instance)", "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)"}
SCRAPE_LABELS = {"instance", "job"}          # Prometheus adds these when it scrapes


def queries(dashboard) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    found = [t["expr"] for p in panels for t in p["targets"]]
    found += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def uses(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, labels it needs) of each selector and label_values() in a query."""
    if expr.startswith("label_values("):
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", expr).groups()
        return [(metric, {label})]
    grouped = {label.strip() for match in re.findall(r"by \(([^)]*)\)", expr) for label in match.split(",")}
    out = []
    for metric, matchers in re.findall(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", expr):
        out.append((metric, set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers)) | grouped))
    assert out, f"no selector in {expr!r}"
    return out


def test_every_query_finds_its_metrics_and_labels(make_node):
    dashboard = json.loads(DASHBOARD.read_text())
    assert NVIDIA_QUERIES <= set(queries(dashboard))
    host, store = make_node("hgx-h100")
    with store.mutate() as s:                    # one GPU split, so instance series are there too
        s.set_mig_mode(store.facts, 7, MIG_ENABLE)
        s.reset_gpu(7)
        gi = s.create_gi(store.facts, 7, 19)
        s.create_ci(store.facts, 7, gi.id, 0)
    workload.set_load(store, "0", Load(gr=50, sm=40, tensor=20, dram=10, pcie_tx=100, nvlink_tx=100))
    kubelet = PodResources(host.host(SOCKET))
    inv = read_inventory(host)
    kubelet.pods = [("train", "ml", "main", [inv.gpus[0].uuid], [])]
    agent = AgentMetrics()
    # The health monitor, as the daemon runs it: device health and XIDs.
    monitor = HealthMonitor(host, inv, HealthOptions(wait_timeout_ms=200, state_file=False), metrics=agent)
    svc = MetricsService(host, inv, MetricsOptions(port=None, interval=3600, kubernetes=True),
                         health_monitor=monitor, agent=agent)
    try:
        monitor.start()
        svc.start()
        svc.pods.refresh()
        page = {f.name: f for f in text_string_to_metric_families(svc.render().decode())}
    finally:
        svc.stop()
        monitor.stop()
        kubelet.server.stop(0).wait()
    labels = {name: {k for s in fam.samples for k in s.labels} for name, fam in page.items()}
    missing = [f"{metric} (in {expr!r})" for expr in queries(dashboard) for metric, _ in uses(expr)
               if metric not in labels]
    assert not missing, "metrics the dashboard queries that the page lacks: " + ", ".join(missing)
    unlabelled = [f"{metric} has no label {label} (in {expr!r})" for expr in queries(dashboard)
                  for metric, needed in uses(expr) for label in needed - SCRAPE_LABELS
                  if label not in labels[metric]]
    assert not unlabelled, "; ".join(unlabelled)


def test_health_xid_and_mig_instance_panels():
    """Beside NVIDIA's panels: device health, the last XIDs, and each MIG instance's use."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = queries(dashboard)
    assert any(e.startswith("count(hostagent_device_healthy{") and "== 0" in e for e in exprs)
    assert any(e.startswith("hostagent_device_healthy{") for e in exprs)
    assert any(e.startswith("DCGM_FI_DEV_XID_ERRORS{") for e in exprs)
    per_instance = [e for e in exprs if 'GPU_I_ID!=""' in e]
    assert {m for e in per_instance for m, _ in uses(e)} >= {"DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    # Panels do not overlap: each grid cell is one panel's.
    cells = [(x, y) for p in dashboard["panels"] for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells))
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
