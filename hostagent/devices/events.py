"""The NVML event edge: one event set, registered per GPU, waited on with bounded timeouts.

This is the only module that touches NVML event handles. What leaves it are ``RawEvent``
records (plain facts: which GPU, which kind, which XID, which instance); health policy
lives in ``hostagent.health``.

Failures are never silent: a GPU whose registration fails becomes an ``unmonitored``
record (``NOT_SUPPORTED`` included: masking by the supported types does not catch every
board that refuses), a lost GPU a ``gpu_lost`` record, after which the set is rebuilt
without it so waits do not keep failing. ``retry_lost()`` registers a lost GPU again once
NVML can read it (after a GPU reset), so it is watched again.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from dataclasses import dataclass
from typing import Iterable

import pynvml as N

from ..hostroot import HostRoot
from .reader import nvml_session

__all__ = ["RawEvent", "EventSource", "XID", "ECC_DBE", "GPU_LOST", "UNMONITORED", "KINDS"]

log = logging.getLogger(__name__)

XID, ECC_DBE, GPU_LOST, UNMONITORED = "xid", "ecc_dbe", "gpu_lost", "unmonitored"
KINDS = (XID, ECC_DBE, GPU_LOST, UNMONITORED)

WANTED = N.nvmlEventTypeXidCriticalError | N.nvmlEventTypeDoubleBitEccError
_NOT_APPLICABLE = 0xFFFFFFFF
_REBUILD_AFTER = 3            # consecutive unexpected wait errors before the set is rebuilt


# hostagent.devices.events.EventSource.open() / .wait()
@dataclass(frozen=True)
class RawEvent:
    kind: str                    # xid | ecc_dbe | gpu_lost | unmonitored
    gpu: int                     # NVML index of the physical GPU
    uuid: str | None             # None when NVML could not tell (an unreadable GPU)
    at: float                    # time.time() when hostagent received it
    xid: int | None = None
    gi: int | None = None        # None: GPU-wide (NVML's 0xFFFFFFFF)
    ci: int | None = None
    detail: str = ""             # why, for gpu_lost and unmonitored


@dataclass
class _Registered:
    index: int
    uuid: str
    handle: object
    mask: int


def _instance(value: int) -> int | None:
    return None if value == _NOT_APPLICABLE else value


def _address(handle) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class EventSource:
    """Owns an NVML session and one event set for the GPUs NVML lists.

    ``open()`` registers every GPU and returns records for those it could not (unmonitored,
    or gpu_lost); ``wait(timeout_ms)`` returns the events that arrived, ``()`` on timeout;
    ``close()`` frees the set and ends the session. Use as a context manager.

    ``lost``: GPUs already known lost (from an earlier session): not registered nor
    reported again at ``open()``, only retried by ``retry_lost()``.
    """

    def __init__(self, host: HostRoot, *, clock=time.time, lost: Iterable[int] = ()):
        self.host = host
        self.clock = clock
        self._stack: contextlib.ExitStack | None = None
        self._set = None
        self._gpus: dict[int, _Registered] = {}       # handle address -> registration
        self._lost: set[int] = set(lost)
        self._failures = 0
        self.generation = 0       # bumped at every (re)registration; see ``registered``

    # ---- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> "EventSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def lost(self) -> frozenset[int]:
        """Indices of the GPUs known lost (not registered)."""
        return frozenset(self._lost)

    @property
    def registered(self) -> dict[int, str]:
        """GPU index -> UUID of every GPU whose events this set receives (re-read it when
        ``generation`` changes: a wait may rebuild the set)."""
        return {r.index: r.uuid for r in self._gpus.values()}

    def open(self) -> tuple[RawEvent, ...]:
        """Start the session and register; raises hostagent errors when NVML cannot start."""
        stack = contextlib.ExitStack()
        stack.enter_context(nvml_session(self.host))
        self._stack = stack
        try:
            return self._build()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._free()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _free(self) -> None:
        if self._set is not None:
            try:
                N.nvmlEventSetFree(self._set)
            except N.NVMLError as e:
                log.debug("nvmlEventSetFree: %s", e)
            self._set = None
        self._gpus.clear()

    def _build(self) -> tuple[RawEvent, ...]:
        """Create the set and register each GPU not known lost; report what failed."""
        self._free()
        self.generation += 1
        self._set = N.nvmlEventSetCreate()
        out = []
        for index in range(N.nvmlDeviceGetCount()):
            if index in self._lost:
                continue
            out += self._register(index)
        return tuple(out)

    def _rebuild(self, why: str) -> tuple[RawEvent, ...]:
        known = [(r.index, r.uuid) for r in self._gpus.values()]
        try:
            return self._build()
        except N.NVMLError as e:
            now = self.clock()
            self._free()
            return tuple(RawEvent(UNMONITORED, index, uuid, now, detail=f"{why}: {e}")
                         for index, uuid in known)

    def _register(self, index: int) -> list[RawEvent]:
        now = self.clock()
        try:
            handle = N.nvmlDeviceGetHandleByIndex(index)
            uuid = N.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                self._lost.add(index)
                return [RawEvent(GPU_LOST, index, None, now, detail=str(e))]
            return [RawEvent(UNMONITORED, index, None, now, detail=f"cannot open the GPU: {e}")]
        try:
            supported = N.nvmlDeviceGetSupportedEventTypes(handle)
        except N.NVMLError as e:
            return [RawEvent(UNMONITORED, index, uuid, now, detail=f"supported event types: {e}")]
        mask = supported & WANTED
        if not mask & N.nvmlEventTypeXidCriticalError:
            return [RawEvent(UNMONITORED, index, uuid, now,
                             detail="the GPU does not report XID events")]
        try:
            N.nvmlDeviceRegisterEvents(handle, mask, self._set)
        except N.NVMLError as e:
            # NOT_SUPPORTED included: the device plugin skips such GPUs silently; here they
            # stay visible as unmonitored.
            return [RawEvent(UNMONITORED, index, uuid, now, detail=f"event registration: {e}")]
        if not mask & N.nvmlEventTypeDoubleBitEccError:
            log.info("GPU %d reports no ECC events; XIDs only", index)   # boards without ECC
        self._gpus[_address(handle)] = _Registered(index, uuid, handle, mask)
        return []

    def retry_lost(self) -> tuple[RawEvent, ...]:
        """Register the lost GPUs NVML can read again (``generation`` grows if any is
        watched again). A GPU still lost is not reported again; one readable but refusing
        registration becomes ``unmonitored`` and is not retried."""
        if self._stack is None or self._set is None or not self._lost:
            return ()
        out, back = [], False
        for index in sorted(self._lost):
            self._lost.discard(index)
            records = self._register(index)        # puts a still-lost GPU back in _lost
            if index in self._lost:
                continue
            back = back or not records
            out += records
        if back:
            self.generation += 1
        return tuple(out)

    # ---- waiting ---------------------------------------------------------------------

    def wait(self, timeout_ms: int) -> tuple[RawEvent, ...]:
        """Events that arrived within ``timeout_ms`` (at most one NVML event, or the records
        a lost GPU produces); ``()`` on timeout. Never blocks longer than the timeout plus
        one NVML call per registered GPU."""
        if self._stack is None:
            raise RuntimeError("EventSource.wait() before open()")
        if self._set is None:                  # a rebuild failed: retry once per timeout
            time.sleep(timeout_ms / 1000)
            try:
                return self._build()
            except N.NVMLError as e:
                log.debug("rebuilding the event set: %s", e)
                self._free()
                return ()
        if not self._gpus:
            time.sleep(timeout_ms / 1000)      # nothing registered: nothing to wait for
            return ()
        try:
            data = N.nvmlEventSetWait_v2(self._set, timeout_ms)
        except N.NVMLError as e:
            if e.value == N.NVML_ERROR_TIMEOUT:
                self._failures = 0
                return ()
            if e.value == N.NVML_ERROR_GPU_IS_LOST:
                return self._gpu_lost(str(e))
            return self._wait_failed(e, timeout_ms)
        self._failures = 0
        return self._convert(data)

    def _convert(self, data) -> tuple[RawEvent, ...]:
        now = self.clock()
        reg = self._gpus.get(_address(data.device))
        if reg is None:
            # The DRA driver's rule: an event from a device we cannot place means we can no
            # longer trust any of them.
            return self._gpu_lost("an event came from a device that is not registered")
        gi, ci = _instance(data.gpuInstanceId), _instance(data.computeInstanceId)
        if data.eventType & N.nvmlEventTypeXidCriticalError:
            return (RawEvent(XID, reg.index, reg.uuid, now, xid=int(data.eventData), gi=gi, ci=ci),)
        if data.eventType & N.nvmlEventTypeDoubleBitEccError:
            return (RawEvent(ECC_DBE, reg.index, reg.uuid, now, gi=gi, ci=ci),)
        log.debug("ignoring NVML event type %#x on GPU %d", data.eventType, reg.index)
        return ()

    def _gpu_lost(self, why: str) -> tuple[RawEvent, ...]:
        """Find which GPUs are lost (a wait does not say), report them, rebuild without them."""
        now = self.clock()
        lost = []
        for reg in list(self._gpus.values()):
            try:
                N.nvmlDeviceGetMemoryInfo(reg.handle)     # any call on a lost GPU fails so
            except N.NVMLError as e:
                if e.value == N.NVML_ERROR_GPU_IS_LOST:
                    lost.append(reg)
        if not lost:
            lost = list(self._gpus.values())          # NVML will not say which: all of them
        self._lost.update(r.index for r in lost)
        for r in lost:
            del self._gpus[_address(r.handle)]
        out = tuple(RawEvent(GPU_LOST, r.index, r.uuid, now, detail=why) for r in lost)
        return out + self._rebuild("rebuilding the event set without the lost GPU")

    def _wait_failed(self, error, timeout_ms: int) -> tuple[RawEvent, ...]:
        self._failures += 1
        log.warning("nvmlEventSetWait failed (%d in a row): %s", self._failures, error)
        time.sleep(min(timeout_ms / 1000, 0.1 * 2 ** self._failures))   # no busy loop
        if self._failures < _REBUILD_AFTER:
            return ()
        self._failures = 0
        return self._rebuild("rebuilding the event set after wait errors")
