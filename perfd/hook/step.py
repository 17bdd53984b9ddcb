"""``StepHook``: step boundaries from inside the training loop, sent to the local perfd agent.

Contract with the training thread (DESIGN.md §4): at most ~10 µs of host time per step, never a
device synchronization, never an exception, never a wait when the agent is slow or gone.

The step path, with CUDA events: ``step_begin()`` takes a ``perf_counter_ns`` (and polls for
profile requests at most every 50 ms); ``data_ready()`` a ``perf_counter_ns`` (data wait is host
time); ``step_end()`` records one event (``cuEventRecord``, a cached ctypes function pointer),
reads ``time.time_ns()`` and appends the step to a deque bounded at ``pool_size``. Nothing is
queried, measured, encoded or sent there. One event marks each step boundary: a ``step_begin()``
within 2 µs of host time after the last ``step_end()`` returned (too soon for any GPU work to be
enqueued) takes that end event as its begin; after a real gap a begin event is recorded. When the
deque is full the oldest pending step is dropped and counted (``harvest_drops``), or this one if
the harvester is in a pass right then (the step path never waits for it). ``cuda_data_event=True``
adds an event at ``data_ready()``, for the GPU time from there to the end (compute). It is off by
default: a record costs ~3.4 µs on an H100 host, a third of the budget, for one field nothing
downstream uses (host timing always reports compute).

A step's events and stamps live in a reusable slot; there are ``pool_size + 2`` (pending, open,
held), so one is free while the deque has room. torch creates an event at its first record: the
hook records every slot's events once at the first ``step_begin()``, so no step creates one.

The harvester, a daemon thread (``perfd-hook-harvest``), wakes every ``harvest_interval_s`` (50 ms)
or when the deque is half full. Events on one stream complete in order: one ``query()`` on the
newest pending end event settles all older ones (when the GPU is behind it, a galloping search back
from the newest takes a few). Then per step the elapsed times, percentiles, the 104-byte struct,
and datagrams of up to 32 records, one at least every ``flush_interval_s`` (a Unix datagram
receiver queues only ~10, ``net.unix.max_dgram_qlen``). The thread first makes the training
thread's CUDA context current (``cuCtxSetCurrent``) and takes the thread-local stream-capture mode
(so that its queries cannot break a CUDA graph capture on the training thread). Its work takes
the GIL (its driver calls keep it, as torch's do: ``timing._load_driver``), so in a GIL-bound loop
it runs when the loop releases the GIL (any torch op does) or after ``sys.getswitchinterval()``;
``counters()["harvest_cpu_ns"]`` is its cost. It holds a weak reference to the hook and ends at
``close()``, at interpreter exit (atexit) or when the hook is garbage; a forked child has none
(``_after_fork_in_child``).

Harvesting stays inline in ``step_end()`` where a thread buys nothing: host timing (``cuda=False``
or no GPU: no query to save, and the GIL would serialize the record's few µs of Python with the
loop anyway) and ``flush_interval_s=0`` (each record sent at once: tests, debugging).
``harvest_interval_s=0`` forces inline, ``> 0`` the thread. Inline, a CUDA end event is not queried
by the ``step_end()`` that recorded it (it cannot be done): step N is reported at step N+1 or N+2.

The first ``warmup_steps`` steps are reported but flagged and left out of the rolling p50/p90/p99.
Profile requests are polled on the training thread, which calls ``cudaProfilerStart()``/
``cudaProfilerStop()`` exactly at the requested step boundaries; statuses go out with the next pass.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from perfd.hook import lifecycle, wire
from perfd.hook.jobinfo import check_layout, job_msg
from perfd.hook.sender import DatagramSender
from perfd.hook.timing import (
    CudaApi,
    HostMarker,
    Marker,
    MarkerFactory,
    RollingPercentiles,
    cuda_marker_factory,
)
from perfd.model import ModelSpec

ProfilerControl = tuple[Callable[[], Any], Callable[[], Any]]  # (start, stop)

_POLL_INTERVAL_NS = 50_000_000
# Host time after step_end() returned within which step_begin() may reuse its end marker: a
# Python loop iteration takes well under it, any torch op launch (3-20 µs measured) well over.
_ALIAS_GAP_NS = 2_000
_HARVEST_INTERVAL_S = 0.05
_JOB_INTERVAL_NS = 60_000_000_000  # the job record again: an agent restarted since learns it
# The longest anything waits for the harvester: a pass holds the lock for µs to a few ms; a pass
# stuck in the driver must not hang close() or flush().
_LOCK_TIMEOUT_S = 1.0
_JOIN_TIMEOUT_S = 2.0


class _Slot:
    """One step's events and host stamps; slots are reused, never allocated per step.

    Hand-over between the threads: the training thread writes a slot taken from the free deque
    and appends it to the pending deque at step_end(), never touching it again; the harvester
    reads it from there and puts it back on the free deque. A slot whose begin is the previous
    step's end (``prev``) needs that slot's end intact: the harvester keeps the last slot it read
    (``_held``) until it has read the next one, and the training thread only aliases the last
    slot it appended, so the slot referred to is always pending or held, never free.
    """

    __slots__ = ("begin", "data", "data_event", "end", "index", "prev", "profiling", "step", "t_begin",
                 "t_data", "wall_end_ns")

    def __init__(self, make: MarkerFactory, data_event: bool) -> None:
        self.begin: Marker = make()
        self.end: Marker = make()
        self.data: Marker | None = make() if data_event else None
        self.step = 0
        self.index = 0
        self.prev: _Slot | None = None  # the step whose end event is this one's begin
        self.t_begin = 0
        self.t_data = -1  # host stamp of data_ready(), -1 when not called
        self.data_event = False  # the data event was recorded in this step
        self.profiling = False
        self.wall_end_ns = 0

    def markers(self) -> list[Marker]:
        return [m for m in (self.begin, self.end, self.data) if m is not None]


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
    ``<runtime dir>/hook.sock`` (:func:`perfd.hook.wire.default_socket_path`).
    ``rank`` defaults to ``$RANK``, then ``torch.distributed.get_rank()``
    once initialised, else 0. ``marker_factory`` and ``profiler`` replace the CUDA events and the
    CUDA profiler API (tests, other accelerators). ``pool_size``: steps that may wait to be
    harvested. ``harvest_interval_s``: see the module docstring (None: the thread with CUDA events
    and batching, else inline).

    ``tokens_per_step`` and ``flops_per_step`` are the whole job's per step (all ranks, as Megatron
    counts an iteration): MFU = flops_per_step ÷ (step time · world size · peak). Without
    ``flops_per_step``, ``model=`` (a :class:`perfd.model.ModelSpec` or a mapping of its fields:
    num_layers, hidden_size, ffn_hidden_size, num_attention_heads, kv_channels, num_query_groups,
    seq_length, padded_vocab_size, swiglu, ...) counts it from ``tokens_per_step`` with perfd's
    formula (the one used for Megatron-LM, DESIGN.md §2), once, here. ``dtype`` (the training dtype:
    bf16, fp16, fp8, fp32; it picks the peak), ``layout`` (named sizes: world_size, tp, pp, dp, cp,
    ep) and ``mesh`` (a DeviceMesh) tell the agent about the job: perfd.hook.jobinfo.
    """

    def __init__(self, socket_path: str | None = None, warmup_steps: int = 5,
                 tokens_per_step: float | None = None, flops_per_step: float | None = None,
                 cuda: bool = True, *, rank: int | None = None, window: int = 100, pool_size: int = 256,
                 marker_factory: MarkerFactory | None = None, profiler: ProfilerControl | None = None,
                 enabled: bool | None = None, flush_interval_s: float = 0.1, batch_records: int = 32,
                 cuda_data_event: bool = False, harvest_interval_s: float | None = None,
                 model: ModelSpec | Mapping[str, Any] | None = None, dtype: str | None = None,
                 layout: Mapping[str, int] | None = None, mesh: Any = None) -> None:
        if pool_size < 2:
            raise ValueError("pool_size must be >= 2")
        if harvest_interval_s is not None and harvest_interval_s < 0:
            raise ValueError("harvest_interval_s must be >= 0")
        self.enabled = (os.environ.get("PERFD_HOOK_DISABLE", "") not in ("1", "true")
                        if enabled is None else enabled)
        self.warmup_steps = max(0, warmup_steps)
        self.tokens_per_step = tokens_per_step
        if flops_per_step is None and tokens_per_step is not None and model is not None:
            from perfd.analytics.flops import flops_for_tokens  # only then: the loop imports no analytics

            flops_per_step = flops_for_tokens(model, tokens_per_step)
        self.flops_per_step = flops_per_step
        self.dtype, self.layout, self.mesh = dtype, check_layout(layout), mesh
        self._job_due_ns = 0  # the job record goes out with the first flush, then every minute
        self.pid = os.getpid()
        self.stats = RollingPercentiles(window)
        # Counters: plain ints (a dict update per step costs more), each written by one thread.
        self.steps_begun = 0  # training thread
        self.steps_reported = 0  # harvester
        self.harvest_drops = 0  # training thread
        self.unpaired = 0
        self.alias_misses = 0  # kept for counters(): with slots a begin event cannot go missing
        self._step_errors = 0
        self._harvest_errors = 0
        self.last_error: str | None = None
        self.harvest_passes = 0
        self.harvest_cpu_ns = 0  # CPU time of the harvester thread's passes
        self.queries = 0  # query() calls made while harvesting
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
        self._data_event = cuda_data_event or not self.cuda  # host markers cost ~0.1 µs: always
        self._rank = rank if rank is not None else _env_rank()
        self._pool_size = pool_size
        # Slots in use at most: pool_size pending, the open one, the one the harvester holds. So
        # with the deque bounded at pool_size the free deque never runs dry (if it did, the step
        # would go unmeasured and be counted).
        n_slots = pool_size + 2 if self.enabled else 0
        self._slots = [_Slot(make, self._data_event) for _ in range(n_slots)]
        self._markers: list[Marker] = [m for slot in self._slots for m in slot.markers()]
        self._free: deque[_Slot] = deque(self._slots)
        self._pending: deque[_Slot] = deque()
        self._held: _Slot | None = None  # harvester: the last slot it read
        self._cur: _Slot | None = None  # the open step
        self._last: _Slot | None = None  # training thread: the last slot appended, if still aliasable
        self._next_step = 1
        self._ctx = _StepContext(self)
        self._profiler = profiler
        self._req: wire.ProfileRequest | None = None
        self._profiling = False
        self._profile_stop = 0
        self._profile_id = 0
        # Host markers cost ~0.1 µs and are always recorded; a CUDA end just recorded cannot be done.
        self._alias = self.cuda
        self._keep_newest = 1 if self.cuda else 0
        self._end_returned = 0
        self._next_poll = 0
        self.sender = DatagramSender(socket_path or wire.socket_path_from_env())
        self._batch = bytearray()
        self._batch_n = 0
        self._batch_max = max(1, batch_records)
        self._flush_ns = int(flush_interval_s * 1e9)
        self._flush_at = time.perf_counter_ns() + self._flush_ns
        if harvest_interval_s is None:
            harvest_interval_s = _HARVEST_INTERVAL_S if self.cuda and flush_interval_s > 0 else 0.0
        self.harvest_interval_s = harvest_interval_s
        self._threaded = harvest_interval_s > 0 and self.enabled
        self._wake_at = max(1, pool_size // 2) if self._threaded else -1
        self._lock = threading.Lock()  # harvest state: pending pops, _held, batch, stats, sender
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._final_deadline = 0.0
        self._closed = False
        self._ready = False
        self._bound = False  # the harvester thread has made the CUDA context current
        self._outbox: deque[bytes] = deque()  # profile statuses for the harvester to send
        lifecycle.track(self)  # closed at exit, fixed up in a forked child

    # ------------------------------------------------------------------------------- the step path

    def step(self, step: int | None = None) -> _StepContext:
        """``with hook.step(): ...``: begin on enter, end on exit (abandoned if the body raises)."""
        self._ctx._step = step
        return self._ctx

    def step_begin(self, step: int | None = None) -> None:
        if not self.enabled:
            return
        try:
            if not self._ready:
                self._first_use()
            if self._cur is not None:  # begin twice without an end: the previous one is dropped
                self.unpaired += 1
                self.abandon_step()
            n = self._next_step if step is None else step
            self._next_step = n + 1
            if self._rank is None:
                self._resolve_rank()
            now = t_begin = time.perf_counter_ns()
            if now >= self._next_poll:
                self._next_poll = now + _POLL_INTERVAL_NS
                self._poll_control(n)
                t_begin = -1
            was_profiling = self._profiling
            if self._req is not None and n >= self._req.start_step:
                self._start_profile(n)
                t_begin = -1
            self.steps_begun += 1
            free = self._free
            if not free:  # cannot happen (pool_size + 2 slots); if it did: unmeasured, counted
                self.harvest_drops += 1
                return
            slot = free.pop()
            slot.step = n
            slot.index = self.steps_begun - 1
            slot.profiling = self._profiling
            slot.t_data = -1
            slot.data_event = False
            slot.t_begin = t_begin if t_begin >= 0 else time.perf_counter_ns()
            last = self._last
            if (last is not None and self._alias and now - self._end_returned < _ALIAS_GAP_NS
                    and was_profiling == self._profiling):
                slot.prev = last  # the previous step's end event is this step's begin
            else:
                slot.prev = None
                try:
                    slot.begin.record()
                except BaseException:
                    free.append(slot)
                    raise
            self._cur = slot
        except Exception as exc:  # never into the training loop
            self._internal(exc)

    def data_ready(self) -> None:
        """The batch is on hand: what came before was data wait, what follows is compute."""
        slot = self._cur
        if slot is None or slot.t_data >= 0:
            return
        try:
            slot.t_data = time.perf_counter_ns()
            data = slot.data
            if data is not None:
                data.record()
                slot.data_event = True
        except Exception as exc:
            self._internal(exc)

    def step_end(self) -> None:
        if not self.enabled:
            return
        slot = self._cur
        if slot is None:
            self.unpaired += 1
            return
        try:
            self._cur = None
            pending = self._pending
            if len(pending) < self._pool_size or self._drop_oldest():
                try:
                    slot.end.record()
                except BaseException:
                    self._free.append(slot)
                    self._last = None
                    raise
                slot.wall_end_ns = time.time_ns()
                pending.append(slot)  # the slot is the harvester's from here on
                self._last = slot
            else:
                self.harvest_drops += 1  # no room, and the harvester is busy: this step is dropped
                self._free.append(slot)
                self._last = None
            if self._profiling and slot.step >= self._profile_stop:
                self._stop_profile(slot.step, wire.PROFILE_STOPPED)
            if self._threaded:
                if len(pending) == self._wake_at:
                    self._wake.set()  # half full before the next tick: harvest now
            else:  # no harvester thread: nothing to lock against, as before
                self._harvest_locked(self._keep_newest)
        except Exception as exc:
            self._internal(exc)
        self._end_returned = time.perf_counter_ns()

    def abandon_step(self) -> None:
        """Forget the open step (it raised, or the loop ended between begin and end)."""
        slot = self._cur
        if slot is not None:
            self._cur = None
            self._free.append(slot)
            self._last = None  # the abandoned step's work lies between: the next one begins anew

    def _drop_oldest(self) -> bool:
        """The deque is full: give up the oldest pending measurement, unless the harvester is in a
        pass right now (then False: never wait for it, drop this step instead)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._pending:
                self._retire(self._pending.popleft())
            self.harvest_drops += 1
        finally:
            self._lock.release()
        return True

    # ------------------------------------------------------------------------------- harvesting

    def harvest(self) -> int:
        """Report every finished step, oldest first, without waiting for the GPU. Returns how many.
        The harvester thread does this by itself. Safe from any thread that has the training
        thread's CUDA context current (the training thread has)."""
        return self._harvest(0)

    def _harvest(self, keep: int) -> int:
        if not self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
            return 0
        try:
            return self._harvest_locked(keep)
        except Exception as exc:
            self._internal(exc, harvester=True)
            return 0
        finally:
            self._lock.release()

    def _harvest_locked(self, keep: int) -> int:
        # Events on one stream complete in order, so the newest complete end event settles every
        # older step: one query when the GPU has caught up, a few (_settled) when it has not.
        pending = self._pending
        n = len(pending) - keep
        if n <= 0:
            return 0
        self.queries += 1
        if not pending[n - 1].end.query():
            n = self._settled(n)
        done = 0
        while done < n:
            slot = pending[0]
            prev = slot.prev
            step_ns = (slot.begin if prev is None else prev.end).elapsed_ns(slot.end)
            if step_ns is None:
                break  # not complete after all (another stream, say): the next pass
            pending.popleft()
            try:
                self._report(slot, step_ns)
            finally:  # _retire(slot), inlined: once per step
                held = self._held
                if held is not None:
                    self._free.append(held)
                self._held = slot
            done += 1
        return done

    def _settled(self, n: int) -> int:
        """How many of the ``n`` oldest pending steps have completed, the newest of them known not
        to be: a galloping search back from the newest (the GPU is usually a step or two behind),
        then a binary search. O(log n) queries, never one per step."""
        pending = self._pending
        hi, lo, gap = n - 1, -1, 1  # pending[hi] is not complete; pending[lo] is (-1: none known)
        while hi - gap > lo:
            i = hi - gap
            self.queries += 1
            if pending[i].end.query():
                lo = i
                break
            hi, gap = i, gap * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            self.queries += 1
            if pending[mid].end.query():
                lo = mid
            else:
                hi = mid
        return lo + 1

    def _retire(self, slot: _Slot) -> None:
        """``slot`` has been read (or given up): it is held until the next one has been read too
        (that one may begin at its end event); the one held before goes back to the free deque.
        (Inlined in _harvest_locked: keep the two alike.)"""
        held = self._held
        if held is not None:
            self._free.append(held)
        self._held = slot

    def _report(self, slot: _Slot, step_ns: int) -> None:
        # Per record: locals only, no allocation beyond the packed bytes.
        flags = self._flags
        data_ns = compute_ns = -1
        t_data = slot.t_data
        if t_data >= 0:
            flags |= wire.FLAG_HAS_DATA
            data_ns = t_data - slot.t_begin
            if slot.data_event and slot.data is not None:
                compute = slot.data.elapsed_ns(slot.end)
                if compute is not None:
                    compute_ns = compute
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
            self._flush()

    def flush(self) -> None:
        """Send the batched records now (one datagram). Never raises; waits at most for the end of
        a harvester pass."""
        if self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
            try:
                self._flush()
            finally:
                self._lock.release()

    def _flush(self) -> None:
        if self._batch_n:
            now = time.perf_counter_ns()
            with_job = now >= self._job_due_ns and self._rank is not None
            if with_job:
                assert self._rank is not None
                self._job_due_ns = now + _JOB_INTERVAL_NS
                self._batch[:0] = wire.pack_job(job_msg(self._rank, self.pid, self.dtype, self.layout,
                                                        self.mesh))
            if not self.sender.send(bytes(self._batch), self._batch_n) and with_job:
                self._job_due_ns = 0  # not delivered: it goes with the next datagram
            self._batch.clear()
            self._batch_n = 0
        self._flush_at = time.perf_counter_ns() + self._flush_ns

    def _pass(self) -> None:
        """One wake-up of the harvester thread."""
        t0 = time.thread_time_ns()
        try:
            api = self.cuda_api
            if api is not None and not self._bound:
                self._bound = True  # once: a failure falls back to the torch API, counted
                api.bind_context()
            self._send_outbox()
            if self._lock.acquire(timeout=_LOCK_TIMEOUT_S):
                try:
                    self._harvest_locked(0)
                    if self._batch_n and time.perf_counter_ns() >= self._flush_at:
                        self._flush()
                finally:
                    self._lock.release()
        except Exception as exc:
            self._internal(exc, harvester=True)
        self.harvest_passes += 1
        self.harvest_cpu_ns += time.thread_time_ns() - t0

    def _last_passes(self) -> None:
        """The harvester's last act, at close(): harvest until nothing is pending or the deadline."""
        self._pass()
        while self._pending and time.monotonic() < self._final_deadline:
            time.sleep(0.001)
            self._pass()

    def _send_outbox(self) -> None:
        out = self._outbox
        while out:
            self.sender.send(out.popleft())

    # ------------------------------------------------------------------------------- lifecycle

    def _first_use(self) -> None:
        """At the first ``step_begin()``, on the training thread (its device is set by then): have
        every pooled event created, capture the CUDA context, start the harvester."""
        self._ready = True
        try:
            for m in self._markers:
                prime = getattr(m, "prime", None)
                if prime is not None:
                    prime()
            if self.cuda_api is not None:
                self.cuda_api.capture_context()
        except Exception as exc:  # unprimed events are created at their first record instead
            self._internal(exc)
        if self._threaded:
            t = threading.Thread(target=lifecycle.harvest_loop,
                                 args=(weakref.ref(self), self._wake, self.harvest_interval_s),
                                 name="perfd-hook-harvest", daemon=True)
            try:
                t.start()
                self._thread = t
            except RuntimeError as exc:  # no thread to be had: harvest inline
                self._threaded = False
                self._wake_at = -1
                self._internal(exc)

    def close(self, timeout_s: float = 0.0) -> None:
        """End of training: stop the harvester, report what is done (waiting up to ``timeout_s``
        by polling, never a device sync), stop a running profile range, send what is batched,
        close the socket. Idempotent; run for every open hook at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            self.sender.close()
            return
        try:
            t = self._thread
            self._final_deadline = time.monotonic() + timeout_s
            self._stop = True
            self._wake.set()
            if t is not None and t.is_alive() and t is not threading.current_thread():
                # The harvester makes the last harvest itself: its thread has the CUDA context
                # current, this one (atexit: the main thread) may have another or none.
                t.join(timeout_s + _JOIN_TIMEOUT_S)  # stuck in the driver: go on without it
            else:
                self._harvest(0)
                while self._pending and time.monotonic() < self._final_deadline:
                    time.sleep(0.001)
                    self._harvest(0)
            self._thread = None
            if self._profiling:
                self._stop_profile(self._next_step - 1, wire.PROFILE_STOPPED)
            self._send_outbox()
            self.flush()
        except Exception as exc:
            self._internal(exc)
        self.sender.close()

    def _after_fork_in_child(self) -> None:
        """In a forked child: the harvester thread is gone and the lock may have been held."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self.pid = os.getpid()
        if not self.enabled or self._closed:
            return
        if self._ready or self.steps_begun:
            # A worker forked from the training process (a DataLoader worker, say): the parent owns
            # the measurements, and CUDA cannot be used in a forked child. Every call becomes a
            # no-op; nothing batched is sent twice; exit does nothing.
            self.enabled = False
            self._closed = True
            self._cur = None
            self._pending.clear()
            self._outbox.clear()
            self._batch.clear()
            self._batch_n = 0
        else:  # created, never used: the child may be the one that trains; its own reply address
            old = self.sender
            self.sender = DatagramSender(old.path, retry_s=old.retry_ns / 1e9)
            old.close()

    @property
    def internal_errors(self) -> int:
        return self._step_errors + self._harvest_errors

    def counters(self) -> dict[str, Any]:
        return {"steps_begun": self.steps_begun, "steps_reported": self.steps_reported,
                "pending": len(self._pending), "batched": self._batch_n, "harvest_drops": self.harvest_drops,
                "unpaired": self.unpaired, "internal_errors": self.internal_errors,
                "alias_misses": self.alias_misses,
                "sent": self.sender.sent, "send_drops": self.sender.dropped,
                "send_drop_reasons": dict(self.sender.drops), "cuda": self.cuda,
                "profiling": self._profiling, "last_error": self.last_error,
                "cuda_api": self.cuda_api.name if self.cuda_api else None,
                "cuda_driver_errors": self.cuda_api.driver_errors if self.cuda_api else 0,
                "harvester": "thread" if self._threaded else "inline",
                "harvest_passes": self.harvest_passes, "harvest_cpu_ns": self.harvest_cpu_ns,
                "queries": self.queries}

    # ------------------------------------------------------------------------------- internals

    def _internal(self, exc: BaseException, harvester: bool = False) -> None:
        if harvester:  # one counter per thread: += is not atomic across threads
            self._harvest_errors += 1
        else:
            self._step_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

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

    # profile control (training thread) ----------------------------------------------------

    def _status(self, state: int, request_id: int, step: int) -> None:
        rank = -1 if self._rank is None else self._rank
        msg = wire.pack_profile_status(wire.ProfileStatus(state, rank, self.pid, request_id, step))
        if self._threaded and not self._closed:
            self._outbox.append(msg)  # the sender is the harvester's: no syscall, no lock here
            self._wake.set()
        else:
            self.sender.send(msg)

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

