"""An ncu capture's run (the manager's worker calls :meth:`NcuCapture.run`): one step's range on
ranks that run under ncu (:mod:`perfd.capture.ncu_exec`), opened and closed by their step hooks
(:class:`~perfd.capture.hook_ranges.HookRanges`), watched against the rank's time budget, then the
report ncu wrote copied into the capture, imported as CSV (both pages), parsed into per-kernel rows
(:mod:`perfd.capture.ncu_report`) and joined to the job's latest timeline capture in this agent's store
(:mod:`perfd.analytics.ncu.join`).

The kernel budget is ncu's own (``--launch-count``, fixed when the rank started): a range profiles at
most the kernels left of it, and once it is spent a range records nothing — said so, never an
empty success. The time budget is the capture's: a range still open when it passes is cancelled (the
hook closes it at the next step boundary: inside a step ncu replays kernels on the training thread
and nothing can end that step sooner), and the capture says it overran (``range_overran`` in the
manifest and the event), and how long the range held the step (``range_held_s``). A range is never
left open: the cancel goes out at the budget, and again at
the capture's deadline.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfd.analytics.breakdown.job_budget import captured_iterations
from perfd.analytics.breakdown.ncu_rows import Coverage, JoinedKernel, MatchHow
from perfd.analytics.ncu import join as ncu_join
from perfd.analytics.ncu.launches import align, coverage, group_key, join_launches, op_group
from perfd.capture import ncu_report as ncu_mod
from perfd.capture.analysis import TraceData
from perfd.capture.bookkeeping import CaptureFailed, RunContext
from perfd.capture.hook_ranges import HookRanges, Key, Status
from perfd.capture.launch_order import launches_of, read_launches
from perfd.capture.ncu_exec import (
    PAGES,
    NcuError,
    NcuExecutor,
    NcuNotFoundError,
    NcuTarget,
    latest_timeline,
    trace_of,
)
from perfd.capture.nsys_exec import wait_stable
from perfd.capture.request import CaptureRequest
from perfd.capture.store import Manifest
from perfd.core.model import CaptureFailure

log = logging.getLogger(__name__)

# Per-kernel rows one capture's event carries, all ranks together (the manifest keeps every one): a
# row is ~1 KB, and an event must stay well under perfd.core.limits.MAX_EVENT_BYTES (256 KiB).
EVENT_KERNELS = 60
EVENT_NAME_CHARS = 200

@dataclass(frozen=True)
class NotUnder:
    """Why a rank's process does not run under its recorded ncu, typed: a process that is gone (the
    job restarting: its new process is not known here yet) is not ready, anything else a failure."""

    why: str
    cause: CaptureFailure = CaptureFailure.FAILED


# (rank's pid, ncu's pid) -> None when the rank runs under that ncu, else why not (a bare string: a
# failure)
UnderCheck = Callable[[int, int], "str | NotUnder | None"]


def under_ncu(rank_pid: int, ncu_pid: int) -> NotUnder | None:
    """None when ``rank_pid`` is ``ncu_pid`` or one of its descendants (the rank runs under it)."""
    import psutil

    if rank_pid == ncu_pid:
        return None
    try:
        parents = {p.pid for p in psutil.Process(rank_pid).parents()}
    except psutil.NoSuchProcess:
        return NotUnder(f"process {rank_pid} is gone (the rank restarting? its new process is not known "
                        "here yet)", CaptureFailure.NOT_READY)
    except psutil.Error as exc:
        return NotUnder(f"process {rank_pid}: {exc}")
    if ncu_pid in parents:
        return None
    return NotUnder(f"process {rank_pid} is not under ncu (pid {ncu_pid}, recorded by perfd ncu-exec): the "
                    "record is from an earlier run")


class NcuCapture:
    def __init__(self, ctx: RunContext, ncu: NcuExecutor | None, ranges: HookRanges,
                 check: UnderCheck = under_ncu) -> None:
        self.ctx, self.ncu, self.ranges, self.check = ctx, ncu, ranges, check

    # -- the manager's admission ----------------------------------------------------------------
    def target(self, job: str, rank: int, pid: int | None) -> tuple[NcuTarget | None, NotUnder | None]:
        """(the rank's ncu target, None) when it runs under ncu now, else (None, why not)."""
        if self.ncu is None:
            return None, NotUnder("this agent has no ncu executor")
        try:
            t = self.ncu.target(job, rank)
        except ValueError as exc:
            return None, NotUnder(str(exc))
        if t is None:
            return None, NotUnder(f"rank {rank} of job {job} does not run under ncu: start it under "
                                  "$(perfd ncu-prefix --job J --ranks R) after torchrun --no-python, or "
                                  "with perfd launch --ncu R")
        if pid is not None:
            got = self.check(pid, t.pid)
            if got is not None:
                no = got if isinstance(got, NotUnder) else NotUnder(got)
                return None, NotUnder(f"rank {rank}: {no.why}", no.cause)
        return t, None

    # -- the run --------------------------------------------------------------------------------
    def run(self, req: CaptureRequest, m: Manifest, pids: Mapping[int, int], deadline: float) -> str:
        targets: dict[int, NcuTarget] = {}
        for r in req.ranks:
            t, no = self.target(req.job, r, pids.get(r))
            if t is None:
                assert no is not None
                raise CaptureFailed("failed", no.why, no.cause)
            targets[r] = t
        assert self.ncu is not None
        m["ncu"] = {str(r): t.to_json() for r, t in targets.items()}
        notes = [] if req.steps == 1 else [f"ncu ranges are one step (asked for {req.steps}): the kernel "
                                           "budget is ncu's, a longer range profiles nothing more"]
        before = {r: _size(t.report) for r, t in targets.items()}
        budget_s = min(t.options.time_budget_s for t in targets.values())
        requests = self.ranges.open(req, m, deadline, steps=1, what="cudaProfilerStart under ncu")
        try:
            closed = self._watch(requests, budget_s, deadline, m)
        finally:
            self.ranges.forget(requests.values())
        problems: list[str] = []
        if m.get("range_overran"):
            problems.append(f"the range overran its time budget of {budget_s:g} s: cancelled, "
                            + ("closed at step(s) " + ", ".join(f"rank {r} {closed[r].get('step')}"
                                                                for r in sorted(closed))
                               if closed else "still open at the timeout"))
        results = 0
        for r, t in sorted(targets.items()):
            if r not in closed:
                problems.append(f"rank {r}: its range was still open at the capture's timeout (cancel sent: "
                                "the hook closes it at the end of the step ncu is replaying)")
            try:
                results += self._analyse(req, m, r, t, before[r], deadline)
            except CaptureFailed as exc:
                problems.append(f"rank {r}: {exc.reason}")
        reason = "; ".join(notes + problems)
        if not results:
            raise CaptureFailed("timeout" if m.get("range_overran") and not closed else "failed",
                                reason or "no kernel profiled")
        if len(closed) < len(requests):  # the rows are kept; the capture did not end as asked
            raise CaptureFailed("timeout", reason)
        return reason

    def _watch(self, requests: Mapping[int, Key], budget_s: float, deadline: float,
               m: Manifest) -> dict[int, Status]:
        """Wait for every range to close within the time budget; cancel the ones that do not."""
        budget_end = min(deadline, time.monotonic() + budget_s)
        closed = self.ranges.wait(requests, {"stopped"}, budget_end)
        late = {r: rid for r, rid in requests.items() if r not in closed}
        m["range_overran"] = bool(late)
        if late:
            for r in late:
                self.ranges.cancel(r)
            closed.update(self.ranges.wait(late, {"stopped"}, deadline))
            for r in late:
                if r not in closed:
                    self.ranges.cancel(r)  # again at the deadline: a range is never left open
        m["range"] = {str(r): {"state": e.get("state"), "step": e.get("step"), "time": e.get("time")}
                      for r, e in closed.items()}
        times = [float(t) for e in closed.values() if isinstance(t := e.get("time"), int | float)]
        if times:
            m["timings"]["range_closed_at"] = max(times)
            opened = m["timings"].get("started_at")
            if isinstance(opened, int | float):
                # How long the range held the step it profiled (ncu replays every kernel on the training
                # thread: the step ends only then): the job's steps stop for this long, by design, and
                # the aggregator reads it as this capture's, never as a stall.
                m["range_held_s"] = round(max(0.0, max(times) - float(opened)), 3)
        self.ctx.store.write(m)
        return closed

    def _analyse(self, req: CaptureRequest, m: Manifest, rank: int, t: NcuTarget, before: int,
                 deadline: float) -> int:
        """Copy, import, parse and join one rank's report; the number of new kernels recorded."""
        assert self.ncu is not None
        rep = t.report
        # ncu writes as it profiles (the probe's report had its final size within the profiled
        # step): after the close, ten settle periods are plenty, and the deadline may be spent by then
        flush_s = max(10 * self.ctx.settle_s, 2.0)
        grown = wait_stable(lambda: [rep] if _size(rep) > max(before, 0) else [],
                            min(max(deadline - time.monotonic(), 3 * self.ctx.settle_s), flush_s),
                            settle_s=self.ctx.settle_s, stop=self.ctx.closing.is_set)
        if not grown:
            spent = self.ncu.last_seen(t) + 1
            raise CaptureFailed("failed", f"ncu wrote nothing for the range (its report {rep.name} did not "
                                          f"grow): its kernel budget of {t.options.launch_count} may be "
                                          f"spent ({spent} launches reported here before), or no kernel "
                                          "matched its filter")
        d = self.ctx.store.capture_dir(m["id"])
        dest = d / f"rank{rank}.ncu-rep"
        shutil.copyfile(rep, dest)  # ncu keeps writing its own file at the next range
        m["timings"]["trace_ready_at"] = self.ctx.clock()
        self.ctx.store.add_artifact(m, dest, "ncu_report", rank)
        try:
            texts = []
            for page in PAGES:
                text = self.ncu.import_csv(dest, page)
                out = d / f"rank{rank}_{page}.csv"
                out.write_text(text)
                self.ctx.store.add_artifact(m, out, f"ncu_{page}_csv", rank)
                texts.append(text)
            full = ncu_mod.parse_exports(texts)
        except (NcuError, NcuNotFoundError, ncu_mod.NcuParseError, OSError) as exc:
            m.setdefault("analysis", {})[str(rank)] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            raise CaptureFailed("failed", f"report not analysed ({exc}); kept as {dest.name}") from exc
        new = full.since(self.ncu.last_seen(t))
        self.ncu.saw(t, max((i for k in full.kernels for i in k.ids), default=-1))
        if not new.kernels:
            raise CaptureFailed("failed", f"no kernel profiled in this range (the report holds "
                                          f"{full.launches} launches of earlier ranges: the kernel budget "
                                          f"of {t.options.launch_count} is spent)")
        tl = latest_timeline(self.ctx.store.list(req.job), rank)
        joined_to, device = (tl.capture_id, tl.device) if tl is not None else (None, None)
        timeline = ncu_join.timeline_kernels(device) if device is not None else []
        steps, _ = (captured_iterations(device, tl.asked_steps, None)
                    if tl is not None and device is not None else (None, ""))
        joined, cov = by_launch(new, trace_of(self.ctx.store.list(req.job), joined_to, rank),
                                t.options.kernel_filter, t.options.launch_skip, steps,
                                device.device if device is not None else None)
        if joined is None:  # no trace of the timeline left to match launches on: by kernel name
            joined = ncu_join.join(new.kernels, timeline, steps)
        summaries = ncu_join.summarize(joined, device.categories() if device is not None else None)
        m.setdefault("analysis", {})[str(rank)] = {
            "ncu": {k: v for k, v in new.to_json().items() if k != "kernels"},
            "kernels": [j.to_json() for j in joined], "categories": [c.to_json() for c in summaries],
            "joined_to": joined_to, "clock_control": t.options.clock_control,
            "kernel_budget": t.options.launch_count, "kernel_filter": t.options.kernel_filter,
            "kernel_choice": t.options.choice_json(),
            "coverage": cov.to_json() if cov is not None else None,
        }
        return len(new.kernels)


def by_launch(report: ncu_mod.NcuReport, trace: Path | TraceData | None, kernel_filter: str | None, skip: int,
              steps: float | None, device: object = None
              ) -> tuple[list[JoinedKernel] | None, Coverage | None]:
    """The report's rows by the op each launch was, matched launch by launch to the timeline's trace
    (perfd.analytics.ncu.launches), and what they cover; (None, None) without a trace to read, (None,
    the coverage saying so) when no launch matched. ``trace``: a file, or its events already read."""
    if trace is None:
        return None, None
    dev = device if isinstance(device, int) else None
    try:
        tl = read_launches(trace, dev) if isinstance(trace, Path) else launches_of(trace, dev)
    except Exception as exc:  # a trace that cannot be read again: the name join will do
        log.warning("ncu rows by launch: cannot read %s: %s", trace, exc)
        return None, None
    order = report.order()
    match = align(order, tl, kernel_filter, skip)
    cov = coverage(match, len(order))
    if match.how is MatchHow.NONE:
        return None, cov
    groups = [(op_group(k, kern.ids, match), kern) for k, kern in report.regroup(group_key(match))]
    return join_launches(groups, tl.launches, steps), cov


def event_rows(analysis: Mapping[str, object], ranks: int = 1) -> dict[str, Any]:
    """What an ncu rank's analysis puts in the capture's event, ``ranks`` ranks sharing EVENT_KERNELS
    rows (bounded: the manifest has them all)."""
    kernels = analysis.get("kernels")
    if not isinstance(kernels, list):
        return {}
    rows = []
    for k in kernels[: max(5, EVENT_KERNELS // max(ranks, 1))]:
        if isinstance(k, dict):
            rows.append({**{x: v for x, v in k.items() if x not in ("ids", "name", "timeline_name")},
                         "name": str(k.get("name", ""))[:EVENT_NAME_CHARS],
                         "timeline_name": (str(k["timeline_name"])[:EVENT_NAME_CHARS]
                                           if k.get("timeline_name") else None)})
    return {"ncu_kernels": rows, "ncu_kernels_total": len(kernels),
            "ncu_categories": analysis.get("categories") or [],
            "ncu_joined_to": analysis.get("joined_to"), "ncu_clock_control": analysis.get("clock_control"),
            "ncu_kernel_choice": analysis.get("kernel_choice"), "ncu_coverage": analysis.get("coverage")}


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return -1
