"""The harvester side of ``StepHook`` (the ``Harvester`` base class): finished steps read off
their markers, measured, packed into step records and sent in datagrams, on the harvester thread
or inline in ``step_end()``.

Separate from ``perfd.hook.step`` because it is the other thread's half: the training thread's
step path only appends slots to the pending deque; everything here reads them off it, under the
lock. The thread itself is started in ``perfd.hook.step`` (at the first step) and run by
``perfd.hook.lifecycle``; in a forked child it is gone, and this half is set right here.

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

Datagrams a busy or absent agent did not take are held by the sender (perfd.hook.sender) and go out
before the next one; while the loop sends nothing (a pause, a checkpoint save) they are tried again
every ``_DRAIN_S`` all the same — by the harvester thread at each pass, or in an inline hook by a
drainer thread (``perfd-hook-drain``) that runs only while any is held: held through the pause, the
steps before it and its announcement reached the agent after it, and the job read as stalled.

Harvesting stays inline in ``step_end()`` where a thread buys nothing: host timing (``cuda=False``
or no GPU: no query to save, and the GIL would serialize the record's few µs of Python with the
loop anyway) and ``flush_interval_s=0`` (each record sent at once: tests, debugging).
``harvest_interval_s=0`` forces inline, ``> 0`` the thread. Inline, a CUDA end event is not queried
by the ``step_end()`` that recorded it (it cannot be done): step N is reported at step N+1 or N+2.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING

from perfd.hook import wire
from perfd.hook.hook_state import HookState, Slot
from perfd.hook.jobinfo import DeviceMesh, job_msg
from perfd.hook.sender import DatagramSender
from perfd.hook.timing import CudaApi, RollingPercentiles

if TYPE_CHECKING:
    from perfd.analytics.steps.flops import TokenFlops

_JOB_INTERVAL_NS = 60_000_000_000  # the job record again: an agent restarted since learns it
# The longest anything waits for the harvester: a pass holds the lock for µs to a few ms; a pass
# stuck in the driver must not hang close() or flush().
_LOCK_TIMEOUT_S = 1.0
# How often held datagrams are tried again while the loop sends nothing else: an agent busy for a
# moment takes them within this, not at the loop's next step (after a pause of minutes, perhaps).
_DRAIN_S = 0.1
# The longest close() waits for an inline hook's drainer (it holds the lock for a few sends at most).
_DRAIN_JOIN_S = 2.0

_NAN = float("nan")


def _number(v: object) -> float | None:
    """A positive finite Python number as a float, else None (a bool, a tensor, NaN, <= 0)."""
    if type(v) is int or type(v) is float:
        x = float(v)
        return x if 0 < x < math.inf else None
    return None
_STEP_PACK = wire.STEP2.pack
_VERSION = wire.VERSION
_KIND_STEP = wire.KIND_STEP2


class Harvester(HookState):
    """Harvesting, batching and sending; ``StepHook`` sets the state declared here."""

    _lock: threading.Lock
    _pending: deque[Slot]
    _free: deque[Slot]
    _held: Slot | None
    _flags: int
    _data_event: bool  # a data marker at every data_ready(), its time to the end reported (compute)
    stats: RollingPercentiles
    warmup_steps: int
    tokens_per_step: float | None
    flops_per_step: float | None
    dtype: str | None
    layout: dict[str, int]
    mesh: DeviceMesh | None
    cuda_api: CudaApi | None
    steps_reported: int
    harvest_drops: int
    harvest_passes: int
    harvest_cpu_ns: int
    queries: int
    _batch: bytearray
    _batch_n: int
    _batch_max: int
    _flush_ns: int
    _flush_at: int
    _job_due_ns: int
    _job_flags: int
    _token_flops: TokenFlops | None
    _model_seq: float | None
    step_arg_errors: int
    device_uuid: str | None
    device_index: int
    _bound: bool
    _wake: threading.Event
    _thread: threading.Thread | None
    _ready: bool
    _closed: bool
    enabled: bool
    _threaded: bool  # a harvester thread runs (else inline in step_end())
    _drainer: threading.Thread | None = None  # an inline hook's, while the sender holds datagrams
    _drain_stop: threading.Event | None = None
    steps_begun: int
    _cur: Slot | None
    _final_deadline: float
    # The trainer whose callback drives the hook (wire.FRAMEWORK_*) and its version: None for a plain
    # StepHook, whose job is "pytorch" (:meth:`driven_by`).
    trainer: tuple[int, str | None] | None = None

    def driven_by(self, framework: int, version: str | None) -> None:
        """Say which trainer's callback drives this hook (wire.FRAMEWORK_*) and the version of it the
        process imported: the job record names it from the next one on, so that the job's advice is in
        the trainer's own terms (its flags, not a bare DataLoader's).

        Args:
            framework: the trainer, as a ``wire.FRAMEWORK_*`` code.
            version: the trainer package's version text, None where it has none.
        """
        self.trainer = (framework, version)
        self._job_due_ns = 0  # with the next datagram, not a minute later

    def harvest(self) -> int:
        """Report every finished step, oldest first, without waiting for the GPU. The harvester
        thread does this by itself. Safe from any thread that has the training thread's CUDA context
        current (the training thread has).

        Returns:
            How many steps were reported (0 when a harvester pass held the lock past its wait).
        """
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
            end = slot.end
            step_ns = (prev.end if slot.aliased and prev is not None else slot.begin).elapsed_ns(end)
            period_ns: int | None = -1
            if prev is not None:
                period_ns = step_ns if slot.aliased else prev.end.elapsed_ns(end)
            if step_ns is None or period_ns is None:
                break  # not complete after all (another stream, say): the next pass
            pending.popleft()
            try:
                self._report(slot, step_ns, period_ns)
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

    def _retire(self, slot: Slot) -> None:
        """``slot`` has been read (or given up): it is held until the next one has been read too
        (that one may begin at its end event); the one held before goes back to the free deque.
        (Inlined in _harvest_locked: keep the two alike.)"""
        held = self._held
        if held is not None:
            self._free.append(held)
        self._held = slot

    def _report(self, slot: Slot, step_ns: int, period_ns: int) -> None:
        # Per record: locals only, no allocation beyond the packed bytes.
        # The step's time is its period: from the previous step's end to its own (the time between
        # the two is the job's too: the README's loop fetches its batch there), less the pauses
        # announced in it; step_ns, the time inside the step, goes with it. The data wait is every
        # stamped fetch in the period (perfd.hook.loader) and, where data_ready() was called, the
        # host time from step_begin() to it; what else passed between the steps is "outside".
        flags = self._flags
        data_ns = compute_ns = outside_ns = -1
        t_data = slot.t_data
        gap_fetch = slot.gap_fetch_ns
        # The time between the steps on the step's own clock: from the previous end marker to this
        # step's begin. With CUDA events, the host's time between the steps that the GPU spent on the
        # previous step's queued work is not in it (the loop was waiting on the GPU, or working beside
        # it: a sync after step_end(), a loss.item()); with host timing it is the host's gap itself.
        between = max(0, period_ns - step_ns) if period_ns >= 0 else -1
        if between >= 0 and gap_fetch > 0:
            # Of a fetch between the steps, the part the step waited for: no more than that time.
            gap_fetch = min(gap_fetch, between)
        # The data marker (data_ready()'s, or a fetch's at the step's start: perfd.hook.step) to the end,
        # and the GPU's own time from the step's begin to it: while the host waited for its batch the
        # GPU may have run the work queued before (an asynchronous loop ahead of its GPU), and then it
        # did not wait at all. A host wait is bounded by it.
        to_end = slot.data.elapsed_ns(slot.end) if slot.data_event else None
        gpu_wait = max(0, step_ns - to_end) if to_end is not None and flags & wire.FLAG_CUDA else None
        if t_data >= 0:
            flags |= wire.FLAG_HAS_DATA | wire.FLAG_DATA_READY
            before = t_data - slot.t_begin  # the host's wait in the step, to data_ready()
            if gpu_wait is not None:
                before = min(before, gpu_wait)
            if to_end is not None and self._data_event:
                compute_ns = to_end
            data_ns = gap_fetch + before + (slot.f_end - slot.f_data)
            if slot.fetch_live:
                flags |= wire.FLAG_FETCH
        elif slot.fetch_live:
            flags |= wire.FLAG_HAS_DATA | wire.FLAG_FETCH
            in_step = slot.f_end - slot.f_begin
            if gpu_wait is not None and slot.f_mark >= 0:  # of the fetches before the marker
                in_step = min(slot.f_mark - slot.f_begin, gpu_wait) + slot.f_end - slot.f_mark
            data_ns = gap_fetch + in_step
        if data_ns < 0 and (t_data >= 0 or slot.fetch_live):
            data_ns = 0  # a pause's fetches taken out of a step that fetched less: none left
        paused = slot.paused_ns + slot.paused_in_ns
        if period_ns >= 0:
            period_ns = max(period_ns - paused, step_ns)
            if slot.gap_ns >= 0:
                # What else passed between the steps: of the host's gap, no more than the step's
                # clock saw there (a loop that synchronises after step_end() waits for the GPU to
                # end the step it timed: that wait is the step's, not outside it), less the fetch
                # counted as data wait and the announced pauses.
                outside_ns = max(0, min(slot.gap_ns, between) - max(gap_fetch, 0) - slot.paused_ns)
        if slot.profiling:
            flags |= wire.FLAG_PROFILING
        stats = self.stats
        if slot.index < self.warmup_steps:
            flags |= wire.FLAG_WARMUP
        else:
            stats.add(period_ns if period_ns >= 0 else step_ns)
        pct = stats.p50_p90_p99()
        p50, p90, p99 = pct if pct is not None else (-1, -1, -1)
        tokens, flops = self.tokens_per_step, self.flops_per_step
        if slot.tokens is not None or slot.flops is not None or slot.seq is not None:
            tokens, flops = self._step_work(slot, tokens, flops)
        rank = self._rank
        self._batch += _STEP_PACK(
            _VERSION, _KIND_STEP, flags, rank if rank is not None else -1, self.pid, slot.step,
            slot.wall_end_ns, step_ns, data_ns, compute_ns, p50, p90, p99, len(stats),
            self.sender.dropped & 0xFFFFFFFF, self.harvest_drops & 0xFFFFFFFF,
            _NAN if tokens is None else tokens, _NAN if flops is None else flops, period_ns, outside_ns)
        self.steps_reported += 1
        self._batch_n += 1
        if self._batch_n >= self._batch_max or time.perf_counter_ns() >= self._flush_at:
            self._flush()

    def _step_work(self, slot: Slot, tokens: float | None,
                   flops: float | None) -> tuple[float | None, float | None]:
        """This step's tokens and FLOPs from what step_end() was told: its own FLOPs, else counted from
        its tokens and sequence length with the model's formula, else the hook's defaults. A value
        that is not a positive Python number is refused (counted in ``step_arg_errors``, said in
        ``last_error``) and the step goes out without it: never a guess, never a tensor read."""
        own_tokens, own_flops, seq = (_number(v) for v in (slot.tokens, slot.flops, slot.seq))
        refused = False
        for given, got, name in ((slot.tokens, own_tokens, "tokens"), (slot.flops, own_flops, "flops"),
                                 (slot.seq, seq, "seq_len")):
            if given is not None and got is None:
                refused = True
                self.step_arg_errors += 1
                self.last_error = (f"step_end({name}={type(given).__name__}): not a positive Python number "
                                   "(a tensor would need a device sync): this step's work is absent")
        if refused:  # the defaults are another step's size: absent rather than wrong
            return (tokens if slot.tokens is None else own_tokens), own_flops
        if own_tokens is not None:
            tokens = own_tokens
        if own_flops is not None:
            return tokens, own_flops
        tf = self._token_flops
        if tf is not None:
            s = seq if seq is not None else self._model_seq
            flops = tf.flops(tokens, s) if tokens is not None and s is not None else None
        elif own_tokens is not None and flops is not None:
            # The constructor's FLOPs count its tokens: at one sequence length FLOPs are linear in
            # tokens; without its tokens to scale by, this step's FLOPs are unknown.
            base = self.tokens_per_step
            flops = flops * own_tokens / base if base else None
        return tokens, flops

    def _after_fork_in_child(self) -> None:
        """In a forked child: the harvester thread is gone and the lock may have been held."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._drainer = self._drain_stop = None  # gone with the other threads
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
                                                        self.mesh, self._job_flags))
                if self.device_uuid is not None:  # after the steps: see wire.KIND_DEVICE
                    self._batch += wire.pack_device(wire.DeviceMsg(self._rank, self.pid, self.device_index,
                                                                   self.device_uuid))
                if self.trainer is not None:  # after the steps too: see wire.KIND_FRAMEWORK
                    self._batch += wire.pack_framework(wire.FrameworkMsg(self._rank, self.pid, *self.trainer))
                tf = self._token_flops
                if tf is not None:  # after the steps too: see wire.KIND_MODEL
                    self._batch += wire.pack_model(wire.model_msg(self._rank, self.pid, tf.spec))
            if not self.sender.send(bytes(self._batch), self._batch_n, keep=True) and with_job:
                self._job_due_ns = 0  # not delivered (or held): it goes with the next datagram too
            self._batch.clear()
            self._batch_n = 0
            self._drain_later()
        self._flush_at = time.perf_counter_ns() + self._flush_ns

    def _drain_later(self) -> None:
        """Held datagrams go out while the loop sends nothing else (the module says why): an inline
        hook starts its drainer thread, for as long as any is held; the harvester thread tries them at
        each pass itself. Called with the lock held (the drainer takes it for each try)."""
        if self._threaded or self._drainer is not None or not self.sender.backlog or self._closed:
            return
        stop = threading.Event()
        t = threading.Thread(target=_drain_loop, args=(weakref.ref(self), stop), name="perfd-hook-drain",
                             daemon=True)
        self._drainer, self._drain_stop = t, stop
        try:
            t.start()
        except RuntimeError:  # no thread to be had: held until the next send, as without one
            self._drainer = self._drain_stop = None

    def _stop_drainer(self) -> None:
        """At close(), before its last sends: the drainer ended (a few sends at most hold it)."""
        t, stop = self._drainer, self._drain_stop
        if t is None or stop is None:
            return
        stop.set()
        if t is not threading.current_thread():
            t.join(_DRAIN_JOIN_S)
        self._drainer = self._drain_stop = None

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
                    elif self.sender.backlog:  # held for a busy agent: tried at every pass, steps or not
                        self.sender.flush_backlog()
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
        while out:  # a pause's announcement, a trace's status: held behind the steps, as they are
            self.sender.send(out.popleft(), keep=True)


def _drain_loop(ref: weakref.ReferenceType[Harvester], stop: threading.Event) -> None:
    """An inline hook's drainer thread: every ``_DRAIN_S`` the datagrams its sender holds are tried
    again, under the hook's lock (the training thread's sends take it too: one order); it ends once
    none is held, at close(), or when the hook is garbage."""
    while not stop.wait(_DRAIN_S):
        hook = ref()
        if hook is None:
            return
        if not hook._lock.acquire(timeout=_LOCK_TIMEOUT_S):
            continue
        try:
            if hook._closed or not hook.sender.backlog:
                hook._drainer = hook._drain_stop = None
                return
            hook.sender.flush_backlog()
        finally:
            hook._lock.release()
        del hook
