"""hostagent's own metrics: prometheus_client collectors in a registry of their own, with
one method per thing the daemon counts."""

from __future__ import annotations

__all__ = ["AgentMetrics"]

# API latency buckets: a cached GET answers in well under a millisecond, a MIG apply in seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class AgentMetrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.api_requests = Counter("hostagent_api_requests", "API requests answered.",
                                    ["method", "route", "code"], registry=r)
        self.api_latency = Histogram("hostagent_api_request_duration_seconds",
                                     "Time to answer an API request (streams: to the first byte).",
                                     ["method", "route"], buckets=_LATENCY_BUCKETS, registry=r)
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
        self._api_children: dict = {}

    # ---- what the daemon calls -------------------------------------------------------

    def api_request(self, method: str, route: str, code: int, seconds: float) -> None:
        """``route`` is the route pattern ("/v1/devices/{id}"), never the raw path."""
        # Children cached per label set: .labels() costs ~3 us, a third of a cached GET.
        key = (method, route, code)
        children = self._api_children.get(key)
        if children is None:
            children = self._api_children[key] = (self.api_requests.labels(method, route, str(code)),
                                                  self.api_latency.labels(method, route))
        children[0].inc()
        children[1].observe(seconds)

    def mig_apply(self, ok: bool) -> None:
        self.mig_applies.inc()
        if not ok:
            self.mig_apply_failures.inc()

    def cdi_refresh(self, result: str) -> None:
        """``result``: written, unchanged or failed."""
        self.cdi_refreshes.labels(result).inc()

    def health_event(self, kind: str, ignored: bool) -> None:
        self.health_events.labels(kind, "true" if ignored else "false").inc()

    def sample(self, seconds: float, nvml_calls: int, ok: bool = True) -> None:
        if ok:
            self.samples.inc()
            self.sample_seconds.set(seconds)
            self.sample_calls.set(nvml_calls)
        else:
            self.sample_errors.inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)
