"""A Kineto capture through the step hook ("captures without flags"): each rank's
hook opens torch's Kineto profiler in its own process for the steps asked (perfd.hook.trace) and
writes the Chrome trace where the agent says; the trace is then kept and analysed exactly as one the
Kineto daemon got (:mod:`perfd.capture.kineto_capture`). The manifest's ``mode`` says which:
``hook-trace`` here, ``on-demand`` there.

Why: Kineto on demand needs the job started with ``KINETO_USE_DAEMON=1`` (``perfd launch
--kineto``); a job that runs the step hook without it never polls the daemon, and its capture failed
("never polled the Kineto daemon"). The hook's job record says whether its process polls the daemon
and whether it can trace (wire.JOB_FLAG_KINETO_DAEMON, JOB_FLAG_CAN_TRACE), so the manager picks this
run up front for such ranks instead of arming the daemon and waiting for polls that never come.

Where the hook writes: where the hook chooses, never where a request says (a request naming the path
once had a job write its trace, stack frames and tensor shapes, 0644 into a folder its sender
chose). The hook writes into its own private folder (0700, the file 0600: perfd.hook.trace)
and names the file in its ``written`` answer; :func:`_take` copies it into the store only when it is
a plain file of the uid the kernel gave for that answer's sender, with one link, at most
HOOK_TRACE_MAX_BYTES, in a folder of that uid closed to others (opened without following a link,
checked on the descriptors that are read), then deletes it there. The agent must be able to read it:
as the job's user, or as root. The process must see the same filesystem as the agent (the failure
says so when the file is not there).

Failures are the capture's, with their reason: a hook that cannot be reached or whose process is
gone, a request the hook rejects, no start or no file before the timeout (the traces asked are then
cancelled so the job does not stay under the profiler).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, not_ready, record_trace
from perfd.capture.hook_ranges import (
    REFUSED,
    HookRanges,
    HookTicket,
    Key,
    Status,
    next_range_start,
    status_step,
    status_time,
)
from perfd.capture.request import CaptureRequest
from perfd.capture.store import Manifest
from perfd.core.limits import HOOK_TRACE_MAX_BYTES

# (rank, start_step, num_steps, stack) -> the request as sent, None when it could not be sent
HookTracer = Callable[[int, int, int, bool], "HookTicket | None"]
HOOK_TRACE = "hook-trace"  # the manifest's mode for a capture the hooks traced
# Why a request may be rejected, for the failure's reason (the hook's status carries only its state).
REJECT_HINT = ("the hook rejects a trace while another range or trace runs, of more steps than it "
               "takes, without torch's Kineto profiler, or without a private folder of its own to write it")
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
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


def _take(src: str, dst: Path, uid: int, max_bytes: int = HOOK_TRACE_MAX_BYTES) -> Path:
    """Copy the hook's written trace ``src`` into the store at ``dst`` and delete it there: ValueError
    (saying why) unless its folder is a folder of ``uid`` closed to others and the file a plain file
    of ``uid`` with one link, at most ``max_bytes``. Opened without following a link, checked on the
    descriptors read: the folder's owner cannot swap anything between a check and a read."""
    if not os.path.isabs(src) or "\0" in src:
        raise ValueError(f"{src!r} is not an absolute path: not taken")
    folder, name = os.path.split(src)
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{folder!r} is a link, not the hook's folder: not taken") from exc
        raise
    try:
        st = os.fstat(dfd)
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
            raise ValueError(f"{folder!r} is not a private folder of uid {uid} (uid {st.st_uid}, mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): not taken")
        try:
            fd = os.open(name, _OPEN, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"{src!r} is a link, not a plain file of uid {uid}: not taken") from exc
            raise
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != uid or fst.st_nlink != 1:
                raise ValueError(f"{src!r} is not a plain file of uid {uid} with one link: not taken")
            if fst.st_size > max_bytes:
                raise ValueError(f"{src!r} is {fst.st_size} bytes, more than {max_bytes}: not taken")
            with os.fdopen(fd, "rb", closefd=False) as f, open(dst, "xb") as out:
                left = max_bytes + 1
                while left > 0 and (chunk := f.read(min(1 << 20, left))):
                    out.write(chunk)
                    left -= len(chunk)
            if left <= 0:
                dst.unlink()
                raise ValueError(f"{src!r} grew past {max_bytes} bytes while read: not taken")
            with contextlib.suppress(OSError):  # the copy is ours now; the same file only
                if os.stat(name, dir_fd=dfd, follow_symlinks=False).st_ino == fst.st_ino:
                    os.unlink(name, dir_fd=dfd)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return dst


class HookTraceCapture:
    def __init__(self, ctx: RunContext, ranges: HookRanges, tracer: HookTracer | None,
                 can_trace: Callable[[int], bool] | None = None,
                 last_step: Callable[[int], int | None] | None = None) -> None:
        self.ctx, self.ranges, self.tracer = ctx, ranges, tracer
        self.can_trace, self.last_step = can_trace, last_step

    def fits(self, ranks: tuple[int, ...]) -> bool:
        """Every rank's hook can trace and its process does not poll the Kineto daemon."""
        ok = self.can_trace
        return self.tracer is not None and ok is not None and bool(ranks) and all(ok(r) for r in ranks)

    def run(self, req: CaptureRequest, m: Manifest, pids: Mapping[int, int], deadline: float) -> str:
        tracer = self.tracer
        assert tracer is not None
        if req.duration_ms is not None and req.start_iteration is None:
            raise CaptureFailed("failed", "the step hook traces steps, not a time window: ask for steps "
                                          "(or start the job with perfd launch --kineto)")
        m["traced_by"] = "step hook (torch.profiler in the process)"
        requests: dict[int, Key] = {}
        try:
            for r in req.ranks:
                start = req.start_iteration
                if start is None:
                    start = next_range_start(self.last_step(r) if self.last_step is not None else None)
                ticket = tracer(r, start, req.steps, req.stack)
                if ticket is None:
                    raise not_ready(f"rank {r}: its step hook cannot be reached (the process is gone, "
                                    "or it sent no record yet)")
                requests[r] = self.ranges.expect(ticket, r)
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
            return self._keep(req, m, pids, requests, done)
        except CaptureFailed:
            for r in requests:  # the job must not stay under the profiler for a capture that ended
                self.ranges.cancel(r)
            raise
        finally:
            self.ranges.forget(requests.values())

    def _wait(self, requests: Mapping[int, Key], want: set[str], deadline: float,
              pids: Mapping[int, int]) -> dict[int, Status]:
        """The ranks' first status in ``want`` (or a refusal), until the deadline or until a rank that
        has none yet is gone."""
        got: dict[int, Status] = {}
        while True:
            got = self.ranges.wait(requests, want, min(deadline, time.monotonic() + WAIT_SLICE_S))
            pending = [r for r in requests if r not in got]
            if (not pending or time.monotonic() >= deadline or self.ctx.closing.is_set()
                    or any(r in pids and not alive(pids[r]) for r in pending)):
                return got

    def _gone(self, requests: Mapping[int, Key], states: Mapping[int, Status], pids: Mapping[int, int],
              when: str) -> None:
        gone = [r for r in requests if r not in states and r in pids and not alive(pids[r])]
        if gone:
            raise CaptureFailed("failed", "; ".join(f"rank {r}: its process (pid {pids[r]}) exited {when}"
                                                    for r in gone))

    def _started(self, req: CaptureRequest, m: Manifest, states: Mapping[int, Status]) -> None:
        t = m["timings"]
        started = t["started_at"] = t["first_event_at"] = max(status_time(s, self.ctx.clock)
                                                              for s in states.values())
        m["steps"] = {"start": min(status_step(s) for s in states.values()), "count": req.steps}
        lat = started - t["requested_at"]
        self.ctx.store.write(m)
        self.ctx.emit(STARTED, req, f"Kineto trace opened by the step hook on rank(s) {sorted(states)} "
                      f"{lat:.2f} s after the request (the job polls no Kineto daemon)", "info", m["id"],
                      {"latency_s": round(lat, 3), "mode": HOOK_TRACE})

    def _keep(self, req: CaptureRequest, m: Manifest, pids: Mapping[int, int],
              requests: Mapping[int, Key], done: Mapping[int, Status]) -> str:
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
            src, uid, pid = s.get("path"), s.get("uid"), s.get("pid")
            if not isinstance(src, str) or not isinstance(uid, int):
                missing[r] = f"rank {r}: its hook said written without a file"
                continue
            try:
                got = _take(src, d / f"rank{r}_{pid}.json", uid)
            except ValueError as exc:
                missing[r] = f"rank {r}: {exc}"
                continue
            except OSError as exc:
                missing[r] = f"rank {r}: its trace could not be read at {src!r}: {exc}"
                continue
            m["timings"]["trace_ready_at"] = self.ctx.clock()
            self.ctx.store.add_artifact(m, got, "kineto_trace", r, pids.get(r))
            miss = record_trace(self.ctx, m, r, got)
            if miss is not None:
                missing[r] = miss.text
        if len(missing) == len(requests):
            with contextlib.suppress(Exception):
                self.ctx.store.write(m)
            raise CaptureFailed("timeout" if timed_out else "failed", "; ".join(missing.values()))
        return ("partial: " + "; ".join(missing.values())) if missing else ""
