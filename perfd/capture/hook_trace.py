"""A Kineto capture through the step hook (issue 44 item 4, "captures without flags"): each rank's
hook opens torch's Kineto profiler in its own process for the steps asked (perfd.hook.trace) and
writes the Chrome trace where the agent says; the trace is then kept and analysed exactly as one the
Kineto daemon got (:mod:`perfd.capture.kineto_capture`). The manifest's ``mode`` says which:
``hook-trace`` here, ``on-demand`` there.

Why: Kineto on demand needs the job started with ``KINETO_USE_DAEMON=1`` (``perfd launch
--kineto``); a job that runs the step hook without it never polls the daemon, and its capture failed
("never polled the Kineto daemon"). The hook's job record says whether its process polls the daemon
and whether it can trace (wire.JOB_FLAG_KINETO_DAEMON, JOB_FLAG_CAN_TRACE), so the manager picks this
run up front for such ranks instead of arming the daemon and waiting for polls that never come.

Where the hook writes: the process writes as its own user, so the file goes into the capture's
folder when the hook runs as the agent's user. An agent running as root gives a rank of another user
a fresh folder of that user's own (:func:`_drop_dir`, 0700, under the system's temporary folder: the
store's root is private to the agent and cannot be entered by others) and moves the file into the
store once written, after checking that it is a plain file of that user's. A non-root agent cannot
hand another user a place to write: that capture fails, saying so. The process must see the same
filesystem as the agent (a job in another mount namespace rejects a folder it cannot see: the
failure says that too).

Failures are the capture's, with their reason: a hook that cannot be reached or whose process is
gone, a request the hook rejects, no start or no file before the timeout (the traces asked are then
cancelled so the job does not stay under the profiler).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, not_ready, record_analysis
from perfd.capture.chrome_trace import analyze_chrome_trace
from perfd.capture.hook_ranges import REFUSED, HookRanges, next_range_start
from perfd.capture.request import CaptureRequest

# (rank, start_step, num_steps, path, stack) -> request id, None when it could not be sent
HookTracer = Callable[[int, int, int, str, bool], "int | None"]
HOOK_TRACE = "hook-trace"  # the manifest's mode for a capture the hooks traced
# Why a request may be rejected, for the failure's reason (the hook's status carries only its state).
REJECT_HINT = ("the hook rejects a trace while another range or trace runs, without torch's Kineto "
               "profiler, or at a path its process cannot see (another mount namespace)")
WAIT_SLICE_S = 0.5  # how often a wait looks whether the ranks' processes are still there


def alive(pid: int) -> bool:
    """Whether process ``pid`` (as this agent numbers it) still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: there
    return True


def _drop_dir(uid: int) -> Path:
    """A fresh folder that only ``uid`` (and root) may use, for a trace its process writes."""
    d = Path(tempfile.mkdtemp(prefix="perfd-hook-trace-"))
    try:
        os.chown(d, uid, -1)
    except OSError:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return d


def _take(src: Path, dst: Path, uid: int | None) -> Path:
    """The written trace at ``dst`` in the store: copied from a drop folder after checking that it is
    a plain file of ``uid`` (opened without following a link, checked on the descriptor that is read:
    the folder's owner cannot swap it for a link between the check and the read), or ``src`` itself
    when it is there."""
    if src == dst:
        return dst
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{src} is a link, not a plain file of uid {uid}: not taken") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
            raise ValueError(f"{src} is not a plain file of uid {uid}: not taken")
        with os.fdopen(fd, "rb", closefd=False) as f, open(dst, "xb") as out:
            shutil.copyfileobj(f, out)
    finally:
        os.close(fd)
    return dst


class HookTraceCapture:
    def __init__(self, ctx: RunContext, ranges: HookRanges, tracer: HookTracer | None,
                 can_trace: Callable[[int], bool] | None = None,
                 owner: Callable[[int], int | None] | None = None,
                 last_step: Callable[[int], int | None] | None = None) -> None:
        self.ctx, self.ranges, self.tracer = ctx, ranges, tracer
        self.can_trace, self.owner, self.last_step = can_trace, owner, last_step

    def fits(self, ranks: tuple[int, ...]) -> bool:
        """Every rank's hook can trace and its process does not poll the Kineto daemon."""
        ok = self.can_trace
        return self.tracer is not None and ok is not None and bool(ranks) and all(ok(r) for r in ranks)

    def run(self, req: CaptureRequest, m: dict[str, Any], pids: Mapping[int, int], deadline: float) -> str:
        tracer = self.tracer
        assert tracer is not None
        if req.duration_ms is not None and req.start_iteration is None:
            raise CaptureFailed("failed", "the step hook traces steps, not a time window: ask for steps "
                                          "(or start the job with perfd launch --kineto)")
        d = self.ctx.store.capture_dir(m["id"])
        m["traced_by"] = "step hook (torch.profiler in the process)"
        places: dict[int, tuple[Path, int | None]] = {}
        requests: dict[int, int] = {}
        try:
            for r in req.ranks:
                places[r] = self._place(r, d, pids.get(r))
                start = req.start_iteration
                if start is None:
                    start = next_range_start(self.last_step(r) if self.last_step is not None else None)
                rid = tracer(r, start, req.steps, str(places[r][0]), req.stack)
                if rid is None:
                    raise not_ready(f"rank {r}: its step hook cannot be reached (the process is gone, "
                                    "or it sent no record yet)")
                requests[r] = rid
            states = self._wait(requests, {"started"}, deadline, pids)
            bad = {r: s for r, s in states.items() if s.get("state") in REFUSED}
            if bad:
                raise CaptureFailed("failed", "; ".join(
                    f"rank {r}: the hook {s['state']} the trace at step {s.get('step')}"
                    for r, s in sorted(bad.items())) + f" ({REJECT_HINT})")
            self._gone(requests, states, pids, "before its trace started")
            if len(states) < len(requests):
                late = sorted(set(requests) - set(states))
                raise CaptureFailed("timeout", f"rank(s) {late}: the trace did not start before the "
                                               f"{req.timeout_s:.0f} s timeout"
                                               f"{self.ranges.progress(late, requests)}")
            self._started(req, m, states)
            done = self._wait(requests, {"written"}, deadline, pids)
            return self._keep(req, m, pids, requests, done, places)
        except CaptureFailed:
            for r in requests:  # the job must not stay under the profiler for a capture that ended
                self.ranges.cancel(r)
            raise
        finally:
            for drop, _ in places.values():
                if drop.parent != d:
                    shutil.rmtree(drop.parent, ignore_errors=True)

    def _place(self, rank: int, d: Path, pid: int | None) -> tuple[Path, int | None]:
        """(where the rank's hook writes its trace, the uid that writes it)."""
        name = f"rank{rank}_{pid}.json" if pid is not None else f"rank{rank}.json"
        uid = self.owner(rank) if self.owner is not None else None
        if uid is None or uid == os.geteuid():
            return d / name, uid
        if os.geteuid() != 0:
            raise CaptureFailed("failed", f"rank {rank}'s process runs as uid {uid}, this agent as uid "
                                          f"{os.geteuid()}: the step hook cannot write into the agent's "
                                          "private capture store (run the agent as the job's user or as "
                                          "root, or start the job with perfd launch --kineto)")
        try:
            return _drop_dir(uid) / name, uid
        except OSError as exc:
            raise CaptureFailed("failed", f"rank {rank}: no folder for uid {uid} to write its trace: "
                                          f"{exc}") from exc

    def _wait(self, requests: Mapping[int, int], want: set[str], deadline: float,
              pids: Mapping[int, int]) -> dict[int, dict[str, Any]]:
        """The ranks' first status in ``want`` (or a refusal), until the deadline or until a rank that
        has none yet is gone."""
        got: dict[int, dict[str, Any]] = {}
        while True:
            got = self.ranges.wait(requests, want, min(deadline, time.monotonic() + WAIT_SLICE_S))
            pending = [r for r in requests if r not in got]
            if (not pending or time.monotonic() >= deadline or self.ctx.closing.is_set()
                    or any(r in pids and not alive(pids[r]) for r in pending)):
                return got

    def _gone(self, requests: Mapping[int, int], states: Mapping[int, Any], pids: Mapping[int, int],
              when: str) -> None:
        gone = [r for r in requests if r not in states and r in pids and not alive(pids[r])]
        if gone:
            raise CaptureFailed("failed", "; ".join(f"rank {r}: its process (pid {pids[r]}) exited {when}"
                                                    for r in gone))

    def _started(self, req: CaptureRequest, m: dict[str, Any], states: Mapping[int, Any]) -> None:
        t = m["timings"]
        t["started_at"] = t["first_event_at"] = max(float(s.get("time") or self.ctx.clock())
                                                    for s in states.values())
        m["steps"] = {"start": min(int(s.get("step", 0)) for s in states.values()), "count": req.steps}
        lat = t["started_at"] - t["requested_at"]
        self.ctx.store.write(m)
        self.ctx.emit(STARTED, req, f"Kineto trace opened by the step hook on rank(s) {sorted(states)} "
                      f"{lat:.2f} s after the request (the job polls no Kineto daemon)", "info", m["id"],
                      {"latency_s": round(lat, 3), "mode": HOOK_TRACE})

    def _keep(self, req: CaptureRequest, m: dict[str, Any], pids: Mapping[int, int],
              requests: Mapping[int, int], done: Mapping[int, Any],
              places: Mapping[int, tuple[Path, int | None]]) -> str:
        """Each written trace into the store and analysed; the ranks without one said."""
        d = self.ctx.store.capture_dir(m["id"])
        missing: dict[int, str] = {}
        timed_out = False
        for r in sorted(requests):
            s = done.get(r)
            if s is None:
                if r in pids and not alive(pids[r]):
                    missing[r] = f"rank {r}: its process (pid {pids[r]}) exited before its trace was written"
                else:
                    timed_out = True
                    missing[r] = f"rank {r}: no trace written within the {req.timeout_s:.0f} s timeout"
                continue
            if s.get("state") != "written":
                missing[r] = f"rank {r}: the hook {s.get('state')} the trace at step {s.get('step')}"
                continue
            src, uid = places[r]
            try:
                got = _take(src, d / src.name, uid)
            except ValueError as exc:
                missing[r] = f"rank {r}: {exc}"
                continue
            except OSError as exc:
                missing[r] = f"rank {r}: its trace could not be read at {src}: {exc}"
                continue
            m["timings"]["trace_ready_at"] = self.ctx.clock()
            self.ctx.store.add_artifact(m, got, "kineto_trace", r, pids.get(r))
            record_analysis(m, r, functools.partial(analyze_chrome_trace, got))
        if len(missing) == len(requests):
            with contextlib.suppress(Exception):
                self.ctx.store.write(m)
            raise CaptureFailed("timeout" if timed_out else "failed", "; ".join(missing.values()))
        return ("partial: " + "; ".join(missing.values())) if missing else ""
