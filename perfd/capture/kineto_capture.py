"""A Kineto capture's run (the manager's worker calls :meth:`KinetoCapture.run`): hand each rank's
trace config to the Kineto daemon, wait for the ranks to poll it, then for their traces, and analyse
each. Apart from the manager, which only admits requests, picks the tool and keeps the bookkeeping.
"""

from __future__ import annotations

import contextlib
import enum
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, TraceMissKind, record_trace
from perfd.capture.dynolog import DynologArming, DynologKineto
from perfd.capture.kineto_daemon import Arming, KinetoDaemon, build_config, trace_complete
from perfd.capture.nsys_exec import wait_stable
from perfd.capture.request import BUSY_REASON, CaptureRequest
from perfd.capture.store import Manifest
from perfd.core.model import CaptureFailure

# A process this young that never polled the daemon may not have reached its first poll: a training
# script imports and initialises for tens of seconds (Megatron-LM on the H100 here: 20-40 s; under ncu
# 42 s) before libkineto polls. Its capture is "not ready", retried later; an older one's is a failure
# (the job was started without KINETO_USE_DAEMON).
KINETO_READY_GRACE_S = 120.0


def _young(pid: int, now: float, grace_s: float = KINETO_READY_GRACE_S) -> bool:
    """The process started less than ``grace_s`` before ``now`` (epoch s); False when unknown."""
    import psutil

    try:
        return now - psutil.Process(pid).create_time() < grace_s
    except psutil.Error:
        return False


class Miss(enum.Enum):
    """Why a rank gave no trace: the capture's status is decided from these, never from the text."""

    BUSY = "busy"  # its Kineto profiler was running a trace already
    POLLED_LATE = "polled_late"  # it polls the daemon, but did not take the config in time
    NEVER_POLLED = "never_polled"  # it polls no Kineto daemon (started without KINETO_USE_DAEMON)
    NO_TRACE = "no_trace"  # it took the config, but wrote no trace before the timeout


@dataclass(frozen=True)
class RankMiss:
    why: Miss | TraceMissKind  # no trace from it, or one that gave no analysis (refused, empty)
    text: str  # the sentence the capture's reason and events show


def _texts(missing: dict[int, RankMiss]) -> list[str]:
    return [x.text for x in missing.values()]


class KinetoCapture:
    def __init__(self, ctx: RunContext, daemon: KinetoDaemon | DynologKineto | None, poll_s: float) -> None:
        self.ctx, self.daemon, self.poll_s = ctx, daemon, poll_s

    def run(self, req: CaptureRequest, m: Manifest, pids: dict[int, int], deadline: float) -> str:
        daemon = self.daemon
        assert daemon is not None
        if not pids:
            raise CaptureFailed("failed", "Kineto captures need the ranks' process ids (no process finder)")
        d = self.ctx.store.capture_dir(m["id"])
        by_pid = {pids[r]: r for r in req.ranks}
        # Kineto counts every optimizer step, a nested one too: where the job's training step holds k
        # of them (perfd.core.model.kineto_iterations_per_step), N steps are k*N of Kineto's
        # iterations, and a start and round-up in steps k times theirs; a round-up of a multiple of k
        # starts every rank's trace at the same point of a training step.
        k = req.iterations_per_step or 1
        iterations = None if req.duration_ms is not None and req.start_iteration is None else req.steps * k
        start = None if req.start_iteration is None else req.start_iteration * k
        roundup = req.roundup * k
        # A window starting now needs no warm-up wait (Kineto's default is seconds of it).
        warmup = 0 if iterations is None and req.start_time_ms is None else None
        configs = {pid: build_config(d / f"rank{r}.json", iterations, start, roundup,
                                     req.duration_ms, req.start_time_ms,
                                     req.warmup_s if req.warmup_s is not None else warmup, req.stack)
                   for pid, r in by_pid.items()}
        m["config"] = next(iter(configs.values()))
        if iterations is not None and req.iterations_per_step is not None:  # both units, for a reader
            span = m.setdefault("steps", {"start": req.start_iteration, "count": req.steps})
            span["kineto"] = {"iterations_per_step": k, "start": start, "roundup": roundup,
                              "count": iterations}
        poll_s = max([self.poll_s, *(daemon.intervals.get(p, 0.0) for p in by_pid)])  # as seen
        arm_for = min(max(3 * poll_s + 2.0, 5.0), deadline - time.monotonic())
        try:
            # either backend's arming
            arming: Arming | DynologArming = daemon.arm(configs, expires_at=self.ctx.clock() + arm_for)
        except ValueError as exc:
            raise CaptureFailed("skipped", f"{BUSY_REASON}: {exc}") from exc
        try:
            arming.wait_answered(timeout=arm_for + 0.5)
            answered = arming.answered()
            why: dict[int, RankMiss] = {}
            for pid, r in by_pid.items():
                if pid in answered:
                    continue
                st = arming.state(pid)
                if st.busy_polls:
                    why[r] = RankMiss(Miss.BUSY, f"rank {r} (pid {pid}): its Kineto profiler was busy "
                                                 "(a trace already running)")
                elif pid in daemon.requests_seen or pid in daemon.sender_pids.values():
                    why[r] = RankMiss(Miss.POLLED_LATE, f"rank {r} (pid {pid}): polled, but not within "
                                                        f"{arm_for:.0f} s")
                else:
                    why[r] = RankMiss(Miss.NEVER_POLLED, f"rank {r} (pid {pid}) never polled the Kineto "
                                                         "daemon: start the job with KINETO_USE_DAEMON=1 "
                                                         "(perfd launch sets it)")
            if not answered:
                late = all(x.why is Miss.POLLED_LATE for x in why.values())
                now = time.time()
                starting = all(x.why is Miss.NEVER_POLLED and _young(pid, now)
                               for pid, r in by_pid.items() if (x := why.get(r)) is not None)
                cause = CaptureFailure.NOT_READY if starting else CaptureFailure.FAILED
                raise CaptureFailed("timeout" if late else "failed", "; ".join(_texts(why)), cause)
            started = m["timings"]["started_at"] = max(answered.values())
            m["answered_at"] = {str(by_pid[p]): t for p, t in answered.items()}
            lat = started - m["timings"]["requested_at"]
            self.ctx.store.write(m)
            got_ranks = sorted(by_pid[p] for p in answered)
            self.ctx.emit(STARTED, req, f"Kineto trace config handed to rank(s) {got_ranks} of job "
                          f"{req.job} {lat:.2f} s after the request", "info", m["id"],
                          {"latency_s": round(lat, 3), "unanswered": _texts(why)})
            missing = dict(why)
            for pid in sorted(answered):
                r = by_pid[pid]
                got = self._wait_trace(daemon, arming, pid, d, r, deadline)
                if got is None:
                    missing[r] = RankMiss(Miss.NO_TRACE, f"rank {r} (pid {pid}): no trace within the "
                                                         f"{req.timeout_s:.0f} s timeout")
                    continue
                t, active = m["timings"], arming.state(pid).active_at
                if active is not None:
                    t["first_event_at"] = min(active, t.get("first_event_at") or active)
                t["trace_ready_at"] = self.ctx.clock()
                self.ctx.store.add_artifact(m, got, "kineto_trace", r, pid)
                miss = record_trace(self.ctx, m, r, got)
                if miss is not None:
                    missing[r] = RankMiss(miss.kind, miss.text)
            if len(missing) == len(by_pid):
                timed_out = any(x.why is Miss.NO_TRACE for x in missing.values())
                raise CaptureFailed("timeout" if timed_out else "failed", "; ".join(_texts(missing)))
            return ("partial: " + "; ".join(_texts(missing))) if missing else ""
        finally:
            if isinstance(daemon, DynologKineto):
                daemon.disarm(arming)
            else:
                assert isinstance(arming, Arming)  # the daemon's own
                daemon.disarm(arming)

    def _wait_trace(self, daemon: KinetoDaemon | DynologKineto, arming: Arming | DynologArming, pid: int,
                    d: Path, rank: int, deadline: float) -> Path | None:
        """The rank's trace once complete: ``rank<r>_<pid>.json`` in the capture folder, or libkineto's
        default ``/tmp/libkineto_activities_<pid>.json`` (a libkineto that refused our path: moved in)."""
        since = arming.answered().get(pid, self.ctx.clock()) - 1.0
        client_pid = next((first for first, snd in dict(daemon.sender_pids).items() if snd == pid), pid)
        fallback = Path(f"/tmp/libkineto_activities_{client_pid}.json")

        def candidates() -> list[Path]:
            found = [p for p in d.glob(f"rank{rank}_*.json*") if trace_complete(p)]
            if not found and fallback.exists() and trace_complete(fallback):
                with contextlib.suppress(OSError):
                    if fallback.stat().st_mtime >= since:
                        found = [fallback]
            return found

        got = wait_stable(candidates, max(0.0, deadline - time.monotonic()), settle_s=self.ctx.settle_s,
                          stop=self.ctx.closing.is_set)
        if not got:
            return None
        path = got[0]
        if path.parent != d:
            path = Path(shutil.move(path, d / f"rank{rank}_{client_pid}.json"))
        return path
