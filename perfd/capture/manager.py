"""The agent's capture executor (docs/design.md §3 "Captures"): ``capture`` commands in;
Kineto, nsys or ncu captures of the targeted ranks, analysed and kept in the
:class:`~perfd.capture.store.CaptureStore`, and events out.

``handle(command)`` returns at once (it runs on the agent's event loop): it validates the arguments
(:mod:`perfd.capture.request` lists them), finds the ranks' processes, refuses a process already
being captured ("busy: one CUPTI client per process"), a rank under ncu asked for Kineto or nsys
(ncu is that process's CUPTI client) and ncu asked for a rank not under it, or a full store, then
runs the capture in a worker thread with a deadline: the tool is chosen here, the run itself is
:class:`~perfd.capture.kineto_capture.KinetoCapture`, :class:`~perfd.capture.nsys_capture.NsysCapture`
or :class:`~perfd.capture.ncu_capture.NcuCapture`, and the manifest and events are written here. A
Kineto capture of ranks whose step hooks say their process polls no Kineto daemon and can trace
itself is :class:`~perfd.capture.hook_trace.HookTraceCapture` (mode ``hook-trace``; the daemon's
is ``on-demand``).

Events (``emit``): ``capture_started``, ``capture_finished``, ``capture_failed``; labels {job, tool,
ranks}, links {capture_id, steps}, a small payload (status, reason, latency, per-rank device
summaries). Latency = command received → the daemon answered the target's poll (Kineto), → ``nsys
start`` returned (session), → the hook reported ``cudaProfilerStart`` (range) or its trace's start.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from perfd.capture.bookkeeping import CaptureFailed, RunContext
from perfd.capture.dynolog import DynologKineto
from perfd.capture.hook_ranges import HookCanceller, HookRanges, HookRequester
from perfd.capture.hook_trace import HOOK_TRACE, HookTraceCapture, HookTracer
from perfd.capture.kineto_capture import KinetoCapture
from perfd.capture.kineto_daemon import KinetoDaemon
from perfd.capture.ncu_capture import NcuCapture, NotUnder, UnderCheck, event_rows, under_ncu
from perfd.capture.ncu_exec import NcuExecutor
from perfd.capture.nsys_capture import NsysCapture
from perfd.capture.nsys_exec import NsysExecutor, session_name
from perfd.capture.request import BUSY_REASON, CaptureArgError, CaptureRequest, parse_command
from perfd.capture.store import CaptureStore, Manifest
from perfd.core.events import CAPTURE_FAILED, CAPTURE_FINISHED
from perfd.core.model import CaptureFailure, CaptureTool

if TYPE_CHECKING:  # the agent passes perfd.transport.codec.Command; anything with these fields will do
    from perfd.transport.codec import Command

log = logging.getLogger(__name__)

PidsForRanks = Callable[[str, tuple[int, ...]], Mapping[int, int]]  # (job, ranks; () = all) -> rank: pid
Emit = Callable[[dict[str, object]], None]  # an event, to the agent's sender


class CaptureManager:
    def __init__(self, store: CaptureStore, kineto: KinetoDaemon | DynologKineto | None = None,
                 nsys: NsysExecutor | None = None,
                 hook_requester: HookRequester | None = None, pids_for_ranks: PidsForRanks | None = None,
                 emit: Emit | None = None, *, clock: Callable[[], float] = time.time,
                 settle_s: float = 1.0, kineto_poll_s: float = 1.0,
                 hook_last_step: Callable[[int], int | None] | None = None,
                 ncu: NcuExecutor | None = None, hook_canceller: HookCanceller | None = None,
                 under_check: UnderCheck = under_ncu, hook_tracer: HookTracer | None = None,
                 hook_can_trace: Callable[[int], bool] | None = None) -> None:
        self.store, self.kineto, self.nsys, self.emit_cb, self.clock = store, kineto, nsys, emit, clock
        self.hook_requester, self.pids_for_ranks = hook_requester, pids_for_ranks
        self.hook_last_step = hook_last_step
        self.settle_s, self.kineto_poll_s = settle_s, kineto_poll_s
        self._lock = threading.Lock()
        self._busy: dict[str, str] = {}  # "pid:N" or "job/rank:N" -> capture id
        self._threads: dict[str, threading.Thread] = {}
        self._closing = threading.Event()
        self.refused = 0
        # reason -> count of what a run refused (a rank's trace past its caps: perfd.core.limits
        # TRACE_REFUSED_REASONS); the agent serves them as perfd_agent_collector_errors_total{collector=
        # "captures"}. Each reason is logged once: a job writing such traces must not flood the log.
        self.errors: dict[str, int] = {}
        self._logged: set[str] = set()
        ctx = RunContext(store, clock, settle_s, self._closing, self._emit, self.count_error)
        self._kineto_runs = KinetoCapture(ctx, kineto, kineto_poll_s)
        self._ranges = HookRanges(ctx, hook_requester, hook_last_step, hook_canceller)
        self._nsys_runs = NsysCapture(ctx, nsys, self._ranges)
        self._ncu_runs = NcuCapture(ctx, ncu, self._ranges, under_check)
        self._hook_traces = HookTraceCapture(ctx, self._ranges, hook_tracer, hook_can_trace, hook_last_step)

    # -- public -------------------------------------------------------------------------------
    def handle(self, command: Command) -> str | None:
        """Start a capture; returns its id, or None when refused (a ``capture_failed`` event and a
        ``skipped`` manifest say why). Never raises, never blocks on the capture."""
        if command.kind != "capture":
            return None  # not a capture: another executor's command
        now = self.clock()
        try:
            req = parse_command(command, now)
        except (CaptureArgError, ValueError, TypeError) as exc:
            return self._refuse(CaptureRequest(job=command.job or "?", ranks=tuple(command.ranks),
                                               command_id=command.id), f"bad arguments: {exc}", now)
        try:
            pids = dict(self.pids_for_ranks(req.job, req.ranks)) if self.pids_for_ranks else {}
        except Exception as exc:
            return self._refuse(req, f"cannot find the ranks' processes: {exc}", now)
        missing = [r for r in req.ranks if r not in pids] if self.pids_for_ranks else []
        pids = {r: p for r, p in pids.items() if not req.ranks or r in req.ranks}
        req.ranks = req.ranks or tuple(sorted(pids))
        if missing or not req.ranks:  # not started yet, or its process not seen here yet: not ready
            which = f"rank(s) {missing}" if missing else "any rank"
            return self._refuse(req, f"no process known for {which} of job {req.job} on this node", now,
                                cause=CaptureFailure.NOT_READY)
        keys = {r: (f"pid:{pids[r]}" if r in pids else f"{req.job}/rank:{r}") for r in req.ranks}
        clash = self._ncu_clash(req, pids)
        if clash is not None:
            return self._refuse(req, clash.why, now, pids, clash.cause)
        quota = self.store.check_quota()
        if quota is not None:
            return self._refuse(req, quota, now, pids)
        with self._lock:
            held = {k: self._busy[k] for k in keys.values() if k in self._busy}
            if not held:
                m = self.store.new_capture(req.job, req.ranks, req.tool,
                                           pids={str(r): p for r, p in pids.items()},
                                           args=dict(command.args or {}), context=req.context,
                                           ignored_args=req.ignored_args, command_id=req.command_id,
                                           steps={"start": req.start_iteration, "count": req.steps})
                m["timings"]["requested_at"] = now
                for k in keys.values():
                    self._busy[k] = m["id"]
                worker = threading.Thread(target=self._run, args=(req, m, pids, set(keys.values())),
                                          name=f"perfd-capture-{m['id']}", daemon=True)
                self._threads[m["id"]] = worker
        if held:
            who = ", ".join(f"{k} by {c}" for k, c in sorted(held.items()))
            return self._refuse(req, f"{BUSY_REASON} ({who})", now, pids)
        worker.start()
        return str(m["id"])

    def on_hook_event(self, event: Mapping[str, object]) -> None:
        """Feed ``hook_profile`` events from the hook collector (step-aligned nsys and ncu ranges)."""
        self._ranges.on_hook_event(event)

    def _ncu_clash(self, req: CaptureRequest, pids: Mapping[int, int]) -> NotUnder | None:
        """Why the request cannot run on these ranks because of ncu: a rank under ncu has ncu as its
        CUPTI client, so Kineto and nsys cannot profile it; ncu can profile only a rank under it."""
        if req.tool == "ncu" and self._ncu_runs.ncu is None:
            return NotUnder("ncu captures are off in this agent (no ncu executor)")
        if self._ncu_runs.ncu is None:
            return None
        for r in req.ranks:
            t, no = self._ncu_runs.target(req.job, r, pids.get(r))
            if req.tool == "ncu" and t is None:
                return no
            if req.tool != "ncu" and t is not None:
                return NotUnder(f"{BUSY_REASON}: rank {r} runs under ncu (pid {t.pid}), its CUPTI client; "
                                "only an ncu capture can profile it")
        return None

    def busy(self) -> dict[str, str]:
        with self._lock:
            return dict(self._busy)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until no capture runs (True), or the timeout (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._threads.values())
            left = None if deadline is None else deadline - time.monotonic()
            if not threads or (left is not None and left <= 0):
                return not threads
            threads[0].join(left)

    def stop(self) -> None:
        """Tell every capture to end now (their waits return; each ends failed, saying so); returns at
        once. ``close`` or ``wait_idle`` then waits for them."""
        self._closing.set()
        self._ranges.wake()

    def close(self, timeout: float = 5.0) -> None:
        self.stop()
        self.wait_idle(timeout)

    def count_error(self, reason: str, detail: str) -> None:
        """Count a refusal under ``reason`` (the capture threads call it), logged once per reason."""
        with self._lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1
            first = reason not in self._logged
            self._logged.add(reason)
        if first:
            log.warning("capture refusal %s: %s (counted; further ones not logged)", reason, detail)

    # -- events -------------------------------------------------------------------------------
    def _emit(self, kind: str, req: CaptureRequest, text: str, severity: str = "info",
              capture_id: str = "", payload: Mapping[str, object] | None = None) -> None:
        labels = {"job": req.job, "tool": req.tool, "ranks": ",".join(map(str, req.ranks))}
        if req.context.get("rule"):
            labels["rule"] = req.context["rule"]
        ev = {"kind": kind, "severity": severity, "time": self.clock(), "job": req.job, "text": text,
              "labels": labels,
              # command_id: the aggregator's id for the request (its /api/captures record);
              # capture_id: this agent's store id (the folder with the artifacts and manifest).
              "links": {"capture_id": capture_id, "command_id": req.command_id, "steps": req.steps_link()},
              "payload": payload or {}}
        if self.emit_cb is not None:
            try:
                self.emit_cb(ev)
            except Exception as exc:
                log.warning("capture manager: emit failed: %s", exc)

    def _refuse(self, req: CaptureRequest, reason: str, now: float,
                pids: Mapping[int, int] | None = None,
                cause: CaptureFailure = CaptureFailure.FAILED) -> str | None:
        self.refused += 1
        cid = ""
        try:
            m = self.store.new_capture(req.job, req.ranks, req.tool, context=req.context,
                                       command_id=req.command_id,
                                       pids={str(r): p for r, p in (pids or {}).items()})
            m["timings"]["requested_at"] = now
            cid = str(self.store.finish(m, "skipped", reason)["id"])
        except Exception as exc:  # a full or broken disk must not hide the refusal itself
            log.warning("capture manager: could not record a refused capture: %s", exc)
        self._emit(CAPTURE_FAILED.name, req,
                   f"capture of job {req.job} ranks {list(req.ranks)} refused: {reason}",
                   "warning", cid, {"status": "skipped", "reason": reason, "cause": cause.value})
        return None

    # -- the worker ---------------------------------------------------------------------------
    def _run(self, req: CaptureRequest, m: Manifest, pids: dict[int, int], keys: set[str]) -> None:
        cid = str(m["id"])
        deadline = time.monotonic() + req.timeout_s
        status, reason = "failed", "internal error"
        cause: CaptureFailure | None = CaptureFailure.FAILED
        try:
            tool, mode, sessions = self._choose(req)
            req.tool = m["tool"] = tool
            m["mode"] = mode
            if tool == "kineto" and mode == HOOK_TRACE:
                reason = self._hook_traces.run(req, m, pids, deadline)
            elif tool == "kineto":
                reason = self._kineto_runs.run(req, m, pids, deadline)
            elif tool == "ncu":
                reason = self._ncu_runs.run(req, m, pids, deadline)
            elif mode == "range":
                reason = self._nsys_runs.run_range(req, m, deadline, sessions)
            else:
                reason = self._nsys_runs.run_session(req, m, deadline, sessions)
            status, cause = "ok", None
        except CaptureFailed as exc:
            status, reason, cause = exc.status, exc.reason, exc.cause
        except Exception as exc:
            log.exception("capture %s failed", cid)
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:  # the processes are free now; the thread leaves _threads at its very end
                for k in keys:
                    if self._busy.get(k) == cid:
                        del self._busy[k]
        try:
            t = m["timings"]
            started = t.get("started_at")
            if started is not None:
                m["latency_s"] = round(started - t["requested_at"], 3)
                fired = req.context.get("fired_at")
                with contextlib.suppress(ValueError):
                    if fired:
                        m["latency_from_firing_s"] = round(started - float(fired), 3)
            final = self.store.finish(m, status, reason or None)
        except Exception as exc:
            log.warning("capture %s: could not write its manifest: %s", cid, exc)
            final = m
        payload: dict[str, object] = {
            "status": status, "reason": reason or None, "latency_s": final.get("latency_s"),
            "mode": final.get("mode"),
            "bytes": sum(int(a.get("bytes") or 0) for a in final.get("artifacts", [])),
            "ranks": {r: {"devices": a.get("summary", []), **event_rows(a, len(final["analysis"]))}
                      for r, a in (final.get("analysis") or {}).items()}}
        if cause is not None:
            payload["cause"] = cause.value
        if "range_overran" in final:
            payload["range_overran"] = bool(final["range_overran"])
        if isinstance(final.get("range_held_s"), int | float):
            payload["range_held_s"] = float(final["range_held_s"])
        ready = (final.get("timings") or {}).get("trace_ready_at")
        if isinstance(ready, int | float) and not isinstance(ready, bool):
            # the ranks' part ended then (their trace written); the analysis after it is the agent's: the
            # iterations the capture disturbed end here, not at this event
            payload["trace_ready_at"] = float(ready)
        armed = {r: t.get("started_at") for r, t in (final.get("ncu") or {}).items() if isinstance(t, dict)}
        if armed:  # when each rank's process started under ncu: the aggregator measures what it costs
            payload["ncu_armed_at"] = armed
        ok = status == "ok"
        outcome = ("finished" + (f" ({reason})" if reason else "")) if ok else f"{status}: {reason}"
        kind = CAPTURE_FINISHED if ok else CAPTURE_FAILED
        self._emit(kind.name, req, f"{req.tool} capture {cid} of job "
                   f"{req.job} ranks {list(req.ranks)} {outcome}", "info" if ok else "warning", cid, payload)
        with self._lock:
            self._threads.pop(cid, None)

    def _choose(self, req: CaptureRequest) -> tuple[CaptureTool, str, list[str]]:
        want = req.tool
        if want == "ncu":  # never picked by "auto": a rank under ncu asks for it by name (admission)
            return "ncu", "range", []
        if want in ("nsys", "auto") and self.nsys is not None and self.nsys.available() is None:
            have = self._nsys_runs.listed_sessions()
            per_rank = [session_name(req.job, r) for r in req.ranks]
            # Steps asked for, each rank in its own session, a hook to open the range: a step-aligned
            # range in the session (reported when it closes; nsys_exec mode 2).
            steps = req.mode == "range" or (req.mode is None and req.duration_ms is None)
            if (steps and self.hook_requester is not None and per_rank and have is not None
                    and all(s in have for s in per_rank)):
                return "nsys", "range", per_rank
            if req.mode == "range" or (req.mode is None and self._nsys_runs.range_ready(req)):
                if self.hook_requester is None or self.nsys.range_dir is None:
                    raise CaptureFailed("failed", "nsys range captures need the step hook and either "
                                                  "per-rank sessions (perfd nsys-prefix) or a range "
                                                  "directory")
                return "nsys", "range", []
            sessions = self._nsys_runs.sessions_for(req, have)
            if req.mode == "session" or want == "nsys" or sessions:
                return "nsys", "session", sessions
        if want == "nsys":
            why = self.nsys.available() if self.nsys is not None else "no nsys executor in this agent"
            raise CaptureFailed("failed", f"nsys unavailable: {why}")
        if self._hook_traces.fits(req.ranks):
            # The ranks' processes poll no Kineto daemon (started without --kineto) and their hooks can
            # trace: the hooks open the Kineto trace (a daemon's config would never be polled).
            return "kineto", HOOK_TRACE, []
        if self.kineto is None:
            raise CaptureFailed("failed", "no capture mechanism: the Kineto daemon is off in this agent and "
                                          "the job is not under a perfd nsys session")
        return "kineto", "on-demand", []

    def list(self, job: str | None = None, limit: int | None = None) -> list[Manifest]:
        return self.store.list(job, limit)
