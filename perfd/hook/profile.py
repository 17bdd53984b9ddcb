"""Profile control for ``StepHook`` (the ``ProfileControl`` base class): the agent's requests for
a CUDA profiler range, polled on the training thread, answered with statuses, and
``cudaProfilerStart()``/``cudaProfilerStop()`` called exactly at the requested step boundaries.

The same protocol carries trace requests (``wire.KIND_TRACE_REQUEST``): instead of a CUDA profiler
range, a Kineto trace opened in the process for the steps asked and written where the agent says
(perfd.hook.trace), for a job started without KINETO_USE_DAEMON. Their states are the range's
(accepted, started, stopped, rejected, failed, cancelled) and ``written`` once the file is complete.
A trace request names a path the process will write, so it is taken only from the agent's own socket
(the address the hook sends its records to; another local user cannot bind that name), and the file
is created, never overwritten. Anything else is refused before any answer and counted
(``control_refused``).

Separate from ``perfd.hook.step`` because it is a protocol of its own (request, accept or reject,
start, stop, cancel) that the step path only calls at its boundaries; the statuses go out through
the harvester's outbox (``perfd.hook.harvest``) with its next pass, or at once when inline.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from perfd.hook import wire
from perfd.hook.state import HookState
from perfd.hook.timing import MarkerFactory
from perfd.hook.trace import KinetoTrace, can_trace, check_path
from perfd.limits import HOOK_TRACE_PATH_MAX_BYTES

ProfilerControl = tuple[Callable[[], Any], Callable[[], Any]]  # (start, stop)
_RECV_BYTES = wire.TRACE_REQUEST.size + HOOK_TRACE_PATH_MAX_BYTES


class ProfileControl(HookState):
    """Profile requests and the profiler range (training thread); ``StepHook`` sets the state
    declared here."""

    _threaded: bool
    _closed: bool
    _wake: threading.Event
    _torch: Any
    _profiler: ProfilerControl | None
    _req: wire.ProfileRequest | None
    _profiling: bool
    _profile_stop: int
    _profile_id: int
    _trace: KinetoTrace | None
    _draining: KinetoTrace | None
    _req_trace: wire.TraceRequest | None
    _make: MarkerFactory
    cuda: bool
    control_refused: int

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
            got = self.sender.recv_from(_RECV_BYTES)
            if got is None:
                return
            msg, addr = got
            kind = wire.kind_of(msg)
            if kind == wire.KIND_TRACE_REQUEST:
                self._trace_request(msg, addr, next_step)
                continue
            if kind not in (wire.KIND_PROFILE_REQUEST, wire.KIND_PROFILE_CANCEL) \
                    or len(msg) != wire.PROFILE_REQUEST.size:
                continue
            req = wire.unpack_profile_request(msg)
            if req.cancel:
                self._cancel(next_step)
            elif self._busy() or req.num_steps <= 0 or self._profiler_fns() is None:
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

    def _refuse(self, why: str) -> None:
        self.control_refused += 1
        self.last_error = f"trace request refused: {why}"

    def _from_agent(self, addr: Any) -> bool:
        """Whether a datagram came from the agent's socket: the path this hook sends its records to
        (the same name, or the same file)."""
        mine = self.sender.path
        if not isinstance(addr, str) or not addr:
            return False
        if addr == mine:
            return True
        try:
            return os.path.realpath(addr) == os.path.realpath(mine)
        except (OSError, ValueError):
            return False

    def _trace_request(self, msg: bytes, addr: Any, next_step: int) -> None:
        t = wire.unpack_trace_request(msg)
        if t is None:
            self._refuse("malformed")
            return
        if not self._from_agent(addr):
            self._refuse(f"not from the agent's socket ({addr!r})")  # no answer: the sender is not ours
            return
        why = None
        if self._busy():
            why = "another range or trace is pending or running"
        elif t.num_steps <= 0:
            why = "no steps asked"
        elif not can_trace(self._trace_torch()):
            why = "torch's Kineto profiler is not available in this process"
        else:
            bad = check_path(t.path)
            why = f"{t.path!r}: {bad}" if bad else None
        if why is not None:
            self.last_error = f"trace request {t.request_id} rejected: {why}"
            self._status(wire.PROFILE_REJECTED, t.request_id, t.start_step)
            return
        start = max(t.start_step, next_step)
        self._req = wire.ProfileRequest(t.request_id, start, t.num_steps)
        self._req_trace = t
        self._status(wire.PROFILE_ACCEPTED, t.request_id, start)

    def _trace_torch(self) -> Any:
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
        try:
            if trace is not None:
                tr = KinetoTrace(self._trace_torch(), trace.path, -1 if self._rank is None else self._rank,
                                 trace.stack, self.cuda)
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
        self._profile_stop = step + req.num_steps - 1
        self._profile_id = req.request_id
        self._status(wire.PROFILE_STARTED, req.request_id, step)

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
            if err is not None:
                self._internal(err, harvester=True)
            state = wire.PROFILE_FAILED if err is not None else wire.PROFILE_WRITTEN
            self._outbox.append(wire.pack_profile_status(wire.ProfileStatus(
                state, -1 if self._rank is None else self._rank, self.pid, rid, step)))
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


def _check(rc: Any) -> None:
    """cudart calls return a cudaError (0 = success); other controls return None."""
    code = getattr(rc, "value", rc)
    if isinstance(code, int) and code != 0:
        raise RuntimeError(f"CUDA profiler API returned error {code}")
