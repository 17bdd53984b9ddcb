"""Profile control for ``StepHook`` (the ``ProfileControl`` base class): the agent's requests for
a CUDA profiler range, polled on the training thread, answered with statuses, and
``cudaProfilerStart()``/``cudaProfilerStop()`` called exactly at the requested step boundaries.

The same protocol carries trace requests (``wire.KIND_TRACE_REQUEST``): instead of a CUDA profiler
range, a Kineto trace opened in the process for the steps asked (perfd.hook.trace), for a job
started without KINETO_USE_DAEMON. Their states are the range's (accepted, started, stopped,
rejected, failed, cancelled), then a ``wire.TraceWritten`` record naming the file once it is
complete.

Who may ask (docs/security.md, "The hook's control channel"): only the agent's socket. The hook's
socket is connected to it, so the kernel refuses every other sender before anything is queued
(perfd.hook.sender), and each request, cancel and profile alike, is also checked to come from the
uid owning the agent's socket (its kernel credentials); anything else is refused before any answer
and counted (``control_refused``). What a request may ask is bounded: at most HOOK_MAX_STEPS steps
(a longer range or trace is rejected), and a trace stops early once it has run HOOK_TRACE_MAX_S or
the process's memory grew HOOK_TRACE_RSS_GROWTH_MAX (perfd.hook.trace). Where a trace is written is
the hook's choice, never the request's: its own private folder (0700), the file 0600.

Separate from ``perfd.hook.step`` because it is a protocol of its own (request, accept or reject,
start, stop, cancel) that the step path only calls at its boundaries; the statuses go out through
the harvester's outbox (``perfd.hook.harvest``) with its next pass, or at once when inline.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType

from perfd.core.limits import HOOK_MAX_STEPS
from perfd.hook import wire
from perfd.hook.arguments import PREFIX, log
from perfd.hook.hook_state import HookState
from perfd.hook.timing import MarkerFactory
from perfd.hook.trace import KinetoTrace, TraceFolder, can_trace

ProfilerControl = tuple[Callable[[], object], Callable[[], object]]  # (start, stop): see _check
# Longer than any request: a longer datagram comes back cut, its size then refuses it.
_RECV_BYTES = 64


class ProfileControl(HookState):
    """Profile requests and the profiler range (training thread); ``StepHook`` sets the state
    declared here."""

    _threaded: bool
    _closed: bool
    _wake: threading.Event
    _torch: ModuleType | None
    _profiler: ProfilerControl | None
    _req: wire.ProfileRequest | None
    _profiling: bool
    _profile_stop: int
    _profile_id: int
    _trace: KinetoTrace | None
    _draining: KinetoTrace | None
    _req_trace: wire.TraceRequest | None
    _make: MarkerFactory
    _traces: TraceFolder
    cuda: bool
    control_refused: int
    refusals_said: set[int]  # the agent's refusal reasons already said on stderr (wire.REFUSED_*)

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
            got = self.sender.recv_control(_RECV_BYTES)
            if got is None:
                return
            msg, uid = got
            agent = self.sender.agent_uid
            if uid is None or agent is None or uid != agent:
                self._refuse(f"from uid {uid}, not the agent's socket's (uid {agent})")  # unanswered
                continue
            kind = wire.kind_of(msg)
            if kind == wire.KIND_REFUSED:
                self._refused(msg)
                continue
            if kind == wire.KIND_TRACE_REQUEST:
                self._trace_request(msg, next_step)
                continue
            if kind not in (wire.KIND_PROFILE_REQUEST, wire.KIND_PROFILE_CANCEL) \
                    or len(msg) != wire.PROFILE_REQUEST.size:
                self._refuse("malformed")
                continue
            req = wire.unpack_profile_request(msg)
            if req.cancel:
                self._cancel(next_step)
            elif self._busy() or not 0 < req.num_steps <= HOOK_MAX_STEPS or self._profiler_fns() is None:
                self.last_error = f"profile request {req.request_id} rejected: {req.num_steps} steps " \
                                  f"(at most {HOOK_MAX_STEPS}), busy {self._busy()}"
                self._status(wire.PROFILE_REJECTED, req.request_id, req.start_step)
            else:
                # A start step already passed begins at the next boundary (the status says which).
                req.start_step = max(req.start_step, next_step)
                self._req = req
                self._status(wire.PROFILE_ACCEPTED, req.request_id, req.start_step)

    def _busy(self) -> bool:
        """A range or a trace is pending, running, or a trace still waits for the GPU: one at a time
        (one CUPTI client per process)."""
        return self._req is not None or self._profiling or self._draining is not None

    def _refused(self, msg: bytes) -> None:
        """The agent takes none of this process's records: said once per reason on stderr (the job's
        log), with what to do, since the steps are otherwise lost in silence."""
        got = wire.unpack_refused(msg)
        if got is None:
            self._refuse("malformed refusal")
            return
        if got.reason in self.refusals_said:
            return
        self.refusals_said.add(got.reason)
        if got.reason == wire.REFUSED_OTHER_JOB:
            why = (f"the perfd agent on this node serves job {got.job!r} and takes no steps of this "
                   "process, which declares another job (PERFD_JOB)")
        else:
            why = (f"the perfd agent on this node serves the launch of job {got.job!r}, and no perfd launch "
                   "started this process")
        self.last_error = f"records refused: {why}"
        log.warning("%s: %s: its steps are not recorded. Run it under `perfd launch --job NAME -- ...`, "
                    "or start an agent for it (`perfd agent --job NAME`).", PREFIX, why)

    def _refuse(self, why: str) -> None:
        self.control_refused += 1
        self.last_error = f"control datagram refused: {why}"

    def _trace_request(self, msg: bytes, next_step: int) -> None:
        t = wire.unpack_trace_request(msg)
        if t is None:
            self._refuse("malformed trace request")
            return
        why = None
        if self._busy():
            why = "another range or trace is pending or running"
        elif not 0 < t.num_steps <= HOOK_MAX_STEPS:
            why = f"{t.num_steps} steps asked: from 1 to {HOOK_MAX_STEPS}"
        elif not can_trace(self._trace_torch()):
            why = "torch's Kineto profiler is not available in this process"
        else:
            why = self._traces.check()
        if why is not None:
            self.last_error = f"trace request {t.request_id} rejected: {why}"
            self._status(wire.PROFILE_REJECTED, t.request_id, t.start_step)
            return
        start = max(t.start_step, next_step)
        self._req = wire.ProfileRequest(t.request_id, start, t.num_steps)
        self._req_trace = t
        self._status(wire.PROFILE_ACCEPTED, t.request_id, start)

    def _trace_torch(self) -> ModuleType | None:
        return self._torch or sys.modules.get("torch")

    def _cancel(self, next_step: int) -> None:
        if self._req is not None:
            self._status(wire.PROFILE_CANCELLED, self._req.request_id, next_step)
            self._req = None
            self._req_trace = None
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
        trace, self._req_trace = self._req_trace, None
        assert req is not None
        self._profile_stop = step + req.num_steps - 1  # before the trace's first step: its budget may cut it
        try:
            if trace is not None:
                rank = -1 if self._rank is None else self._rank
                torch = self._trace_torch()
                if torch is None:  # accepted with torch (can_trace): not imported any more
                    raise RuntimeError("torch is not imported")
                tr = KinetoTrace(torch, self._traces, f"rank{rank}_{self.pid}_{req.request_id}",
                                 rank, trace.stack, self.cuda, on_budget=self._cut_trace)
                tr.start()
                self._trace = tr
                tr.step(step)
            else:
                fns = self._profiler_fns()
                if fns is None:
                    raise RuntimeError("no profiler control")
                _check(fns[0]())
        except Exception as exc:
            self._internal(exc)
            self._drop_trace()
            self._status(wire.PROFILE_FAILED, req.request_id, step)
            return
        self._profiling = True
        self._profile_id = req.request_id
        self._status(wire.PROFILE_STARTED, req.request_id, step)

    def _cut_trace(self, step: int) -> None:
        """The trace ran out of its time or memory budget at ``step``'s begin: that step is its last."""
        self._profile_stop = min(self._profile_stop, step)
        self.last_error = f"trace cut short at step {step}: {self._trace.cut if self._trace else 'budget'}"

    def _drop_trace(self) -> None:
        tr, self._trace, self._draining = self._trace, None, None
        if tr is not None:
            try:
                tr.abort()
            except Exception as exc:
                self._internal(exc)

    def _stop_trace(self, tr: KinetoTrace, step: int, state: int) -> None:
        """The last traced step ended (or a cancel, or close). A trace that ends normally on a GPU
        waits for the GPU to finish that step (a marker recorded now, queried at the next
        boundaries: ``_check_drain``) before the profiler stops, so that its kernels are in it."""
        if self._draining is tr:  # closed (or cancelled) while the GPU finishes its last step: stop now
            self._finish_trace(tr, state)
            return
        tr.last_step = step
        tr.end_step()
        if state == wire.PROFILE_STOPPED and self.cuda and not self._closed and self._draining is None:
            try:
                m = self._make()
                m.record()
                tr.drain = m
                self._draining = tr
                return
            except Exception as exc:  # no marker: stop now, the last kernels may be missing
                self._internal(exc)
        self._finish_trace(tr, state)

    def _check_drain(self) -> None:
        tr = self._draining
        if tr is not None and tr.drained():
            self._finish_trace(tr, wire.PROFILE_STOPPED)

    def _finish_trace(self, tr: KinetoTrace, state: int) -> None:
        """Stop the profiler (training thread), say so, and write the file on its own thread (at
        close: here, the process is about to end)."""
        self._trace = self._draining = None
        self._profiling = False
        rid, step = self._profile_id, tr.last_step
        if state != wire.PROFILE_STOPPED:  # cancelled: nothing is kept
            try:
                tr.abort()
            except Exception as exc:
                self._internal(exc)
            self._status(state, rid, step)
            return
        try:
            tr.stop()
        except Exception as exc:
            self._internal(exc)
            self._status(wire.PROFILE_FAILED, rid, step)
            return
        self._status(wire.PROFILE_STOPPED, rid, step)

        def written(err: BaseException | None) -> None:
            rank = -1 if self._rank is None else self._rank
            msg = None
            if err is None and tr.written is not None:
                try:
                    msg = wire.pack_trace_written(wire.TraceWritten(rank, self.pid, rid, step, tr.written))
                except ValueError as exc:  # a folder path longer than the wire takes
                    err = exc
            if err is not None or msg is None:
                self._internal(err or RuntimeError("no trace file"), harvester=True)
                msg = wire.pack_profile_status(wire.ProfileStatus(wire.PROFILE_FAILED, rank, self.pid, rid,
                                                                  step))
            self._outbox.append(msg)
            if self._threaded and not self._closed:
                self._wake.set()

        if self._closed:
            try:
                tr.write()
                written(None)
            except Exception as exc:
                written(exc)
        else:
            tr.write_async(written)

    def _stop_profile(self, step: int, state: int) -> None:
        tr = self._trace
        if tr is not None:
            self._stop_trace(tr, step, state)
            return
        self._profiling = False
        fns = self._profiler_fns()
        try:
            if fns is not None:
                _check(fns[1]())
        except Exception as exc:
            self._internal(exc)
            state = wire.PROFILE_FAILED
        self._status(state, self._profile_id, step)


def _check(rc: object) -> None:
    """cudart calls return a cudaError (0 = success); other controls return None."""
    code = getattr(rc, "value", rc)
    if isinstance(code, int) and code != 0:
        raise RuntimeError(f"CUDA profiler API returned error {code}")
