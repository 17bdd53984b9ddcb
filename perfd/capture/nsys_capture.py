"""An nsys capture's run (the manager's worker calls :meth:`NsysCapture.run_session` or
:meth:`NsysCapture.run_range`): a time window on the job's or the ranks' nsys sessions, or a
step-aligned range opened by each rank's step hook (:class:`~perfd.capture.hook_ranges.HookRanges`,
shared with ncu); then each report exported and analysed. Also the session look-ups the manager's
tool choice asks. Apart from the manager, which only admits requests, picks the tool and keeps the
bookkeeping; the nsys calls themselves are :mod:`perfd.capture.nsys_exec`.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, device_summary
from perfd.capture.hook_ranges import HookRanges
from perfd.capture.nsys_exec import (
    NsysError,
    NsysExecutor,
    range_reports,
    report_path,
    session_name,
    wait_stable,
)
from perfd.capture.request import CaptureRequest
from perfd.capture.store import Manifest

log = logging.getLogger(__name__)


def _reports(base: Path, since: float) -> list[Path]:
    return sorted(range_reports(base, since).values())


def _existing(path: Path) -> list[Path]:
    return [path] if path.exists() else []


class NsysCapture:
    def __init__(self, ctx: RunContext, nsys: NsysExecutor | None, ranges: HookRanges) -> None:
        self.ctx, self.nsys, self.ranges = ctx, nsys, ranges

    # -- sessions (the manager's tool choice) -----------------------------------------------------
    def range_ready(self, req: CaptureRequest) -> bool:
        """The job runs under a perfd range profile: its range directory exists."""
        if self.nsys is None or self.nsys.range_dir is None or not self.ranges.available:
            return False
        base = self.nsys.range_base(req.job, req.ranks[0])
        return base is not None and base.parent.is_dir()

    def listed_sessions(self) -> set[str] | None:
        """The nsys sessions on this node, or None when ``nsys sessions list`` failed."""
        assert self.nsys is not None
        try:
            return set(self.nsys.sessions())
        except NsysError as exc:
            log.info("nsys sessions list failed: %s", exc)
            return None

    def sessions_for(self, req: CaptureRequest, have: set[str] | None) -> list[str]:
        """The nsys sessions to start: one per rank when each rank has its own, else the job's."""
        # Asked for nsys by name: try the job's session even when the listing did not show it
        # (``nsys start`` then says plainly what is wrong).
        fallback = [session_name(req.job)] if req.tool == "nsys" else []
        if have is None:
            return fallback
        per_rank = [session_name(req.job, r) for r in req.ranks]
        if per_rank and all(s in have for s in per_rank):
            return per_rank
        return [session_name(req.job)] if session_name(req.job) in have else fallback

    # -- runs ---------------------------------------------------------------------------------
    def run_session(self, req: CaptureRequest, m: Manifest, deadline: float,
                    sessions: list[str]) -> str:
        nsys = self.nsys
        assert nsys is not None
        if not sessions:
            raise CaptureFailed("failed", f"no nsys session {session_name(req.job)} (or per-rank sessions) "
                                          "on this node: start the job with perfd launch --nsys")
        m["sessions"] = sessions
        if len(sessions) == 1 and sessions[0] == session_name(req.job):
            m["scope"] = "job session: every process of the job under it on this node"
        d = self.ctx.store.capture_dir(m["id"])

        def started(t: float) -> None:
            m["timings"]["started_at"] = m["timings"]["first_event_at"] = t
            self.ctx.store.write(m)
            lat = t - m["timings"]["requested_at"]
            self.ctx.emit(STARTED, req, f"nsys collection on {', '.join(sessions)} started "
                          f"{lat:.2f} s after the request", "info", m["id"], {"latency_s": round(lat, 3)})

        window_s = min((req.duration_ms or 3000) / 1000.0, max(0.0, deadline - time.monotonic()))
        try:
            reports, errors = nsys.run_window(sessions, d, window_s, self.ctx.closing.wait, started,
                                              max(30.0, deadline - time.monotonic()))
        except NsysError as exc:
            raise CaptureFailed("failed", f"{exc} (is the job running under perfd launch --nsys, session "
                                          f"{', '.join(sessions)}?)") from exc
        for session, rep in reports.items():
            m["timings"]["trace_ready_at"] = self.ctx.clock()
            self._export(m, rep, session, req)
        if not reports:
            raise CaptureFailed("failed", "; ".join(errors))
        return "; ".join(errors)

    def _export(self, m: Manifest, rep: Path, key: str, req: CaptureRequest) -> None:
        assert self.nsys is not None
        rank = req.ranks[0] if len(req.ranks) == 1 else None
        self.ctx.store.add_artifact(m, rep, "nsys_report", rank)
        try:
            sqlite = self.nsys.export(rep)
        except Exception as exc:
            m.setdefault("analysis", {})[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        self.ctx.store.add_artifact(m, sqlite, "nsys_sqlite", rank)  # kept whatever its analysis says
        from perfd.capture.nsys_sqlite import analyze_nsys  # the analysis: only here (as nsys_exec's)

        try:
            a = analyze_nsys(sqlite)
        except Exception as exc:  # an empty window (TraceEmpty), or an export it cannot read: said
            m.setdefault("analysis", {})[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        m.setdefault("analysis", {})[key] = {**a.to_json(), "summary": device_summary(a)}

    def run_range(self, req: CaptureRequest, m: Manifest, deadline: float,
                  sessions: list[str]) -> str:
        """A step-aligned range on each rank: in the rank's session when ``sessions`` (one per rank,
        armed here with ``nsys start -c cudaProfilerApi``), else under the rank's range profile."""
        nsys = self.nsys
        assert nsys is not None
        d = self.ctx.store.capture_dir(m["id"])
        armed: dict[int, str] = {}
        if sessions:
            m["sessions"] = sessions
            try:
                for r, s in zip(req.ranks, sessions, strict=True):
                    nsys.start_range(s, d / f"rank{r}")
                    armed[r] = s
            except NsysError as exc:
                for s in armed.values():
                    nsys.cancel(s)
                raise CaptureFailed("failed", f"{exc} (is rank {req.ranks[len(armed)]} running under "
                                              "perfd nsys-prefix?)") from exc
        try:
            self.ranges.forget(self.ranges.open(req, m, deadline).values())  # nsys watches its file now
        except CaptureFailed:
            for s in armed.values():  # a session left armed would record the next range nobody asked for
                nsys.cancel(s)
            raise
        problems = []
        for r in req.ranks:
            if r in armed:
                rep = report_path(d / f"rank{r}")
                got = wait_stable(functools.partial(_existing, rep), max(0.0, deadline - time.monotonic()),
                                  settle_s=self.ctx.settle_s, stop=self.ctx.closing.is_set)
                if not got:
                    nsys.cancel(armed[r])
                    problems.append(f"rank {r}: session {armed[r]} wrote no report before the timeout")
                    continue
                dest = got[-1]
            else:
                base = nsys.range_base(req.job, r)
                assert base is not None
                got = wait_stable(functools.partial(_reports, base, m["timings"]["requested_at"] - 1.0),
                                  max(0.0, deadline - time.monotonic()), settle_s=self.ctx.settle_s,
                                  stop=self.ctx.closing.is_set)
                if not got:
                    problems.append(f"rank {r}: no report under {base.parent} before the timeout (a "
                                    "range profile writes its reports when the process exits; per-rank "
                                    "sessions report at once: perfd nsys-prefix)")
                    continue
                rep = got[-1]
                dest = d / f"rank{r}_{rep.name}"
                rep.replace(dest)
            m["timings"]["trace_ready_at"] = self.ctx.clock()
            self._export(m, dest, str(r), CaptureRequest(req.job, (r,)))
        if len(problems) == len(req.ranks):
            raise CaptureFailed("timeout", "; ".join(problems))
        return "; ".join(problems)
