"""The agent-side Megatron collector: tails the job's log and parses it as it grows."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from perfd.collectors.collector import Capabilities, Collected, Collector
from perfd.collectors.config_values import as_float, as_int
from perfd.collectors.megatron.gaps import TailGaps
from perfd.collectors.megatron.parser import MegatronLogParser
from perfd.collectors.megatron.tail import LogTail, TailPosition
from perfd.core.events import LOG_GAP
from perfd.core.jobinfo_json import decode_job_info, job_info_to_json
from perfd.core.linetimes import LineTimes
from perfd.core.model import JobInfo
from perfd.core.shared_thresholds import STALL_PHASE_MAX_S

log = logging.getLogger(__name__)

# A tail this far behind its log skips ahead: at the parse rate measured on per-rank timers
# (benchmarks/README.md, "Log tail") that is tens of seconds of catch-up.
DEFAULT_MAX_LAG_BYTES = 64 << 20
PHASE_MAX_S = STALL_PHASE_MAX_S.value


class MegatronCollector(Collector):
    """Config: ``path`` (required), ``job`` (default: the agent's job), ``from_start`` (default
    true), ``line_times`` (the ``.times`` sidecar `perfd launch` writes beside the log, see
    perfd.core.linetimes; an iteration's end time then comes from when its line was printed, not from
    the log's one-second stamp), ``flush_after_s`` (default 2): when the log has been quiet
    that long, the pending iteration is emitted without waiting for the next iteration line
    (Megatron prints the iteration line, its timers and the straggler line within milliseconds;
    a quiet log means the record is complete, or the job stopped) — except during a checkpoint save
    or an evaluation the log announced: its timer comes when it ends, and the record waits for it.

    Resuming (``resume``: the checkpoint of an earlier run, handed back by the agent's
    --state-dir): the log is read again from the start of the iteration that was still pending
    (its record not yet emitted, so nothing is read twice into a record and nothing is skipped),
    and the job info parsed from the log's start-up block comes back with it. A rotated or
    re-created log is read from its start (LogTail checks the file's identity)."""

    name = "megatron"
    default_interval_s = 0.5

    def __init__(self, config: Mapping[str, object]) -> None:
        super().__init__()
        if not config.get("path"):
            raise ValueError("perfd.collectors.megatron.path is required (the job's log file)")
        self.path = str(config["path"])
        self.job = str(config.get("job") or "default")
        self.from_start = bool(config.get("from_start", True))
        self.flush_after_s = as_float(config.get("flush_after_s", 2.0))
        self.max_bytes_per_collect = as_int(config.get("max_bytes_per_collect", 4 << 20))
        # Further behind than this, the tail skips ahead (counted, an event): see LogTail.
        lag = config.get("max_lag_bytes", DEFAULT_MAX_LAG_BYTES)
        self.max_lag_bytes = as_int(lag) if lag is not None else None
        if self.max_lag_bytes is not None and self.max_lag_bytes < 2 * self.max_bytes_per_collect:
            raise ValueError("perfd.collectors.megatron.max_lag_bytes must be at least twice "
                             f"max_bytes_per_collect ({2 * self.max_bytes_per_collect}), "
                             f"got {self.max_lag_bytes}")
        self._skips_seen = 0
        self.gaps = TailGaps(self.name, self.path, self.job, self.count_error)  # lost log: LOG_GAP events
        self.parser = MegatronLogParser(job=self.job, source_name=Path(self.path).name)
        self.tail: LogTail | None = None
        lt = config.get("line_times")
        self.line_times = LineTimes(str(lt)) if lt else None
        self._last_data = time.monotonic()
        self._pending = False  # the parser holds an iteration not yet emitted
        self._sent_info: JobInfo | None = None
        self._tail_errors_seen: dict[str, int] = {}
        self._resume = config.get("resume")
        self.wandb_run_id = str(config["wandb_run_id"]) if config.get("wandb_run_id") else None
        self._consumed = 0  # file offset after the last line read
        self._pending_at: int | None = None  # file offset where the pending iteration's line starts
        self.resumed_at: int | None = None

    def probe(self) -> Capabilities:
        # A log that does not exist yet is normal (the job starts after the agent): available,
        # and the tail waits for it; the missing file is counted, not fatal.
        p = Path(self.path)
        exists = p.exists()
        return Capabilities(True, "" if exists else f"{self.path} does not exist yet; waiting",
                            {"file_exists": exists})

    def start(self) -> None:
        pos, ck = None, self._resume
        if isinstance(ck, dict):
            try:
                pos = TailPosition(**ck["position"])
                if ck.get("job_info"):
                    self.parser.job_info, _ = decode_job_info(str(ck["job_info"]))
            except (KeyError, TypeError, ValueError) as exc:
                self.count_error("resume:unreadable", str(exc)[:200])
                pos = None
        # No skipping before training starts: the start-up block (layout, model) is read whole.
        self.tail = LogTail(self.path, from_start=self.from_start, resume=pos)
        if pos is not None and self.tail.counts.get("resumed"):
            self.resumed_at = self._consumed = pos.offset
            # A warning: a restart is worth seeing in the agent's output without -v.
            log.warning("megatron: resumed %s at byte %d%s (what came before is in the spool)",
                        self.path, pos.offset, " of its rotated copy .1, then the new log from its start"
                        if self.tail.counts.get("resumed_rotated") else "")
        elif pos is not None:
            self.gaps.lost_at_resume(pos.offset)

    def collect(self, now: float) -> Collected:
        out = Collected()
        if self.tail is None:
            return out
        lines = self.tail.read_lines_at(max_bytes=self.max_bytes_per_collect)
        for reason, n in self.tail.errors.items():  # mirror tail failures into our error counts
            for _ in range(n - self._tail_errors_seen.get(reason, 0)):
                self.count_error(f"tail:{reason}", self.path)
            self._tail_errors_seen[reason] = n
        if self.tail.counts.get("skips", 0) != self._skips_seen:
            self._skipped_ahead(out)
        out.events.extend(self.gaps.events(self.tail))
        if self.tail.max_lag_bytes is None and self.parser.pending is not None:
            self.tail.max_lag_bytes = self.max_lag_bytes  # an iteration line: the start-up block is read
        mono = time.monotonic()
        if lines:
            self._last_data = mono
            lt = self.line_times
            exact = True
            for line, offset in lines:
                # Only iteration lines need the time; the lookup is a bisect (a file read when
                # the sidecar is behind).
                arrived = lt.time_for(offset) if lt is not None and "iteration" in line else None
                before = self.parser.pending
                out.steps.extend(self.parser.feed(line, arrived))
                if self.parser.pending is not before:
                    self._pending_at = self._consumed if self.parser.pending is not None else None
                if offset is None:
                    exact = False  # a line cut at a rotation or over-long: no offset to resume at
                else:
                    self._consumed = offset + 1
            self._pending = True
            out.checkpoint = self._checkpoint() if exact else None
        elif self._pending and mono - self._last_data >= self.flush_after_s and not self._held(mono):
            out.steps.extend(self.parser.flush())
            self._pending = False
            self._pending_at = None
            out.checkpoint = self._checkpoint()
        if self.parser.events:
            out.events.extend(self.parser.events)
            self.parser.events.clear()
        issues = self.parser.issues
        if issues:
            for issue in issues:
                self.count_error(f"parse:{issue.reason}", f"line {issue.line_no}: {issue.text[:80]}")
            issues.clear()
        info = self.parser.job_info
        if self.wandb_run_id and info.wandb_run_id != self.wandb_run_id:
            info.wandb_run_id = self.wandb_run_id  # from the launch manifest, not the log
        if lines and info.arguments and info != self._sent_info:
            self._sent_info = copy.deepcopy(info)
            out.job_info[self.job] = self._sent_info
        return out

    def _held(self, mono: float) -> bool:
        """The pending record waits out an announced save or evaluation (its timer comes as the
        phase ends and belongs to it: emitted on the log's quiet, a 24 s save's time was lost live and
        read as a stall); at most STALL_PHASE_MAX_S, the longest pause perfd believes announced."""
        return self.parser.phase_open is not None and mono - self._last_data < PHASE_MAX_S

    def _skipped_ahead(self, out: Collected) -> None:
        """The tail jumped ahead: close the iteration in progress (its lines after the jump are
        gone), count the jump and say so in an event with what was passed over."""
        assert self.tail is not None
        self._skips_seen = self.tail.counts.get("skips", 0)
        last = self.parser.pending.iteration if self.parser.pending is not None else None
        out.steps.extend(self.parser.flush())
        self._pending_at = None
        skipped = self.tail.counts.get("skipped_bytes", 0)
        self.count_error("tail:skipped_ahead", f"{self.path}: {skipped} bytes passed over in all")
        log.warning("megatron: %s is more than %d bytes ahead of the tail: skipped ahead (%d bytes passed "
                    "over in all, after iteration %s)", self.path, self.max_lag_bytes, skipped, last)
        out.events.append({"kind": LOG_GAP.name, "severity": "warning", "time": time.time(), "job": self.job,
                           "text": f"log tail skipped ahead in {Path(self.path).name}: "
                                   f"{skipped} bytes not read in all",
                           "payload": {"skipped_bytes_total": skipped, "skips": self._skips_seen,
                                       "after_iteration": last, "path": self.path}})

    def _checkpoint(self) -> dict[str, object] | None:
        """Resume at the pending iteration's line (or after the last line when none is pending)."""
        if self.tail is None:
            return None
        at = self._pending_at if self._pending_at is not None else self._consumed
        pos = self.tail.position_at(at)
        if pos is None:
            return None
        info = self.parser.job_info
        return {"position": asdict(pos), "job_info": job_info_to_json(info) if info.arguments else None}

    def flush(self, now: float) -> Collected:
        """At shutdown: read what is left of the log and emit the pending iteration (the job's
        last one, when the agent stops soon after the job)."""
        out = self.collect(now)
        if self._pending:
            out.steps.extend(self.parser.flush())
            self._pending = False
        return out

    def stop(self) -> None:
        if self.tail is not None:
            self.tail.close()
