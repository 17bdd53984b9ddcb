"""``StepHook``: step boundaries from inside the training loop, sent to the local perfd agent.

Contract with the training thread (DESIGN.md §4): a few µs of host time per step, never a device
synchronization, never an exception, never a wait when the agent is slow or gone.

- Step boundaries are CUDA events recorded on the current stream (``cuda=True``) or host
  ``perf_counter_ns`` stamps (``cuda=False``); one code path for both.
- Events are harvested with ``query()`` at later step ends, oldest first, and only when complete:
  the GPU typically runs a step or two behind the host, so step N is reported at step N+1 or N+2.
  Events come from a fixed pool; if the GPU falls ``pool_size`` steps behind, the oldest pending
  measurement is dropped and counted (``harvest_drops``) and its events reused.
- Back-to-back steps share a marker: when ``step_begin()`` comes within 2 µs of host time after
  the previous ``step_end()`` returned, no GPU work can have been enqueued in between (a launch
  alone takes longer), so the previous end event is this step's begin and no begin event is
  recorded; ``step_end()`` does not query the event it has just recorded (it cannot be done yet).
  With the CUDA driver fast path that leaves ~2 records, 1 query and 2 elapsed-time reads a step.
- Data wait is host time from ``step_begin()`` to ``data_ready()`` (the loader is a host-side
  wait); compute is the GPU time from the ``data_ready()`` event to the step's end event.
- The first ``warmup_steps`` steps are reported but flagged and left out of the rolling p50/p90/p99.
- Records (104-byte structs) are batched: one datagram every ``flush_interval_s`` or 32 records,
  whichever comes first. A Unix datagram receiver queues only ~10 datagrams (Linux
  ``net.unix.max_dgram_qlen``), and one ``sendto`` per step would cost a syscall per step; batching
  makes both small. ``flush_interval_s=0`` sends each record at once.
- Profile requests from the agent arrive on the same socket, polled at most every 50 ms at step
  begin; ``cudaProfilerStart()``/``cudaProfilerStop()`` run exactly at the requested step boundaries.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from perfd.hook import wire
from perfd.hook.sender import DatagramSender
from perfd.hook.timing import (
    CudaApi,
    HostMarker,
    Marker,
    MarkerFactory,
    RollingPercentiles,
    cuda_marker_factory,
)

ProfilerControl = tuple[Callable[[], Any], Callable[[], Any]]  # (start, stop)

_POLL_INTERVAL_NS = 50_000_000
# Host time after step_end() returned within which step_begin() may reuse its end marker: a
# Python loop iteration takes well under it, any torch op launch (3-20 µs measured) well over.
_ALIAS_GAP_NS = 2_000


class _Slot:
    """One step's markers and host stamps; slots are reused, never allocated per step."""

    __slots__ = ("alias_prev", "begin", "data", "data_event", "end", "has_data", "index", "profiling", "step",
                 "t_begin", "t_data", "wall_end_ns")

    def __init__(self, make: MarkerFactory) -> None:
        self.begin: Marker = make()
        self.data: Marker = make()
        self.end: Marker = make()
        self.step = 0
        self.index = 0
        self.t_begin = 0
        self.t_data = 0
        self.has_data = False
        self.data_event = False
        self.profiling = False
        self.wall_end_ns = 0
        # The previous step whose end marker is this step's begin (see StepHook._ALIAS_GAP_NS).
        self.alias_prev: _Slot | None = None


class _StepContext:
    __slots__ = ("_hook", "_step")

    def __init__(self, hook: StepHook) -> None:
        self._hook = hook
        self._step: int | None = None

    def __enter__(self) -> StepHook:
        self._hook.step_begin(self._step)
        return self._hook

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self._hook.step_end()
        else:
            self._hook.abandon_step()  # a step that raised is not a step time


class StepHook:
    """Use as ``with hook.step(): ...`` or ``step_begin()`` / ``data_ready()`` / ``step_end()``.

    Step numbers: pass ``step=`` (e.g. the optimizer step count, to join with other sources), or let
    the hook count from 1. ``socket_path`` defaults to ``$PERFD_HOOK_SOCKET`` or
    ``/tmp/perfd-hook.sock``. ``rank`` defaults to ``$RANK``, then ``torch.distributed.get_rank()``
    once initialised, else 0. ``marker_factory`` and ``profiler`` replace the CUDA events and the
    CUDA profiler API (tests, other accelerators).
    """

    def __init__(self, socket_path: str | None = None, warmup_steps: int = 5,
                 tokens_per_step: float | None = None, flops_per_step: float | None = None,
                 cuda: bool = True, *, rank: int | None = None, window: int = 100, pool_size: int = 16,
                 marker_factory: MarkerFactory | None = None, profiler: ProfilerControl | None = None,
                 enabled: bool | None = None, flush_interval_s: float = 0.1, batch_records: int = 32,
                 cuda_data_event: bool = True) -> None:
        if pool_size < 2:
            raise ValueError("pool_size must be >= 2")
        self.enabled = (os.environ.get("PERFD_HOOK_DISABLE", "") not in ("1", "true")
                        if enabled is None else enabled)
        self.warmup_steps = max(0, warmup_steps)
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.pid = os.getpid()
        self.stats = RollingPercentiles(window)
        # counters (plain ints: a dict update per step costs more)
        self.steps_begun = 0
        self.steps_reported = 0
        self.harvest_drops = 0
        self.unpaired = 0
        self.internal_errors = 0
        self.last_error: str | None = None
        self.cuda = False
        self._torch: Any = None
        self.cuda_api: CudaApi | None = None
        make: MarkerFactory = HostMarker
        if marker_factory is not None:
            make = marker_factory
            self.cuda = cuda
        elif cuda and self.enabled:
            torch = _import_torch()
            if torch is not None and torch.cuda.is_available():
                self._torch = torch
                use_driver = os.environ.get("PERFD_HOOK_CUDA_API", "auto") != "torch"
                self.cuda_api = CudaApi(torch, use_driver=use_driver)
                make = cuda_marker_factory(self.cuda_api)
                self.cuda = True
            else:
                self.last_error = "cuda requested but not available: host timing"
        self._flags = wire.FLAG_CUDA if self.cuda else 0
        # A third event per step gives the GPU time from data_ready() to the step's end (compute).
        # It costs one record (~2-3 µs of host time with CUDA): cuda_data_event=False saves it,
        # and compute is then absent (data wait, a host time, is still measured).
        self._data_event = cuda_data_event or not self.cuda
        self._rank = rank if rank is not None else _env_rank()
        self._pool_size = pool_size
        self._free: list[_Slot] = [_Slot(make) for _ in range(pool_size)] if self.enabled else []
        self._pending: deque[_Slot] = deque()
        self._cur: _Slot | None = None
        self._next_step = 1
        self._ctx = _StepContext(self)
        self._profiler = profiler
        self._req: wire.ProfileRequest | None = None
        self._profiling = False
        self._profile_stop = 0
        self._profile_id = 0
        # Host markers cost ~0.1 µs and are always done: neither saving is worth it there.
        self._alias = self.cuda
        self._keep_newest = 1 if self.cuda else 0
        self._end_returned = 0
        self.alias_misses = 0
        self._next_poll = 0
        self.sender = DatagramSender(socket_path or wire.socket_path_from_env())
        self._batch = bytearray()
        self._batch_n = 0
        self._batch_max = max(1, batch_records)
        self._flush_ns = int(flush_interval_s * 1e9)
        self._flush_at = time.perf_counter_ns() + self._flush_ns

    # ------------------------------------------------------------------------------- public

    def step(self, step: int | None = None) -> _StepContext:
        """``with hook.step(): ...``: begin on enter, end on exit (abandoned if the body raises)."""
        self._ctx._step = step
        return self._ctx

    def step_begin(self, step: int | None = None) -> None:
        if not self.enabled:
            return
        try:
            if self._cur is not None:  # begin twice without an end: the previous one is dropped
                self.unpaired += 1
                self.abandon_step()
            n = self._next_step if step is None else step
            self._next_step = n + 1
            if self._rank is None:
                self._resolve_rank()
            now = time.perf_counter_ns()
            if now >= self._next_poll:
                self._next_poll = now + _POLL_INTERVAL_NS
                self._poll_control(n)
            was_profiling = self._profiling
            if self._req is not None and n >= self._req.start_step:
                self._start_profile(n)
            slot = self._free.pop() if self._free else self._reuse_oldest()
            slot.step = n
            slot.index = self.steps_begun
            self.steps_begun += 1
            slot.has_data = False
            slot.profiling = self._profiling
            slot.t_begin = time.perf_counter_ns()
            pending = self._pending
            if (self._alias and pending and now - self._end_returned < _ALIAS_GAP_NS
                    and was_profiling == self._profiling):
                slot.alias_prev = pending[-1]  # its end marker becomes ours at its harvest
            else:
                slot.alias_prev = None
                slot.begin.record()
            self._cur = slot
        except Exception as exc:  # never into the training loop
            self._internal(exc)

    def data_ready(self) -> None:
        """The batch is on hand: what came before was data wait, what follows is compute."""
        slot = self._cur
        if slot is None or slot.has_data or not self.enabled:
            return
        try:
            slot.t_data = time.perf_counter_ns()
            if self._data_event:
                slot.data.record()
            slot.data_event = self._data_event
            slot.has_data = True
        except Exception as exc:
            self._internal(exc)

    def step_end(self) -> None:
        slot = self._cur
        if not self.enabled:
            return
        if slot is None:
            self.unpaired += 1
            return
        try:
            self._cur = None
            slot.end.record()
            slot.wall_end_ns = time.time_ns()
            self._pending.append(slot)
            if self._profiling and slot.step >= self._profile_stop:
                self._stop_profile(slot.step, wire.PROFILE_STOPPED)
            self._harvest(keep=self._keep_newest)  # a CUDA end just recorded cannot be done yet
        except Exception as exc:
            self._internal(exc)
        self._end_returned = time.perf_counter_ns()

    def abandon_step(self) -> None:
        """Forget the open step (it raised, or the loop ended between begin and end)."""
        if self._cur is not None:
            self._cur.alias_prev = None
            self._free.append(self._cur)
            self._cur = None

    def harvest(self) -> int:
        """Report every finished step, oldest first, without waiting. Returns how many."""
        return self._harvest(keep=0)

    def _harvest(self, keep: int) -> int:
        done = 0
        pending = self._pending
        while len(pending) > keep:
            slot = pending[0]
            if not slot.end.query():
                break  # later steps on the same stream cannot be done either
            pending.popleft()
            try:
                self._report(slot)
                done += 1
            finally:
                self._hand_over(slot)
                self._free.append(slot)
        return done

    def _hand_over(self, prev: _Slot) -> None:
        """``prev`` leaves: a step that uses its end marker as begin takes the marker (swap)."""
        for nxt in (self._pending[0] if self._pending else None, self._cur):
            if nxt is not None and nxt.alias_prev is prev:
                nxt.begin, prev.end = prev.end, nxt.begin
                nxt.alias_prev = None
                return

    def close(self, timeout_s: float = 0.0) -> None:
        """End of training: harvest what is done (waiting up to ``timeout_s`` by polling, never
        a device sync), stop a running profile range, close the socket."""
        if not self.enabled:
            self.sender.close()
            return
        try:
            deadline = time.monotonic() + timeout_s
            self.harvest()
            while self._pending and time.monotonic() < deadline:
                time.sleep(0.001)
                self.harvest()
            if self._profiling:
                self._stop_profile(self._next_step - 1, wire.PROFILE_STOPPED)
            self.flush()
        except Exception as exc:
            self._internal(exc)
        self.sender.close()

    def counters(self) -> dict[str, Any]:
        return {"steps_begun": self.steps_begun, "steps_reported": self.steps_reported,
                "pending": len(self._pending), "batched": self._batch_n, "harvest_drops": self.harvest_drops,
                "unpaired": self.unpaired, "internal_errors": self.internal_errors,
                "alias_misses": self.alias_misses,
                "sent": self.sender.sent, "send_drops": self.sender.dropped,
                "send_drop_reasons": dict(self.sender.drops), "cuda": self.cuda,
                "profiling": self._profiling, "last_error": self.last_error,
                "cuda_api": self.cuda_api.name if self.cuda_api else None,
                "cuda_driver_errors": self.cuda_api.driver_errors if self.cuda_api else 0}

    # ------------------------------------------------------------------------------- internals

    def _internal(self, exc: BaseException) -> None:
        self.internal_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def _reuse_oldest(self) -> _Slot:
        # The GPU (or harvesting) is pool_size steps behind: give up the oldest measurement.
        self.harvest_drops += 1
        slot = self._pending.popleft()
        self._hand_over(slot)
        return slot

    def _report(self, slot: _Slot) -> None:
        # The hot path of every step: locals only, no allocation beyond the packed bytes.
        if slot.alias_prev is not None:  # its begin marker never arrived (should not happen)
            self.alias_misses += 1
            slot.alias_prev = None
            return
        step_ns = slot.begin.elapsed_ns(slot.end)
        flags = self._flags
        data_ns = compute_ns = -1
        if slot.has_data:
            flags |= wire.FLAG_HAS_DATA
            data_ns = slot.t_data - slot.t_begin
            if slot.data_event:
                compute_ns = slot.data.elapsed_ns(slot.end)
        if slot.profiling:
            flags |= wire.FLAG_PROFILING
        stats = self.stats
        if slot.index < self.warmup_steps:
            flags |= wire.FLAG_WARMUP
        else:
            stats.add(step_ns)
        pct = stats.p50_p90_p99()
        p50, p90, p99 = pct if pct is not None else (-1, -1, -1)
        tokens, flops = self.tokens_per_step, self.flops_per_step
        rank = self._rank
        self._batch += _STEP_PACK(
            _VERSION, _KIND_STEP, flags, rank if rank is not None else -1, self.pid, slot.step,
            slot.wall_end_ns, step_ns, data_ns, compute_ns, p50, p90, p99, len(stats),
            self.sender.dropped & 0xFFFFFFFF, self.harvest_drops & 0xFFFFFFFF,
            _NAN if tokens is None else tokens, _NAN if flops is None else flops)
        self.steps_reported += 1
        self._batch_n += 1
        if self._batch_n >= self._batch_max or time.perf_counter_ns() >= self._flush_at:
            self.flush()

    def flush(self) -> None:
        """Send the batched records now (one datagram). Never blocks or raises."""
        if self._batch_n:
            self.sender.send(bytes(self._batch), self._batch_n)
            self._batch.clear()
            self._batch_n = 0
        self._flush_at = time.perf_counter_ns() + self._flush_ns

    def _resolve_rank(self) -> None:
        # At the first step: by then a distributed job has initialised its process group (the
        # model is wrapped before the loop). Without one and without $RANK: a single process, 0.
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self._rank = int(dist.get_rank())
        except Exception:
            pass
        if self._rank is None:
            self._rank = 0

    # profile control --------------------------------------------------------------------

    def _status(self, state: int, request_id: int, step: int) -> None:
        rank = -1 if self._rank is None else self._rank
        status = wire.ProfileStatus(state, rank, self.pid, request_id, step)
        self.sender.send(wire.pack_profile_status(status))

    def _poll_control(self, next_step: int) -> None:
        for _ in range(8):  # bounded: a flood of requests must not stall a step
            msg = self.sender.recv()
            if msg is None:
                return
            kind = wire.kind_of(msg)
            if kind not in (wire.KIND_PROFILE_REQUEST, wire.KIND_PROFILE_CANCEL) \
                    or len(msg) != wire.PROFILE_REQUEST.size:
                continue
            req = wire.unpack_profile_request(msg)
            if req.cancel:
                self._cancel(next_step)
            elif self._req is not None or self._profiling or req.num_steps <= 0 \
                    or self._profiler_fns() is None:
                self._status(wire.PROFILE_REJECTED, req.request_id, req.start_step)
            else:
                # A start step already passed begins at the next boundary (the status says which).
                req.start_step = max(req.start_step, next_step)
                self._req = req
                self._status(wire.PROFILE_ACCEPTED, req.request_id, req.start_step)

    def _cancel(self, next_step: int) -> None:
        if self._req is not None:
            self._status(wire.PROFILE_CANCELLED, self._req.request_id, next_step)
            self._req = None
        elif self._profiling:
            self._stop_profile(next_step - 1, wire.PROFILE_CANCELLED)

    def _profiler_fns(self) -> ProfilerControl | None:
        if self._profiler is None and self._torch is not None:
            try:
                cudart = self._torch.cuda.cudart()
                self._profiler = (cudart.cudaProfilerStart, cudart.cudaProfilerStop)
            except Exception as exc:
                self._internal(exc)
        return self._profiler

    def _start_profile(self, step: int) -> None:
        req, self._req = self._req, None
        assert req is not None
        fns = self._profiler_fns()
        try:
            if fns is None:
                raise RuntimeError("no profiler control")
            _check(fns[0]())
        except Exception as exc:
            self._internal(exc)
            self._status(wire.PROFILE_FAILED, req.request_id, step)
            return
        self._profiling = True
        self._profile_stop = step + req.num_steps - 1
        self._profile_id = req.request_id
        self._status(wire.PROFILE_STARTED, req.request_id, step)

    def _stop_profile(self, step: int, state: int) -> None:
        self._profiling = False
        fns = self._profiler_fns()
        try:
            if fns is not None:
                _check(fns[1]())
        except Exception as exc:
            self._internal(exc)
            state = wire.PROFILE_FAILED
        self._status(state, self._profile_id, step)


_NAN = float("nan")
_STEP_PACK = wire.STEP.pack
_VERSION = wire.VERSION
_KIND_STEP = wire.KIND_STEP


def _check(rc: Any) -> None:
    """cudart calls return a cudaError (0 = success); other controls return None."""
    code = getattr(rc, "value", rc)
    if isinstance(code, int) and code != 0:
        raise RuntimeError(f"CUDA profiler API returned error {code}")


def _env_rank() -> int | None:
    # torchrun, SLURM, Open MPI, MPICH/PMI: the global rank, set before the process starts.
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        try:
            return int(os.environ[var])
        except (KeyError, ValueError):
            continue
    return None


def _import_torch() -> Any:
    """torch, imported only when a CUDA hook is created (perfd itself never requires it)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None
