"""``StepHook``: step boundaries from inside the training loop, sent to the local perfd agent.

Contract with the training thread (docs/design.md §4): at most ~10 µs of host time per step, never a
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
adds an event at every ``data_ready()``, for the GPU time from there to the end (compute). Without
it the event (~3.4 µs on an H100 host) is recorded only after a host wait of DATA_MARK_MIN_NS in the
step, and bounds the data wait by the GPU's own time to it: a loop ahead of its GPU waits for a batch
the GPU does not (perfd.hook.harvest; host timing always reports compute).

A step's events and stamps live in a reusable slot; there are ``pool_size + 2`` (pending, open,
held), so one is free while the deque has room. torch creates an event at its first record: the
hook records every slot's events once at the first ``step_begin()``, so no step creates one.

What happens to a step after ``step_end()`` (the harvester thread, or inline harvesting), and why,
is in ``perfd.hook.harvest``; the profile range protocol is in ``perfd.hook.profile``; the slot and
the state the parts share, in ``perfd.hook.hook_state``. ``StepHook`` is made of those parts (base
classes) and keeps here the step path, its construction and its lifecycle.

The first ``warmup_steps`` steps are reported but flagged and left out of the rolling p50/p90/p99.
Profile requests are polled on the training thread, which calls ``cudaProfilerStart()``/
``cudaProfilerStop()`` exactly at the requested step boundaries; statuses go out with the next pass.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, TypeVar

from perfd.core.armed import ARMED_ENV
from perfd.core.limits import HOOK_CLOSE_DRAIN_S, HOOK_OUTBOX_MAX
from perfd.core.model import ModelSpec
from perfd.hook import arguments as A
from perfd.hook import lifecycle, wire
from perfd.hook import loader as fetches
from perfd.hook.harvest import Harvester
from perfd.hook.hook_state import Slot
from perfd.hook.hook_types import HookCounters
from perfd.hook.jobinfo import DeviceMesh, current_device, dist_rank, env_rank, hook_flags
from perfd.hook.phases import PhaseControl
from perfd.hook.profile import ProfileControl, ProfilerControl
from perfd.hook.sender import DatagramSender
from perfd.hook.timing import (
    CudaApi,
    HostMarker,
    Marker,
    MarkerFactory,
    RollingPercentiles,
    cuda_marker_factory,
)
from perfd.hook.trace import KinetoTrace, TraceFolder

if TYPE_CHECKING:
    from perfd.analytics.steps.flops import TokenFlops

T = TypeVar("T")
log = logging.getLogger("perfd.hook")

_POLL_INTERVAL_NS = 50_000_000
# A host wait in the step from which data_ready() records its GPU marker without cuda_data_event (~15x
# the record's cost); a shorter one counts as the host saw it (this much at most where the GPU did not wait).
DATA_MARK_MIN_NS = 50_000
# Host time after step_end() returned within which step_begin() may reuse its end marker: a
# Python loop iteration takes well under it, any torch op launch (3-20 µs measured) well over.
_ALIAS_GAP_NS = 2_000
_HARVEST_INTERVAL_S = 0.05
# The longest close() waits for the harvester thread to end (the lock's wait is
# perfd.hook.harvest's _LOCK_TIMEOUT_S): a pass stuck in the driver must not hang close().
_JOIN_TIMEOUT_S = 2.0


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


class StepHook(PhaseControl, ProfileControl, Harvester):
    """Step times from inside the training loop, sent to the local perfd agent: use as ``with
    hook.step(): ...`` or ``step_begin()`` / ``data_ready()`` / ``step_end()``. No argument raises: a
    value the hook cannot use is said once and left absent (``argument_problems``).

    Args:
        socket_path: the agent's hook socket; default ``$PERFD_HOOK_SOCKET`` or ``<runtime dir>/hook.sock``.
        warmup_steps: the first steps, reported but flagged and left out of the rolling percentiles.
        tokens_per_step: tokens per step for the whole job (all ranks, as Megatron counts an iteration).
        flops_per_step: FLOPs per step for the whole job (all ranks): MFU = flops_per_step ÷ (step time
            · world size · peak). Steps of different sizes say their own: ``step_end(tokens=, flops=)``.
        cuda: time the steps with CUDA events (GPU time); without CUDA the hook times on the host.
        rank: this process's rank; default ``$RANK``, then ``torch.distributed.get_rank()`` once
            initialised, else 0.
        window: how many recent steps the rolling p50/p90/p99 (``stats``) cover.
        pool_size: steps that may wait to be harvested; past it the oldest is dropped and counted.
        marker_factory: makes the step markers instead of CUDA events (tests, other accelerators).
        profiler: ``(start, stop)`` callables instead of ``cudaProfilerStart``/``cudaProfilerStop``.
        enabled: False makes every call a no-op; default True unless ``$PERFD_HOOK_DISABLE`` is 1 or true.
        flush_interval_s: seconds a finished step may wait in the batch before it is sent; 0: at once.
        batch_records: step records per datagram, at most.
        cuda_data_event: a CUDA event at every ``data_ready()`` (~3.4 µs each), not only after a host
            wait of ``DATA_MARK_MIN_NS`` in the step.
        harvest_interval_s: seconds between harvester passes; None: a thread with CUDA events and
            batching, else inline in ``step_end()``; 0 forces inline (perfd.hook.harvest).
        model: without ``flops_per_step``, the model whose per-step FLOPs perfd counts from each step's
            tokens and sequence length: a :class:`perfd.core.model.ModelSpec` or a mapping of its fields
            (a Hugging Face ``config.to_dict()`` as it is; what was left unused goes in ``model_notes``).
        dtype: the training dtype (bf16, fp16, fp8, fp32); it picks the GPU's peak.
        layout: named parallel sizes: world_size, tp, pp, dp, cp, ep (perfd.hook.jobinfo).
        mesh: the job's torch ``DeviceMesh``, read for the same sizes.
        device_uuid: this rank's GPU UUID where torch cannot say it (another accelerator, a test);
            by default the current CUDA device's, so the agent finds the rank's GPU without ``$RANK``.
        watch_dataloader: stamp torch DataLoader fetches, so that their time is the data wait.
    """

    def __init__(self, socket_path: str | None = None, warmup_steps: int = 5,
                 tokens_per_step: float | None = None, flops_per_step: float | None = None,
                 cuda: bool = True, *, rank: int | None = None, window: int = 100, pool_size: int = 256,
                 marker_factory: MarkerFactory | None = None, profiler: ProfilerControl | None = None,
                 enabled: bool | None = None, flush_interval_s: float = 0.1, batch_records: int = 32,
                 cuda_data_event: bool = False, harvest_interval_s: float | None = None,
                 model: ModelSpec | Mapping[str, object] | None = None, dtype: str | None = None,
                 layout: Mapping[str, int] | None = None, mesh: DeviceMesh | None = None,
                 device_uuid: str | None = None, watch_dataloader: bool = True) -> None:
        # Nothing given here raises in the training script: a value the hook cannot use is said once
        # and left absent (perfd.hook.arguments).
        pool_size = A.at_least(pool_size, 2, "pool_size", 256)
        harvest_interval_s = A.interval(harvest_interval_s, "harvest_interval_s")
        window = A.at_least(window, 1, "window", 100)
        self.enabled = (os.environ.get("PERFD_HOOK_DISABLE", "") not in ("1", "true")
                        if enabled is None else enabled)
        self.warmup_steps = max(0, warmup_steps) if isinstance(warmup_steps, int) else 5
        work = A.read_work(model, tokens_per_step, flops_per_step)
        self.tokens_per_step, self.flops_per_step = work.tokens_per_step, work.flops_per_step
        self._token_flops: TokenFlops | None = work.token_flops
        self._model_seq: float | None = work.model_seq
        self.model_notes: tuple[str, ...] = work.notes  # how model= was read: ignored, assumed
        self.argument_problems: tuple[str, ...] = work.problems  # what was left absent, and why
        self.step_arg_errors = 0  # step_end() work arguments refused (not a positive Python number)
        self.device_uuid = device_uuid
        self.device_index = -1
        self._device_sent = device_uuid is None  # a given UUID goes out with the first job record
        self.dtype, self.layout, self.mesh = dtype, A.read_layout(layout), mesh
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
        self.last_error = None
        self.harvest_passes = 0
        self.harvest_cpu_ns = 0  # CPU time of the harvester thread's passes
        self.queries = 0  # query() calls made while harvesting
        self.cuda = False
        self._torch = None
        self.cuda_api = None
        make: MarkerFactory = HostMarker
        self._job_flags = 0  # wire.JOB_FLAG_*: set at the first step (torch is imported by then)
        self._trace: KinetoTrace | None = None
        self._draining: KinetoTrace | None = None
        self._req_trace: wire.TraceRequest | None = None
        self._traces = TraceFolder()  # where this hook writes the traces it is asked for (its own)
        self.control_refused = 0  # agent requests refused before any answer (malformed, not the agent)
        self.refusals_said: set[int] = set()  # the agent's refusal reasons said on stderr once each
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
        if os.environ.get(ARMED_ENV):  # under perfd ncu-exec: every step is the profiler's
            self._flags |= wire.FLAG_ARMED
        self._data_event = cuda_data_event or not self.cuda  # host markers cost ~0.1 µs: always
        self._rank = rank if rank is not None else env_rank()
        self._pool_size = pool_size
        # Slots in use at most: pool_size pending, the open one, the one the harvester holds. So
        # with the deque bounded at pool_size the free deque never runs dry (if it did, the step
        # would go unmeasured and be counted).
        n_slots = pool_size + 2 if self.enabled else 0
        self._make = make  # a trace's drain marker (perfd.hook.trace) is one more of these
        self._slots = [Slot(make) for _ in range(n_slots)]
        self._markers: list[Marker] = [m for slot in self._slots for m in slot.markers()]
        self._free = deque(self._slots)
        self._pending = deque()
        self._held = None  # harvester: the last slot it read
        self._cur: Slot | None = None  # the open step
        self._last: Slot | None = None  # training thread: the last slot appended, if still aliasable
        self._next_step = 1
        self._ctx = _StepContext(self)
        self._profiler = profiler
        self._req = None
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
        self._outbox = deque(maxlen=HOOK_OUTBOX_MAX)  # statuses for the harvester to send (bounded)
        self._phase_open: str | None = None  # the checkpoint save or evaluation announced, until its end
        self._pause_at: tuple[int, int] | None = None  # (perf_counter_ns, fetch clock) at its begin
        # Between the steps (perfd.hook.loader): the fetch clock at the last step_end(), and the
        # pauses announced since (host ns, and the fetch ns inside them).
        self.watch_dataloader = watch_dataloader and self.enabled and not fetches.watch_disabled()
        self._fetch = fetches.CLOCK if self.watch_dataloader else fetches.FetchClock()
        self._fetches_before = self._fetch.count  # this hook's loop's fetches are counted from here
        self._f_end = 0
        self._paused_ns = self._paused_fetch_ns = 0
        if self.enabled:
            self._fetch.watch()  # the thread making the hook is the loop's, until its first step says
        if self.watch_dataloader:
            fetches.watch_dataloader()
        self._after_fetch = lifecycle.weakly(weakref.WeakMethod(self._fetched))  # a dropped hook is let go
        if self.enabled and self.cuda:
            self._fetch.after, self._fetch.after_min_ns = self._after_fetch, DATA_MARK_MIN_NS
        lifecycle.track(self)  # closed at exit, fixed up in a forked child

    # ------------------------------------------------------------------------------- the step path

    def step(self, step: int | None = None) -> _StepContext:
        """``with hook.step(): ...``: begin on enter, end on exit (abandoned if the body raises).

        Args:
            step: the step's number (the optimizer step count, say); None: the last one plus 1.

        Returns:
            The context manager; entering it gives this hook.
        """
        self._ctx._step = step
        return self._ctx

    def loader(self, iterable: Iterable[T]) -> fetches.Loader[T]:
        """``for batch in hook.loader(loader): ...``: the same batches, each fetch stamped, so the time
        the loop waits for them is its data wait wherever the fetch happens (between the steps or
        inside one). Any iterable; torch DataLoaders are stamped without it unless
        ``watch_dataloader=False`` (perfd.hook.loader). Only the training thread's fetches count: the
        thread that made the hook, then the one that runs its first step.

        Args:
            iterable: the batches (a DataLoader, a generator, any iterable).

        Returns:
            An iterable of the same batches, in the same order.
        """
        return fetches.Loader(iterable, self._fetch)

    def step_begin(self, step: int | None = None) -> None:
        """A step begins; never raises, never waits (a step left open is abandoned and counted).

        Args:
            step: the step's number (the optimizer step count, say); None: the last one plus 1.
        """
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
            if self._draining is not None:  # a trace waits for the GPU to finish its last step
                self._check_drain()
            was_profiling = self._profiling
            if self._req is not None and n >= self._req.start_step:
                self._start_profile(n)
                t_begin = -1
            elif self._trace is not None and self._draining is None:
                self._trace.step(n)  # the traced step's ProfilerStep#n range
            self.steps_begun += 1
            free = self._free
            if not free:  # cannot happen (pool_size + 2 slots); if it did: unmeasured, counted
                self.harvest_drops += 1
                self._last = None
                return
            slot = free.pop()
            slot.step = n
            slot.index = self.steps_begun - 1
            slot.profiling = self._profiling
            slot.t_data = -1
            slot.data_event = False
            slot.f_mark = -1
            slot.t_begin = t_begin if t_begin >= 0 else time.perf_counter_ns()
            # Between the steps: the host time since the last step_end() returned, the fetches and
            # the announced pauses in it (perfd.hook.loader; _phase).
            fetched = self._fetch.total_ns
            slot.f_begin = fetched
            last = slot.prev = self._last
            if last is not None:
                slot.gap_ns = now - self._end_returned
                slot.gap_fetch_ns = fetched - self._f_end - self._paused_fetch_ns
            else:
                slot.gap_ns, slot.gap_fetch_ns = -1, 0
            slot.paused_ns, slot.paused_in_ns = self._paused_ns, 0
            self._paused_ns = self._paused_fetch_ns = 0
            if (last is not None and self._alias and now - self._end_returned < _ALIAS_GAP_NS
                    and was_profiling == self._profiling):
                slot.aliased = True  # the previous step's end event is this step's begin
            else:
                slot.aliased = False
                try:
                    slot.begin.record()
                except BaseException:
                    free.append(slot)
                    raise
                # The data wait counts from the step's begin as its timer took it: stamped before
                # it, a preemption between the two (a loaded host) went into the data wait as well
                # as before the step, and with host timing the data wait and the compute summed past
                # the step (0.17 ms over, a full suite on 2 cores)
                slot.t_begin = time.perf_counter_ns()
            self._cur = slot
        except Exception as exc:  # never into the training loop
            self._internal(exc)

    def data_ready(self) -> None:
        """The batch is on hand: what came before was data wait, what follows is compute."""
        slot = self._cur
        if slot is None or slot.t_data >= 0:
            return
        try:
            slot.t_data = t_data = time.perf_counter_ns()
            slot.f_data = self._fetch.total_ns
            if self._data_event or t_data - slot.t_begin >= DATA_MARK_MIN_NS:
                slot.data.record()
                slot.data_event = True
        except Exception as exc:
            self._internal(exc)

    def _fetched(self, took_ns: int) -> None:
        """A stamped fetch of DATA_MARK_MIN_NS or more ended (the clock calls only for those): the first
        one in an open step, before any data_ready(), records the data marker at its end as data_ready()
        would (``with hook.step(): batch = next(it)``: the GPU's own time to it bounds its data wait)."""
        slot = self._cur
        if slot is None or not self.enabled or slot.data_event or slot.t_data >= 0:
            return
        try:
            slot.data.record()
            slot.data_event = True
            slot.f_mark = self._fetch.total_ns
        except Exception as exc:  # never into the training loop (nor the loader's iterator)
            self._internal(exc)

    def step_end(self, tokens: float | None = None, flops: float | None = None,
                 seq_len: float | None = None) -> None:
        """The step's work is enqueued; never raises, never waits for the GPU.

        Args:
            tokens: this step's tokens for the whole job, where steps differ; default ``tokens_per_step``.
            flops: this step's FLOPs for the whole job; default ``flops_per_step`` (or from ``model``).
            seq_len: this step's sequence length in tokens, for ``model``'s FLOPs.

        Each a Python number: a tensor is refused and counted (reading it would sync the device).
        """
        if not self.enabled:
            return
        slot = self._cur
        if slot is None:
            self.unpaired += 1
            return
        try:
            self._cur = None
            slot.tokens, slot.flops, slot.seq = tokens, flops, seq_len
            fetch = self._fetch
            self._f_end = slot.f_end = fetch.total_ns
            slot.fetch_live = fetch.count > self._fetches_before
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
            if self._profiling:
                if self._draining is not None:
                    self._check_drain()
                elif slot.step >= self._profile_stop:
                    self._stop_profile(slot.step, wire.PROFILE_STOPPED)
                elif self._trace is not None:
                    self._trace.end_step()
            if self._threaded:
                if len(pending) == self._wake_at:
                    self._wake.set()  # half full before the next tick: harvest now
            else:  # no harvester thread: nothing to lock against, as before
                self._harvest_locked(self._keep_newest)
                if self._outbox:  # a trace's written/failed status, from its writer thread
                    self._send_outbox()
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

    # ------------------------------------------------------------------------------- lifecycle

    def _first_use(self) -> None:
        """At the first ``step_begin()``, on the training thread (its device is set by then): have
        every pooled event created, capture the CUDA context, start the harvester."""
        self._ready = True
        self._job_flags = hook_flags(self.cuda)
        self._fetch.watch()  # the training thread: only its fetches are waits
        if self.watch_dataloader:
            fetches.watch_dataloader()  # torch's DataLoader imported since the hook was made
        if self.device_uuid is None:
            self.device_index, self.device_uuid = current_device(self._torch)
            self._device_sent = self.device_uuid is None
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
        close the socket. Idempotent; run for every open hook at interpreter exit.

        Args:
            timeout_s: seconds to wait for the GPU to finish the steps still pending.
        """
        if self._closed:
            return
        self._closed = True
        if self._fetch.after is self._after_fetch:
            self._fetch.after = None
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
            self._stop_drainer()
            self._send_outbox()
            self.flush()
            self.sender.flush_backlog(HOOK_CLOSE_DRAIN_S)  # held for a late or busy agent: a last try
        except Exception as exc:
            self._internal(exc)
        self.sender.drop_backlog()  # never sent now: counted as dropped
        self.sender.close()

    def counters(self) -> HookCounters:
        """The hook's health, for a job's logs and tests.

        Returns:
            Steps begun, reported and dropped, internal errors, datagrams sent and dropped, the harvester.
        """
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
                "queries": self.queries, "held": self.sender.backlog_records,
                "delivered_late": self.sender.late, "step_arg_errors": self.step_arg_errors,
                "control_refused": self.control_refused, "device_uuid": self.device_uuid}

    # ------------------------------------------------------------------------------- internals

    def _resolve_rank(self) -> None:
        self._rank = dist_rank()  # called at the first step: a process group is set up by then


def _import_torch() -> ModuleType | None:
    """torch, imported only when a CUDA hook is created (perfd itself never requires it)."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None

