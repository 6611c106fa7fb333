"""One sampling schedule for every scrape: a thread reads NVML every ``interval`` seconds into
an immutable snapshot; scrapes render the last snapshot and never call NVML, so many
scrapers (or a fast one) cost no more NVML calls than one.

Rates (GPM's profiling metrics, NVLink bandwidth) come from two reads. When a read had
devices without an earlier one (the first, or new GPU instances after a MIG change), the
next comes ``WARMUP`` seconds later rather than an interval later, and ``start`` waits for
it, so the first page already has them."""

from __future__ import annotations

import logging
import threading

from ..errors import HostagentError
from ..hostroot import HostRoot

__all__ = ["MetricsSampler"]

log = logging.getLogger("hostagent.metrics")

WARMUP = 0.2            # seconds to a device's second read (GPM needs its samples 100 ms apart)


class MetricsSampler:
    def __init__(self, host: HostRoot, inventory, interval: float = 10.0, *, agent=None):
        self.host = host
        self.interval = interval
        self.agent = agent
        self._inventory = inventory
        self._reader = None
        self._snapshot = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self):
        """The last ``NodeSample`` (None before the first one)."""
        return self._snapshot

    def start(self, *, wait: float | None = 10.0) -> None:
        """Start sampling; by default return after the first sample, so the first scrape has data."""
        if self._thread is not None:
            raise RuntimeError("the metrics sampler is already running")
        self._stop.clear()
        self._first.clear()
        self._snapshot = None            # a restarted sampler serves nothing older than itself
        self._thread = threading.Thread(target=self._run, name="hostagent-metrics", daemon=True)
        self._thread.start()
        if wait:
            self._first.wait(wait)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def update_inventory(self, inventory) -> None:
        """New devices (a MIG change): sample them from the next turn, which comes now."""
        with self._lock:
            self._inventory = inventory
        self._wake.set()

    def _current_reader(self):
        """The reader of the current inventory (a new one, carrying the old one's rates over,
        after a change)."""
        from ..devices.samples import SampleReader
        with self._lock:
            if self._reader is None or self._reader.inventory is not self._inventory:
                self._reader = SampleReader(self._inventory, previous=self._reader)
            return self._reader

    def _run(self) -> None:
        from ..devices import nvml_session
        while not self._stop.is_set():
            try:
                with nvml_session(self.host):
                    try:
                        self._loop()
                    finally:
                        self._close_reader()
            except HostagentError as e:
                log.warning("metrics sampling: %s", e.message)
                self._failed()
            except Exception:
                log.exception("metrics sampling failed")
                self._failed()
            self._first.set()
            self._stop.wait(self.interval)      # NVML unavailable: try again next interval

    def _failed(self) -> None:
        # No sample: scrapes show no GPU series (and the error counter) rather than old values.
        self._snapshot = None
        with self._lock:
            self._reader = None          # its handles belong to the session that failed
        if self.agent is not None:
            self.agent.sample(0.0, 0, ok=False)

    def _close_reader(self) -> None:
        """Let go of what NVML holds for the reader (GPM buffers) before the session ends."""
        with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def _loop(self) -> None:
        warmups = 0
        while not self._stop.is_set():
            sample = self._current_reader().read()
            self._snapshot = sample                       # one reference swap: readers never lock
            if self.agent is not None:
                self.agent.sample(sample.duration_s, sample.nvml_calls)
            warmups = warmups + 1 if sample.pending else 0
            if warmups != 1:                              # at most one quick read in a row
                self._first.set()
            self._wake.clear()
            pause = WARMUP if warmups == 1 else self.interval
            self._wake.wait(max(0.0, pause - sample.duration_s))

    def sample_now(self):
        """Take a sample in the caller's thread (tests, benchmarks); also becomes the snapshot."""
        from ..devices import nvml_session
        with nvml_session(self.host):
            self._snapshot = self._current_reader().read()
        return self._snapshot
