"""An nsys capture's run (the manager's worker calls :meth:`NsysCapture.run_session` or
:meth:`NsysCapture.run_range`): a time window on the job's or the ranks' nsys sessions, or a
step-aligned range opened by each rank's step hook, whose ``hook_profile`` events arrive here; then
each report exported and analysed. Also the session look-ups the manager's tool choice asks. Apart
from the manager, which only admits requests, picks the tool and keeps the bookkeeping; the nsys
calls themselves are :mod:`perfd.capture.nsys_exec`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfd.capture.bookkeeping import STARTED, CaptureFailed, RunContext, device_summary
from perfd.capture.nsys_exec import (
    NsysError,
    NsysExecutor,
    range_reports,
    report_path,
    session_name,
    wait_stable,
)
from perfd.capture.request import CaptureRequest
from perfd.events import HOOK_PROFILE

log = logging.getLogger(__name__)

HookRequester = Callable[[int, int, int], "int | None"]  # (rank, start_step, num_steps) -> request id


def next_range_start(last_step: int | None) -> int:
    """The step a hook range asked for now starts at: two past the rank's last reported step (the
    hook polls every 50 ms and its records arrive batched, so the next step may already be under
    way; a start that has passed begins at the hook's next step, and its status says which)."""
    return last_step + 2 if last_step is not None else 0


def _reports(base: Path, since: float) -> list[Path]:
    return sorted(range_reports(base, since).values())


def _existing(path: Path) -> list[Path]:
    return [path] if path.exists() else []


class NsysCapture:
    def __init__(self, ctx: RunContext, nsys: NsysExecutor | None, hook_requester: HookRequester | None,
                 hook_last_step: Callable[[int], int | None] | None) -> None:
        self.ctx, self.nsys = ctx, nsys
        self.hook_requester, self.hook_last_step = hook_requester, hook_last_step
        self._hook_events: dict[int, list[dict[str, Any]]] = {}
        self._hook_cond = threading.Condition()

    def on_hook_event(self, event: Mapping[str, Any]) -> None:
        """Feed ``hook_profile`` events from the hook collector (step-aligned nsys ranges)."""
        if event.get("kind") != HOOK_PROFILE.name:
            return
        with self._hook_cond, contextlib.suppress(TypeError, ValueError):
            self._hook_events.setdefault(int(event.get("request_id", -1)), []).append(dict(event))
            self._hook_cond.notify_all()

    def wake(self) -> None:
        """Wake every wait for the hook (the manager is closing)."""
        with self._hook_cond:
            self._hook_cond.notify_all()

    # -- sessions (the manager's tool choice) -----------------------------------------------------
    def range_ready(self, req: CaptureRequest) -> bool:
        """The job runs under a perfd range profile: its range directory exists."""
        if self.nsys is None or self.nsys.range_dir is None or self.hook_requester is None:
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
    def run_session(self, req: CaptureRequest, m: dict[str, Any], deadline: float,
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

    def _export(self, m: dict[str, Any], rep: Path, key: str, req: CaptureRequest) -> None:
        assert self.nsys is not None
        rank = req.ranks[0] if len(req.ranks) == 1 else None
        self.ctx.store.add_artifact(m, rep, "nsys_report", rank)
        try:
            sqlite, a = self.nsys.export_and_analyze(rep)
        except Exception as exc:
            m.setdefault("analysis", {})[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        self.ctx.store.add_artifact(m, sqlite, "nsys_sqlite", rank)
        m.setdefault("analysis", {})[key] = {**a.to_json(), "summary": device_summary(a)}

    def run_range(self, req: CaptureRequest, m: dict[str, Any], deadline: float,
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
            self._open_ranges(req, m, deadline)
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

    def _open_ranges(self, req: CaptureRequest, m: dict[str, Any], deadline: float) -> None:
        """Ask each rank's step hook for the range and wait until every one reported its start."""
        ask = self.hook_requester
        assert ask is not None
        requests: dict[int, int] = {}
        for r in req.ranks:
            start = req.start_iteration
            if start is None:
                start = next_range_start(self.hook_last_step(r) if self.hook_last_step is not None else None)
            rid = ask(r, start, req.steps)
            if rid is None:
                raise CaptureFailed("failed", f"rank {r}: the step hook is unreachable "
                                              "(no hook records from it yet?)")
            requests[r] = rid
        states = self._wait_hook(requests, {"started"}, deadline)
        bad = {r: s for r, s in states.items() if s.get("state") in ("rejected", "failed", "cancelled")}
        if bad:
            raise CaptureFailed("failed", "; ".join(f"rank {r}: the hook {s['state']} the profile range at "
                                                    f"step {s.get('step')}" for r, s in sorted(bad.items())))
        if len(states) < len(requests):
            late = sorted(set(requests) - set(states))
            raise CaptureFailed("timeout", f"rank(s) {late}: no cudaProfilerStart before the "
                                           f"{req.timeout_s:.0f} s timeout"
                                           f"{self._range_progress(late, requests)}")
        m["timings"]["started_at"] = m["timings"]["first_event_at"] = max(
            float(s.get("time") or self.ctx.clock()) for s in states.values())
        m["steps"] = {"start": min(int(s.get("step", 0)) for s in states.values()), "count": req.steps}
        lat = m["timings"]["started_at"] - m["timings"]["requested_at"]
        self.ctx.store.write(m)
        self.ctx.emit(STARTED, req, f"cudaProfilerStart on rank(s) {sorted(states)} {lat:.2f} s after "
                      "the request", "info", m["id"], {"latency_s": round(lat, 3)})

    def _range_progress(self, ranks: Sequence[int], requests: Mapping[int, int]) -> str:
        """Why a range may not have opened: per rank, the step its hook accepted against the last
        step it reported (a loop whose step numbers stop advancing never reaches the start)."""
        parts = []
        with self._hook_cond:
            for r in ranks:
                events = self._hook_events.get(requests[r], [])
                acc = next((e for e in events if e.get("state") == "accepted"), None)
                last = self.hook_last_step(r) if self.hook_last_step is not None else None
                if acc is None:
                    parts.append(f"rank {r}: the hook never answered the request")
                else:
                    parts.append(f"rank {r}: accepted for step {acc.get('step')}, last step reported {last}")
        return f" ({'; '.join(parts)})" if parts else ""

    def _wait_hook(self, requests: Mapping[int, int], want: Iterable[str],
                   deadline: float) -> dict[int, dict[str, Any]]:
        """Per rank, the first hook event for its request in ``want`` or a refusal; until the deadline."""
        want = set(want) | {"rejected", "failed", "cancelled"}
        out: dict[int, dict[str, Any]] = {}
        with self._hook_cond:
            while len(out) < len(requests) and not self.ctx.closing.is_set():
                for r, rid in requests.items():
                    if r not in out:
                        events = self._hook_events.get(rid, [])
                        hit = next((e for e in events if e.get("state") in want), None)
                        if hit is not None:
                            out[r] = hit
                left = deadline - time.monotonic()
                if len(out) == len(requests) or left <= 0:
                    break
                self._hook_cond.wait(min(left, 0.5))
        return out

