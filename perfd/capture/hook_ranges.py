"""Step-aligned profiler ranges through each rank's step hook, for the tools that record between
``cudaProfilerStart`` and ``cudaProfilerStop`` (nsys ranges, ncu): ask the hook for the range
(``collectors.hook`` ``request_profile``), follow its answers (``hook_profile`` events: accepted,
started, stopped, rejected, failed, cancelled), and cancel a range that must end early. Apart from
the tools' runs so that nsys and ncu open and watch ranges the same way.

Whose answers count: a request is (the process it went to, its rank, its id), and
an answer is kept under the (verified pid, rank, id) it came with (collectors/hook): another process's
status for the same id is another key, never this request's. Only the answers of requests a capture
is waiting for are kept (``expect`` before the request goes out, ``forget`` when the capture is
done), at most HOOK_MAX_STATUSES_PER_REQUEST each and HOOK_MAX_OUTSTANDING requests in all: a flood
of statuses (unique ids from 60 s of datagrams once took the root agent from 55 MB to 3.66 GB) holds
nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import SupportsInt

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, not_ready
from perfd.capture.request import CaptureRequest
from perfd.capture.store import Manifest
from perfd.core.events import HOOK_PROFILE
from perfd.core.limits import HOOK_MAX_OUTSTANDING, HOOK_MAX_STATUSES_PER_REQUEST

# A request as sent: (the pid it went to, its request id); None when it could not be sent.
HookTicket = tuple[int, int]
HookRequester = Callable[[int, int, int], "HookTicket | None"]  # (rank, start_step, num_steps)
HookCanceller = Callable[[int], "HookTicket | None"]  # rank -> the cancel as sent, None if not sent
Key = tuple[int, int, int]  # (pid, rank, request id)
REFUSED = ("rejected", "failed", "cancelled")
EARLY_KEPT = 64  # answers kept a moment for a request not yet expected (see HookRanges._early)
# An answer: a ``hook_profile`` event as collectors/hook makes it (state, step, time, rank, request_id,
# the verified pid and uid, a written trace's path), read where it is used.
Status = Mapping[str, object]


def _int(v: object) -> int:
    if isinstance(v, SupportsInt | str | bytes):
        return int(v)
    raise TypeError(f"not a number: {v!r}")


def status_time(s: Status, clock: Callable[[], float]) -> float:
    """When the hook answered: the event's time (``clock()`` when it has none)."""
    t = s.get("time")
    return float(t) if isinstance(t, int | float) and t else clock()


def status_step(s: Status) -> int:
    """The step the answer is about (0 when it says none)."""
    step = s.get("step", 0)
    return int(step) if isinstance(step, int | float | str) else 0


def next_range_start(last_step: int | None) -> int:
    """The step a hook range asked for now starts at: two past the rank's last reported step (the
    hook polls every 50 ms and its records arrive batched, so the next step may already be under
    way; a start that has passed begins at the hook's next step, and its status says which)."""
    return last_step + 2 if last_step is not None else 0


class HookRanges:
    def __init__(self, ctx: RunContext, requester: HookRequester | None,
                 last_step: Callable[[int], int | None] | None,
                 canceller: HookCanceller | None = None) -> None:
        self.ctx, self.requester, self.last_step, self.canceller = ctx, requester, last_step, canceller
        self._events: dict[Key, list[Status]] = {}  # only the keys expected, in order
        # The latest answers of no expected request: one may come before its request is expected
        # (the answer raced the requester's return); ``expect`` takes it from here.
        self._early: deque[tuple[Key, Status]] = deque(maxlen=EARLY_KEPT)
        self._cond = threading.Condition()
        self.dropped = 0  # answers of requests nobody waits for, or past a request's cap

    @property
    def available(self) -> bool:
        return self.requester is not None

    def on_hook_event(self, event: Mapping[str, object]) -> None:
        """Feed ``hook_profile`` events from the hook collector: kept only for a request expected."""
        if event.get("kind") != HOOK_PROFILE.name:
            return
        with self._cond, contextlib.suppress(TypeError, ValueError):
            key = (_int(event.get("pid", -1)), _int(event.get("rank", -1)), _int(event.get("request_id", -1)))
            held = self._events.get(key)
            if held is None:
                if len(self._early) == self._early.maxlen:
                    self.dropped += 1
                self._early.append((key, dict(event)))
                return
            if len(held) >= HOOK_MAX_STATUSES_PER_REQUEST:
                self.dropped += 1
                return
            held.append(dict(event))
            self._cond.notify_all()

    def expect(self, ticket: HookTicket, rank: int) -> Key:
        """Keep the answers of this request from now on (the oldest expected forgotten past the cap)."""
        key = (ticket[0], rank, ticket[1])
        with self._cond:
            held = self._events.setdefault(key, [])
            held.extend(e for k, e in self._early if k == key)
            while len(self._events) > HOOK_MAX_OUTSTANDING:
                self._events.pop(next(iter(self._events)))
        return key

    def forget(self, keys: Iterable[Key]) -> None:
        with self._cond:
            for key in keys:
                self._events.pop(key, None)

    @property
    def held(self) -> int:
        """Answers held, all requests together (bounded: see the module)."""
        with self._cond:
            return sum(len(v) for v in self._events.values())

    def wake(self) -> None:
        """Wake every wait (the manager is closing)."""
        with self._cond:
            self._cond.notify_all()

    def open(self, req: CaptureRequest, m: Manifest, deadline: float, steps: int | None = None,
             what: str = "cudaProfilerStart") -> dict[int, Key]:
        """Ask each rank's hook for a range of ``steps`` (the request's by default) and wait until
        every one reported its start: rank -> its request's key (``forget`` them once done). Sets the
        manifest's start time and steps and emits ``capture_started``; CaptureFailed when a hook
        refuses or the deadline passes (its requests forgotten)."""
        ask = self.requester
        if ask is None:
            raise CaptureFailed("failed", "no step hook in this agent to open a profiler range")
        n = req.steps if steps is None else steps
        requests: dict[int, Key] = {}
        try:
            for r in req.ranks:
                start = req.start_iteration
                if start is None:
                    start = next_range_start(self.last_step(r) if self.last_step is not None else None)
                ticket = ask(r, start, n)
                if ticket is None:
                    raise not_ready(f"rank {r}: the step hook is unreachable (no hook records from it yet?)")
                requests[r] = self.expect(ticket, r)
            self._opened(req, m, deadline, requests, n, what)
        except BaseException:
            self.forget(requests.values())
            raise
        return requests

    def _opened(self, req: CaptureRequest, m: Manifest, deadline: float, requests: Mapping[int, Key],
                n: int, what: str) -> None:
        states = self.wait(requests, {"started"}, deadline)
        bad = {r: s for r, s in states.items() if s.get("state") in REFUSED}
        if bad:
            raise CaptureFailed("failed", "; ".join(f"rank {r}: the hook {s['state']} the profile range at "
                                                    f"step {s.get('step')}" for r, s in sorted(bad.items())))
        if len(states) < len(requests):
            late = sorted(set(requests) - set(states))
            raise CaptureFailed("timeout", f"rank(s) {late}: no cudaProfilerStart before the "
                                           f"{req.timeout_s:.0f} s timeout{self.progress(late, requests)}")
        started = max(status_time(s, self.ctx.clock) for s in states.values())
        m["timings"]["started_at"] = m["timings"]["first_event_at"] = started
        m["steps"] = {"start": min(status_step(s) for s in states.values()), "count": n}
        lat = started - m["timings"]["requested_at"]
        self.ctx.store.write(m)
        self.ctx.emit(STARTED, req, f"{what} on rank(s) {sorted(states)} {lat:.2f} s after "
                      "the request", "info", m["id"], {"latency_s": round(lat, 3)})

    def cancel(self, rank: int) -> bool:
        """Ask the rank's hook to end its range at the next step boundary (False: not sent)."""
        return self.canceller is not None and self.canceller(rank) is not None

    def progress(self, ranks: Sequence[int], requests: Mapping[int, Key]) -> str:
        """Why a range may not have opened: per rank, the step its hook accepted against the last
        step it reported (a loop whose step numbers stop advancing never reaches the start)."""
        parts = []
        with self._cond:
            for r in ranks:
                events = self._events.get(requests[r], [])
                acc = next((e for e in events if e.get("state") == "accepted"), None)
                last = self.last_step(r) if self.last_step is not None else None
                if acc is None:
                    parts.append(f"rank {r}: the hook never answered the request")
                else:
                    parts.append(f"rank {r}: accepted for step {acc.get('step')}, last step reported {last}")
        return f" ({'; '.join(parts)})" if parts else ""

    def wait(self, requests: Mapping[int, Key], want: Iterable[str], deadline: float,
             refusals: bool = True) -> dict[int, Status]:
        """Per rank, the first hook event for its request in ``want`` (or a refusal, unless
        ``refusals`` is False); until the deadline (``time.monotonic()``)."""
        want = set(want) | (set(REFUSED) if refusals else set())
        out: dict[int, Status] = {}
        with self._cond:
            while len(out) < len(requests) and not self.ctx.closing.is_set():
                for r, key in requests.items():
                    if r not in out:
                        events = self._events.get(key, [])
                        hit = next((e for e in events if e.get("state") in want), None)
                        if hit is not None:
                            out[r] = hit
                left = deadline - time.monotonic()
                if len(out) == len(requests) or left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
        return out
