"""Profile control for ``StepHook`` (the ``ProfileControl`` base class): the agent's requests for
a CUDA profiler range, polled on the training thread, answered with statuses, and
``cudaProfilerStart()``/``cudaProfilerStop()`` called exactly at the requested step boundaries.

Separate from ``perfd.hook.step`` because it is a protocol of its own (request, accept or reject,
start, stop, cancel) that the step path only calls at its boundaries; the statuses go out through
the harvester's outbox (``perfd.hook.harvest``) with its next pass, or at once when inline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from perfd.hook import wire
from perfd.hook.state import HookState

ProfilerControl = tuple[Callable[[], Any], Callable[[], Any]]  # (start, stop)


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


def _check(rc: Any) -> None:
    """cudart calls return a cudaError (0 = success); other controls return None."""
    code = getattr(rc, "value", rc)
    if isinstance(code, int) and code != 0:
        raise RuntimeError(f"CUDA profiler API returned error {code}")
