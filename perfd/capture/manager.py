"""The agent's capture executor (DESIGN.md §3 "Captures", issue 5 item 3): ``capture`` commands in;
Kineto or nsys captures of the targeted ranks, analysed and kept in the
:class:`~perfd.capture.store.CaptureStore`, and events out.

``handle(command)`` returns at once (it runs on the agent's event loop): it validates the arguments,
finds the ranks' processes, refuses a process already being captured ("busy: one CUPTI client per
process") or a full store, then runs the capture in a worker thread with a deadline.

Arguments (strings; ``Command.ranks`` names the ranks, empty = every rank known here): ``tool``
kineto | nsys | auto (nsys when the job runs under a perfd nsys session or range profile, else
Kineto); ``steps`` (3); ``start_iteration`` ``next`` or N (Kineto counts optimizer steps from the
process start, the hook the steps it is given; for the same iteration on every rank give N, or
``roundup=R``: Kineto starts at the next multiple of R, so pick R above the poll period in steps);
``duration_ms`` (a time window instead; nsys sessions always use one, 3000 by default);
``start_time_ms`` (epoch ms, the same start on every node, Kineto); ``warmup_s``; ``mode`` session |
range (nsys); ``timeout_s`` (120). Copied to the manifest: ``rule``, ``firing``, ``fired_at`` (epoch
s: the latency from the firing is recorded too), ``reason``, ``requested_by``, ``source``. No
argument is a path (the agent picks every path, under its store), nothing runs through a shell;
unknown keys are ignored and listed in the manifest.

Events (``emit``): ``capture_started``, ``capture_finished``, ``capture_failed``; labels {job, tool,
ranks}, links {capture_id, steps}, a small payload (status, reason, latency, per-rank device
summaries). Latency = command received → the daemon answered the target's poll (Kineto), → ``nsys
start`` returned (session), → the hook reported ``cudaProfilerStart`` (range).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfd.capture.analysis import CaptureAnalysis
from perfd.capture.chrome_trace import analyze_chrome_trace
from perfd.capture.dynolog import DynologKineto
from perfd.capture.kineto_daemon import KinetoDaemon, build_config, trace_complete
from perfd.capture.nsys_exec import (
    NsysError,
    NsysExecutor,
    range_reports,
    report_path,
    session_name,
    wait_stable,
)
from perfd.capture.store import CaptureStore
from perfd.events import CAPTURE_FAILED, CAPTURE_FINISHED, CAPTURE_STARTED, HOOK_PROFILE
from perfd.model import CAPTURE_TOOLS

if TYPE_CHECKING:  # the agent passes perfd.transport.codec.Command; anything with these fields will do
    from perfd.transport.codec import Command

log = logging.getLogger(__name__)
STARTED = CAPTURE_STARTED.name

PidsForRanks = Callable[[str, tuple[int, ...]], Mapping[int, int]]  # (job, ranks; () = all) -> rank: pid
HookRequester = Callable[[int, int, int], "int | None"]  # (rank, start_step, num_steps) -> request id
Emit = Callable[[dict[str, Any]], None]

TOOLS = CAPTURE_TOOLS
INFO_KEYS = ("rule", "firing", "fired_at", "reason", "requested_by", "source")
# A device breakdown travels whole in the capture's events but for its tables (the aggregator's
# diagnosis reads every number: a list of kept keys here once dropped the idle-gap split on the way).
_TABLE_KEYS = frozenset({"top_kernels", "nvtx"})
BUSY_REASON = "busy: one CUPTI client per process"


class CaptureArgError(ValueError):
    pass


@dataclass
class CaptureRequest:
    """A validated capture command."""

    job: str
    ranks: tuple[int, ...]
    tool: str = "auto"
    steps: int = 3
    start_iteration: int | None = None  # None: the next iteration
    roundup: int = 1
    duration_ms: int | None = None
    start_time_ms: int | None = None
    warmup_s: int | None = None
    mode: str | None = None  # nsys: session | range
    timeout_s: float = 120.0
    command_id: str = ""
    context: dict[str, str] = field(default_factory=dict)
    ignored_args: list[str] = field(default_factory=list)

    def steps_link(self) -> str:
        if self.duration_ms is not None and self.mode != "range" and self.start_iteration is None:
            return f"{self.duration_ms}ms"
        if self.start_iteration is None:
            return f"next+{self.steps}"
        return f"{self.start_iteration}-{self.start_iteration + self.steps - 1}"


def _int(args: Mapping[str, str], key: str, lo: int, hi: int) -> int | None:
    raw = args.get(key)
    if raw is None or raw == "":
        return None
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise CaptureArgError(f"{key}={raw!r} is not an integer") from None
    if not lo <= v <= hi:
        raise CaptureArgError(f"{key}={v} is outside [{lo}, {hi}]")
    return v


def parse_command(cmd: Command, now: float) -> CaptureRequest:
    """Validate a ``capture`` command's arguments (CaptureArgError says which and why)."""
    args = {str(k): str(v) for k, v in (cmd.args or {}).items()}
    if not cmd.job:
        raise CaptureArgError("no job")
    for key in args:
        if any(w in key.lower() for w in ("path", "file", "dir", "output")):
            raise CaptureArgError(f"argument {key!r} names a path: the agent chooses every path (its store)")
    tool = args.get("tool", "auto").strip().lower() or "auto"
    if tool not in TOOLS:
        raise CaptureArgError(f"tool={tool!r}: one of {', '.join(TOOLS)}")
    ranks = tuple(sorted({int(r) for r in cmd.ranks}))
    if any(r < 0 for r in ranks):
        raise CaptureArgError("ranks must be >= 0")
    start_raw = args.get("start_iteration", "next").strip().lower()
    start = None if start_raw in ("", "next") else _int(args, "start_iteration", 0, 2**31 - 1)
    mode = args.get("mode", "").strip().lower() or None
    if mode not in (None, "session", "range"):
        raise CaptureArgError(f"mode={mode!r}: session or range")
    start_time = _int(args, "start_time_ms", 0, 2**62)
    if start_time is not None and not now * 1000 - 1000 <= start_time <= now * 1000 + 3_600_000:
        raise CaptureArgError("start_time_ms must lie within the next hour (epoch milliseconds)")
    timeout = args.get("timeout_s")
    try:
        timeout_s = 120.0 if timeout in (None, "") else float(str(timeout))
    except ValueError:
        raise CaptureArgError(f"timeout_s={timeout!r} is not a number") from None
    if not (math.isfinite(timeout_s) and 1.0 <= timeout_s <= 3600.0):
        raise CaptureArgError("timeout_s must be within [1, 3600]")
    known = {"tool", "steps", "start_iteration", "roundup", "duration_ms", "start_time_ms", "warmup_s",
             "mode", "timeout_s", *INFO_KEYS}
    return CaptureRequest(
        job=cmd.job, ranks=ranks, tool=tool, steps=_int(args, "steps", 1, 1000) or 3, start_iteration=start,
        roundup=_int(args, "roundup", 1, 1_000_000) or 1, duration_ms=_int(args, "duration_ms", 1, 600_000),
        start_time_ms=start_time, warmup_s=_int(args, "warmup_s", 0, 600), mode=mode, timeout_s=timeout_s,
        command_id=cmd.id, context={k: args[k][:500] for k in INFO_KEYS if k in args},
        ignored_args=sorted(set(args) - known))


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    return {k: _rounded(x) for k, x in v.items()} if isinstance(v, dict) else v


def device_summary(analysis: CaptureAnalysis) -> list[dict[str, Any]]:
    """The per-device numbers of an analysis, without the kernel and NVTX tables (event payloads)."""
    out = []
    for d in analysis.to_json()["devices"]:  # type: ignore[attr-defined]
        row = {k: _rounded(v) for k, v in d.items() if k not in _TABLE_KEYS}
        if d.get("top_kernels"):
            row["top_kernel"] = d["top_kernels"][0]["name"][:120]
        out.append(row)
    return out


class _Failed(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def next_range_start(last_step: int | None) -> int:
    """The step a hook range asked for now starts at: two past the rank's last reported step (the
    hook polls every 50 ms and its records arrive batched, so the next step may already be under
    way; a start that has passed begins at the hook's next step, and its status says which)."""
    return last_step + 2 if last_step is not None else 0


def _reports(base: Path, since: float) -> list[Path]:
    return sorted(range_reports(base, since).values())


def _existing(path: Path) -> list[Path]:
    return [path] if path.exists() else []


class CaptureManager:
    def __init__(self, store: CaptureStore, kineto: KinetoDaemon | DynologKineto | None = None,
                 nsys: NsysExecutor | None = None,
                 hook_requester: HookRequester | None = None, pids_for_ranks: PidsForRanks | None = None,
                 emit: Emit | None = None, *, clock: Callable[[], float] = time.time,
                 settle_s: float = 1.0, kineto_poll_s: float = 1.0,
                 hook_last_step: Callable[[int], int | None] | None = None) -> None:
        self.store, self.kineto, self.nsys, self.emit_cb, self.clock = store, kineto, nsys, emit, clock
        self.hook_requester, self.pids_for_ranks = hook_requester, pids_for_ranks
        self.hook_last_step = hook_last_step
        self.settle_s, self.kineto_poll_s = settle_s, kineto_poll_s
        self._lock = threading.Lock()
        self._busy: dict[str, str] = {}  # "pid:N" or "job/rank:N" -> capture id
        self._threads: dict[str, threading.Thread] = {}
        self._hook_events: dict[int, list[dict[str, Any]]] = {}
        self._hook_cond = threading.Condition()
        self._closing = threading.Event()
        self.refused = 0

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
        if missing or not req.ranks:
            which = f"rank(s) {missing}" if missing else "any rank"
            return self._refuse(req, f"no process known for {which} of job {req.job} on this node", now)
        keys = {r: (f"pid:{pids[r]}" if r in pids else f"{req.job}/rank:{r}") for r in req.ranks}
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

    def on_hook_event(self, event: Mapping[str, Any]) -> None:
        """Feed ``hook_profile`` events from the hook collector (step-aligned nsys ranges)."""
        if event.get("kind") != HOOK_PROFILE.name:
            return
        with self._hook_cond, contextlib.suppress(TypeError, ValueError):
            self._hook_events.setdefault(int(event.get("request_id", -1)), []).append(dict(event))
            self._hook_cond.notify_all()

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

    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        with self._hook_cond:
            self._hook_cond.notify_all()
        self.wait_idle(timeout)

    # -- events -------------------------------------------------------------------------------
    def _emit(self, kind: str, req: CaptureRequest, text: str, severity: str = "info",
              capture_id: str = "", payload: dict[str, Any] | None = None) -> None:
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
                pids: Mapping[int, int] | None = None) -> str | None:
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
                   "warning", cid, {"status": "skipped", "reason": reason})
        return None

    # -- the worker ---------------------------------------------------------------------------
    def _run(self, req: CaptureRequest, m: dict[str, Any], pids: dict[int, int], keys: set[str]) -> None:
        cid = str(m["id"])
        deadline = time.monotonic() + req.timeout_s
        status, reason = "failed", "internal error"
        try:
            tool, mode, sessions = self._choose(req)
            req.tool = m["tool"] = tool
            m["mode"] = mode
            if tool == "kineto":
                reason = self._kineto(req, m, pids, deadline)
            elif mode == "range":
                reason = self._nsys_range(req, m, deadline, sessions)
            else:
                reason = self._nsys_session(req, m, deadline, sessions)
            status = "ok"
        except _Failed as exc:
            status, reason = exc.status, exc.reason
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
            if t.get("started_at") is not None:
                m["latency_s"] = round(t["started_at"] - t["requested_at"], 3)
                fired = req.context.get("fired_at")
                with contextlib.suppress(ValueError):
                    if fired:
                        m["latency_from_firing_s"] = round(t["started_at"] - float(fired), 3)
            final = self.store.finish(m, status, reason or None)
        except Exception as exc:
            log.warning("capture %s: could not write its manifest: %s", cid, exc)
            final = m
        payload = {"status": status, "reason": reason or None, "latency_s": final.get("latency_s"),
                   "mode": final.get("mode"),
                   "bytes": sum(int(a.get("bytes") or 0) for a in final.get("artifacts", [])),
                   "ranks": {r: {"devices": a.get("summary", [])}
                             for r, a in (final.get("analysis") or {}).items()}}
        ok = status == "ok"
        outcome = ("finished" + (f" ({reason})" if reason else "")) if ok else f"{status}: {reason}"
        kind = CAPTURE_FINISHED if ok else CAPTURE_FAILED
        self._emit(kind.name, req, f"{req.tool} capture {cid} of job "
                   f"{req.job} ranks {list(req.ranks)} {outcome}", "info" if ok else "warning", cid, payload)
        with self._lock:
            self._threads.pop(cid, None)

    def _choose(self, req: CaptureRequest) -> tuple[str, str, list[str]]:
        want = req.tool
        if want in ("nsys", "auto") and self.nsys is not None and self.nsys.available() is None:
            have = self._listed_sessions()
            per_rank = [session_name(req.job, r) for r in req.ranks]
            # Steps asked for, each rank in its own session, a hook to open the range: a step-aligned
            # range in the session (reported when it closes; nsys_exec mode 2).
            steps = req.mode == "range" or (req.mode is None and req.duration_ms is None)
            if (steps and self.hook_requester is not None and per_rank and have is not None
                    and all(s in have for s in per_rank)):
                return "nsys", "range", per_rank
            if req.mode == "range" or (req.mode is None and self._range_ready(req)):
                if self.hook_requester is None or self.nsys.range_dir is None:
                    raise _Failed("failed", "nsys range captures need the step hook and either per-rank "
                                            "sessions (perfd nsys-prefix) or a range directory")
                return "nsys", "range", []
            sessions = self._sessions_for(req, have)
            if req.mode == "session" or want == "nsys" or sessions:
                return "nsys", "session", sessions
        if want == "nsys":
            why = self.nsys.available() if self.nsys is not None else "no nsys executor in this agent"
            raise _Failed("failed", f"nsys unavailable: {why}")
        if self.kineto is None:
            raise _Failed("failed", "no capture mechanism: the Kineto daemon is off in this agent and the "
                                    "job is not under a perfd nsys session")
        return "kineto", "on-demand", []

    def _range_ready(self, req: CaptureRequest) -> bool:
        """The job runs under a perfd range profile: its range directory exists."""
        if self.nsys is None or self.nsys.range_dir is None or self.hook_requester is None:
            return False
        base = self.nsys.range_base(req.job, req.ranks[0])
        return base is not None and base.parent.is_dir()

    def _listed_sessions(self) -> set[str] | None:
        """The nsys sessions on this node, or None when ``nsys sessions list`` failed."""
        assert self.nsys is not None
        try:
            return set(self.nsys.sessions())
        except NsysError as exc:
            log.info("nsys sessions list failed: %s", exc)
            return None

    def _sessions_for(self, req: CaptureRequest, have: set[str] | None) -> list[str]:
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

    # -- Kineto -------------------------------------------------------------------------------
    def _kineto(self, req: CaptureRequest, m: dict[str, Any], pids: dict[int, int], deadline: float) -> str:
        daemon = self.kineto
        assert daemon is not None
        if not pids:
            raise _Failed("failed", "Kineto captures need the ranks' process ids (no process finder)")
        d = self.store.capture_dir(m["id"])
        by_pid = {pids[r]: r for r in req.ranks}
        iterations = None if req.duration_ms is not None and req.start_iteration is None else req.steps
        # A window starting now needs no warm-up wait (Kineto's default is seconds of it).
        warmup = 0 if iterations is None and req.start_time_ms is None else None
        configs = {pid: build_config(d / f"rank{r}.json", iterations, req.start_iteration, req.roundup,
                                     req.duration_ms, req.start_time_ms,
                                     req.warmup_s if req.warmup_s is not None else warmup)
                   for pid, r in by_pid.items()}
        m["config"] = next(iter(configs.values()))
        poll_s = max([self.kineto_poll_s, *(daemon.intervals.get(p, 0.0) for p in by_pid)])  # as seen
        arm_for = min(max(3 * poll_s + 2.0, 5.0), deadline - time.monotonic())
        try:
            arming: Any = daemon.arm(configs, expires_at=self.clock() + arm_for)  # either backend's arming
        except ValueError as exc:
            raise _Failed("skipped", f"{BUSY_REASON}: {exc}") from exc
        try:
            arming.wait_answered(timeout=arm_for + 0.5)
            answered = arming.answered()
            why: dict[int, str] = {}
            for pid, r in by_pid.items():
                if pid in answered:
                    continue
                st = arming.state(pid)
                if st.busy_polls:
                    why[r] = f"rank {r} (pid {pid}): its Kineto profiler was busy (a trace already running)"
                elif pid in daemon.requests_seen or pid in daemon.sender_pids.values():
                    why[r] = f"rank {r} (pid {pid}): polled, but not within {arm_for:.0f} s"
                else:
                    why[r] = (f"rank {r} (pid {pid}) never polled the Kineto daemon: start the job with "
                              "KINETO_USE_DAEMON=1 (perfd launch sets it)")
            if not answered:
                raise _Failed("timeout" if all("polled, but" in w for w in why.values()) else "failed",
                              "; ".join(why.values()))
            m["timings"]["started_at"] = max(answered.values())
            m["answered_at"] = {str(by_pid[p]): t for p, t in answered.items()}
            lat = m["timings"]["started_at"] - m["timings"]["requested_at"]
            self.store.write(m)
            got_ranks = sorted(by_pid[p] for p in answered)
            self._emit(STARTED, req, f"Kineto trace config handed to rank(s) {got_ranks} of job "
                       f"{req.job} {lat:.2f} s after the request", "info", m["id"],
                       {"latency_s": round(lat, 3), "unanswered": list(why.values())})
            missing = dict(why)
            for pid in sorted(answered):
                r = by_pid[pid]
                got = self._wait_kineto_trace(daemon, arming, pid, d, r, deadline)
                if got is None:
                    missing[r] = f"rank {r} (pid {pid}): no trace within the {req.timeout_s:.0f} s timeout"
                    continue
                t, active = m["timings"], arming.state(pid).active_at
                if active is not None:
                    t["first_event_at"] = min(active, t.get("first_event_at") or active)
                t["trace_ready_at"] = self.clock()
                self.store.add_artifact(m, got, "kineto_trace", r, pid)
                self._analyze(m, r, functools.partial(analyze_chrome_trace, got))
            if len(missing) == len(by_pid):
                timed_out = any("timeout" in w for w in missing.values())
                raise _Failed("timeout" if timed_out else "failed", "; ".join(missing.values()))
            return ("partial: " + "; ".join(missing.values())) if missing else ""
        finally:
            daemon.disarm(arming)

    def _wait_kineto_trace(self, daemon: KinetoDaemon | DynologKineto, arming: Any, pid: int, d: Path,
                           rank: int, deadline: float) -> Path | None:
        """The rank's trace once complete: ``rank<r>_<pid>.json`` in the capture folder, or libkineto's
        default ``/tmp/libkineto_activities_<pid>.json`` (a libkineto that refused our path: moved in)."""
        since = arming.answered().get(pid, self.clock()) - 1.0
        client_pid = next((first for first, snd in dict(daemon.sender_pids).items() if snd == pid), pid)
        fallback = Path(f"/tmp/libkineto_activities_{client_pid}.json")

        def candidates() -> list[Path]:
            found = [p for p in d.glob(f"rank{rank}_*.json*") if trace_complete(p)]
            if not found and fallback.exists() and trace_complete(fallback):
                with contextlib.suppress(OSError):
                    if fallback.stat().st_mtime >= since:
                        found = [fallback]
            return found

        got = wait_stable(candidates, max(0.0, deadline - time.monotonic()), settle_s=self.settle_s,
                          stop=self._closing.is_set)
        if not got:
            return None
        path = got[0]
        if path.parent != d:
            path = Path(shutil.move(path, d / f"rank{rank}_{client_pid}.json"))
        return path

    def _analyze(self, m: dict[str, Any], rank: int, fn: Callable[[], CaptureAnalysis]) -> None:
        try:
            a = fn()
            m.setdefault("analysis", {})[str(rank)] = {**a.to_json(), "summary": device_summary(a)}
        except Exception as exc:
            m.setdefault("analysis", {})[str(rank)] = {"error": f"{type(exc).__name__}: {exc}"[:500]}

    # -- nsys ---------------------------------------------------------------------------------
    def _nsys_session(self, req: CaptureRequest, m: dict[str, Any], deadline: float,
                      sessions: list[str]) -> str:
        nsys = self.nsys
        assert nsys is not None
        if not sessions:
            raise _Failed("failed", f"no nsys session {session_name(req.job)} (or per-rank sessions) on this "
                                    "node: start the job with perfd launch --nsys")
        m["sessions"] = sessions
        if len(sessions) == 1 and sessions[0] == session_name(req.job):
            m["scope"] = "job session: every process of the job under it on this node"
        d = self.store.capture_dir(m["id"])

        def started(t: float) -> None:
            m["timings"]["started_at"] = m["timings"]["first_event_at"] = t
            self.store.write(m)
            lat = t - m["timings"]["requested_at"]
            self._emit(STARTED, req, f"nsys collection on {', '.join(sessions)} started "
                       f"{lat:.2f} s after the request", "info", m["id"], {"latency_s": round(lat, 3)})

        window_s = min((req.duration_ms or 3000) / 1000.0, max(0.0, deadline - time.monotonic()))
        try:
            reports, errors = nsys.run_window(sessions, d, window_s, self._closing.wait, started,
                                              max(30.0, deadline - time.monotonic()))
        except NsysError as exc:
            raise _Failed("failed", f"{exc} (is the job running under perfd launch --nsys, session "
                                    f"{', '.join(sessions)}?)") from exc
        for session, rep in reports.items():
            m["timings"]["trace_ready_at"] = self.clock()
            self._export(m, rep, session, req)
        if not reports:
            raise _Failed("failed", "; ".join(errors))
        return "; ".join(errors)

    def _export(self, m: dict[str, Any], rep: Path, key: str, req: CaptureRequest) -> None:
        assert self.nsys is not None
        rank = req.ranks[0] if len(req.ranks) == 1 else None
        self.store.add_artifact(m, rep, "nsys_report", rank)
        try:
            sqlite, a = self.nsys.export_and_analyze(rep)
        except Exception as exc:
            m.setdefault("analysis", {})[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        self.store.add_artifact(m, sqlite, "nsys_sqlite", rank)
        m.setdefault("analysis", {})[key] = {**a.to_json(), "summary": device_summary(a)}

    def _nsys_range(self, req: CaptureRequest, m: dict[str, Any], deadline: float,
                    sessions: list[str]) -> str:
        """A step-aligned range on each rank: in the rank's session when ``sessions`` (one per rank,
        armed here with ``nsys start -c cudaProfilerApi``), else under the rank's range profile."""
        nsys = self.nsys
        assert nsys is not None
        d = self.store.capture_dir(m["id"])
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
                raise _Failed("failed", f"{exc} (is rank {req.ranks[len(armed)]} running under "
                                        "perfd nsys-prefix?)") from exc
        try:
            self._open_ranges(req, m, deadline)
        except _Failed:
            for s in armed.values():  # a session left armed would record the next range nobody asked for
                nsys.cancel(s)
            raise
        problems = []
        for r in req.ranks:
            if r in armed:
                rep = report_path(d / f"rank{r}")
                got = wait_stable(functools.partial(_existing, rep), max(0.0, deadline - time.monotonic()),
                                  settle_s=self.settle_s, stop=self._closing.is_set)
                if not got:
                    nsys.cancel(armed[r])
                    problems.append(f"rank {r}: session {armed[r]} wrote no report before the timeout")
                    continue
                dest = got[-1]
            else:
                base = nsys.range_base(req.job, r)
                assert base is not None
                got = wait_stable(functools.partial(_reports, base, m["timings"]["requested_at"] - 1.0),
                                  max(0.0, deadline - time.monotonic()), settle_s=self.settle_s,
                                  stop=self._closing.is_set)
                if not got:
                    problems.append(f"rank {r}: no report under {base.parent} before the timeout (a "
                                    "range profile writes its reports when the process exits; per-rank "
                                    "sessions report at once: perfd nsys-prefix)")
                    continue
                rep = got[-1]
                dest = d / f"rank{r}_{rep.name}"
                rep.replace(dest)
            m["timings"]["trace_ready_at"] = self.clock()
            self._export(m, dest, str(r), CaptureRequest(req.job, (r,)))
        if len(problems) == len(req.ranks):
            raise _Failed("timeout", "; ".join(problems))
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
                raise _Failed("failed", f"rank {r}: the step hook is unreachable "
                                        "(no hook records from it yet?)")
            requests[r] = rid
        states = self._wait_hook(requests, {"started"}, deadline)
        bad = {r: s for r, s in states.items() if s.get("state") in ("rejected", "failed", "cancelled")}
        if bad:
            raise _Failed("failed", "; ".join(f"rank {r}: the hook {s['state']} the profile range at step "
                                             f"{s.get('step')}" for r, s in sorted(bad.items())))
        if len(states) < len(requests):
            late = sorted(set(requests) - set(states))
            raise _Failed("timeout", f"rank(s) {late}: no cudaProfilerStart before the {req.timeout_s:.0f} s "
                                     f"timeout{self._range_progress(late, requests)}")
        m["timings"]["started_at"] = m["timings"]["first_event_at"] = max(float(s.get("time") or self.clock())
                                                                          for s in states.values())
        m["steps"] = {"start": min(int(s.get("step", 0)) for s in states.values()), "count": req.steps}
        lat = m["timings"]["started_at"] - m["timings"]["requested_at"]
        self.store.write(m)
        self._emit(STARTED, req, f"cudaProfilerStart on rank(s) {sorted(states)} {lat:.2f} s after "
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
            while len(out) < len(requests) and not self._closing.is_set():
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

    def list(self, job: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return self.store.list(job, limit)
