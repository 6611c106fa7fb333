"""hostagent's own metrics: prometheus_client collectors in a registry of their own, with
one method per thing the daemon counts."""

from __future__ import annotations

import time
from bisect import bisect_left

__all__ = ["AgentMetrics"]

# API latency buckets: a cached GET answers in well under a millisecond, a MIG apply in seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _ApiRequests:
    """API request counts and latency histograms in plain lists, turned into families at
    scrape time. Every request is counted on the event loop's thread (the one writer):
    prometheus_client's locked children cost ~6 us a request in the daemon, 7% of a cached
    GET over one connection; this costs ~1 us."""

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts: dict = {}           # (method, route, code) -> [count, created]
        self.latency: dict = {}          # (method, route) -> [per-bucket counts (+Inf last), sum]

    def record(self, method: str, route: str, code: int, seconds: float) -> None:
        self.slot(method, route, code).record(seconds)

    def slot(self, method: str, route: str, code: int) -> "_Slot":
        """The counters of one (method, route, code), for a caller that records them often."""
        count = self.counts.get((method, route, code))
        if count is None:
            count = self.counts[(method, route, code)] = [0, time.time()]
        hist = self.latency.get((method, route))
        if hist is None:
            hist = self.latency[(method, route)] = [[0] * (len(self.bounds) + 1), 0.0]
        return _Slot(count, hist, self.bounds)

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString
        requests = CounterMetricFamily("hostagent_api_requests", "API requests answered.",
                                       labels=["method", "route", "code"])
        for (method, route, code), (n, created) in list(self.counts.items()):
            requests.add_metric([method, route, str(code)], n, created=created)
        yield requests
        latency = HistogramMetricFamily("hostagent_api_request_duration_seconds",
                                        "Time to answer an API request (streams: to the first byte).",
                                        labels=["method", "route"])
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for (method, route), (buckets, total) in list(self.latency.items()):
            running, cumulative = 0, []
            for le, n in zip(les, list(buckets)):
                running += n
                cumulative.append((le, running))
            latency.add_metric([method, route], cumulative, total)
        yield latency


class _Slot:
    __slots__ = ("count", "hist", "bounds")

    def __init__(self, count: list, hist: list, bounds: tuple):
        self.count, self.hist, self.bounds = count, hist, bounds

    def record(self, seconds: float) -> None:
        self.count[0] += 1
        hist = self.hist
        hist[0][bisect_left(self.bounds, seconds)] += 1      # le: the first bound >= seconds
        hist[1] += seconds


class AgentMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.api = _ApiRequests(_LATENCY_BUCKETS)
        r.register(self.api)
        self.mig_applies = Counter("hostagent_mig_applies", "MIG layout applies started.", registry=r)
        self.mig_apply_failures = Counter("hostagent_mig_apply_failures", "MIG layout applies that failed.",
                                          registry=r)
        self.health_events = Counter("hostagent_health_events", "Health events from NVML, by kind.",
                                     ["kind", "ignored"], registry=r)
        self.cdi_refreshes = Counter("hostagent_cdi_refreshes", "CDI spec refreshes, by result.",
                                     ["result"], registry=r)
        self.samples = Counter("hostagent_metrics_samples", "Metric samples taken from NVML.", registry=r)
        self.sample_errors = Counter("hostagent_metrics_sample_errors",
                                     "Metric samples that failed (NVML unavailable).", registry=r)
        self.sample_seconds = Gauge("hostagent_metrics_sample_duration_seconds",
                                    "How long the last metric sample took.", registry=r)
        self.sample_calls = Gauge("hostagent_metrics_sample_nvml_calls",
                                  "NVML queries the last metric sample made.", registry=r)
        self.driver_ready = Gauge("hostagent_driver_ready", "1 while the driver verifies (the daemon's "
                                  "readiness gate is open), else 0.", registry=r)
        self.driver_checks = Gauge("hostagent_driver_check", "Each driver check's last result: 1 for the "
                                   "result it had, 0 for the others.", ["check", "result"], registry=r)
        self.driver_verifications = Counter("hostagent_driver_verifications", "Driver verifications, by "
                                            "outcome (usable, unusable).", ["outcome"], registry=r)
        self.mps_up = Gauge("hostagent_mps_daemon_up", "1 if the device's MPS control daemon answers, else 0.",
                            ["device"], registry=r)
        self.mps_restarts = Counter("hostagent_mps_daemon_restarts",
                                    "Restarts of the device's MPS control daemon after it died or stopped "
                                    "answering.", ["device"], registry=r)
        self.checkpoint_unreadable = Gauge("hostagent_checkpoint_unreadable_records", "Records of the "
                                           "allocations checkpoint that could not be read and are set aside, "
                                           "not yet dismissed by an admin (0: the checkpoint is whole).",
                                           registry=r)
        self.collector_success = Gauge("hostagent_scrape_collector_success", "1 when the collector's "
                                       "part of the page could be read (inventory: the node's devices; gpu: "
                                       "the last sample; gpm: profiling metrics of every GPU or GPU instance; "
                                       "kubernetes: pod labels from the kubelet), 0 when not (its series or "
                                       "labels are absent).", ["collector"], registry=r)

    # ---- what the daemon calls -------------------------------------------------------

    def api_request(self, method: str, route: str, code: int, seconds: float) -> None:
        """``route`` is the route pattern ("/v1/devices/{id}"), never the raw path. Call from
        one thread (the daemon's event loop)."""
        self.api.record(method, route, code, seconds)

    def api_slot(self, method: str, route: str, code: int) -> _Slot:
        """What ``api_request`` updates for these labels: ``slot.record(seconds)``."""
        return self.api.slot(method, route, code)

    def mig_apply(self, ok: bool) -> None:
        self.mig_applies.inc()
        if not ok:
            self.mig_apply_failures.inc()

    def cdi_refresh(self, result: str) -> None:
        """``result``: written, unchanged or failed."""
        self.cdi_refreshes.labels(result).inc()

    def checkpoint_damage(self, records: int) -> None:
        self.checkpoint_unreadable.set(records)

    def health_event(self, kind: str, ignored: bool) -> None:
        self.health_events.labels(kind, "true" if ignored else "false").inc()

    def mps_daemon(self, device: str, up: bool, restarts: int = 0, restarted: bool = False) -> None:
        """The supervisor's view of one MPS daemon (``device``: the GPU or MIG UUID)."""
        self.mps_up.labels(device).set(1 if up else 0)
        counter = self.mps_restarts.labels(device)
        if restarted:
            counter.inc()

    def mps_daemon_gone(self, device: str) -> None:
        for family in (self.mps_up, self.mps_restarts):
            try:
                family.remove(device)
            except KeyError:
                pass

    def sample(self, seconds: float, nvml_calls: int, ok: bool = True) -> None:
        if ok:
            self.samples.inc()
            self.sample_seconds.set(seconds)
            self.sample_calls.set(nvml_calls)
        else:
            self.sample_errors.inc()

    def driver_verified(self, verdict) -> None:
        from ..driver.verdict import RESULTS
        self.driver_ready.set(1 if verdict.usable else 0)
        self.driver_verifications.labels("usable" if verdict.usable else "unusable").inc()
        for check in verdict.checks:
            for result in RESULTS:
                self.driver_checks.labels(check.name, result).set(1 if check.result == result else 0)

    def collectors(self, **success: bool | None) -> None:
        """What the page holds, set before each scrape is rendered: collector name -> whether
        it could be read (None: the collector is off, no series)."""
        for name, ok in success.items():
            if ok is None:
                try:
                    self.collector_success.remove(name)
                except KeyError:
                    pass
            else:
                self.collector_success.labels(name).set(1 if ok else 0)

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)
