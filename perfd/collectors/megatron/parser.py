"""Streaming parser for Megatron-LM training logs (stdout+stderr of all ranks, interleaved).

Megatron prints, per logged iteration and in this order: the iteration line (last rank), the
timer block for that iteration (last rank), and the straggler-detector line (rank 0). A record
for iteration N is therefore complete only when the next iteration line (or the end of input)
arrives: ``feed`` returns records as they complete, ``flush`` returns the one still pending.

Nothing here raises on bad input: lines that look like a known format but cannot be used become
ParseIssues (and ``counts["malformed:<reason>"]``); everything else is counted as "other".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfd.collectors.megatron import args as margs
from perfd.collectors.megatron.intervals import RunIntervals
from perfd.collectors.megatron.lines import (
    IterationLine,
    parse_all_timer_name,
    parse_all_timer_rank,
    parse_datetime_line,
    parse_iteration,
    parse_memory,
    parse_one_line_timers,
    parse_phase,
    parse_straggler,
    parse_timer_body,
    parse_timer_header,
    parse_timestamp,
    parse_validation,
    strip_launcher_prefix,
    to_float,
    to_int,
)
from perfd.core.armed import ARMED_MARK, BANNER_MARK, armed_rank
from perfd.core.bounds import REASON as BOUND_REASON
from perfd.core.bounds import STEP_REASON, check_job_info, check_step_record
from perfd.core.events import JOB_PHASE, VALIDATION
from perfd.core.logfiles import iter_text_lines
from perfd.core.model import ABSENT, JobInfo, ParseIssue, Provenance, StepRecord, StragglerLine, TimerValue

COLLECTOR = "megatron"
MAX_LINE_CHARS = 65_536  # longer lines are cut before parsing (an iteration line is ~500)
MAX_ISSUES = 10_000  # issues kept in memory; counts keep counting past this
ISSUE_TEXT_CHARS = 200
# A timer block has no end marker. It stays open across interleaved output from other ranks
# (warnings inside a block are common) until a structured line arrives, or this many lines of
# other output in a row.
MAX_TIMER_GAP = 50

# Typed StepRecord fields, by the key Megatron prints.
_FLOAT_FIELDS = {
    "elapsed time per iteration (ms)": "step_time_ms",
    "learning rate": "learning_rate",
    "lm loss": "lm_loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
}
_INT_FIELDS = {
    "consumed samples": "consumed_samples",
    "global batch size": "global_batch_size",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
}
_THROUGHPUT_PREFIX = "throughput per GPU (TFLOP"  # "(TFLOP/s/GPU)" since 2023


@dataclass
class ParsedLog:
    job_info: JobInfo
    records: list[StepRecord]
    issues: list[ParseIssue]
    counts: dict[str, int]
    # Non-iteration facts worth keeping, as Collected.events dicts (kind "validation" so far).
    events: list[dict[str, object]] = field(default_factory=list)


class MegatronLogParser:
    """Feed it lines; it returns StepRecords as they complete and fills ``job_info`` as it goes."""

    def __init__(self, job: str = "megatron", source_name: str = "<stream>") -> None:
        self.job = job
        self.source_name = source_name
        self.job_info = JobInfo(framework="megatron")
        self.issues: list[ParseIssue] = []
        self.counts: dict[str, int] = {}
        self.events: list[dict[str, object]] = []
        self._line_no = 0
        self._pending: StepRecord | None = None
        self._pending_line = 0  # the line of the pending record's iteration line
        self._facts = margs.StartupFacts()
        self._args_mode: str | None = None  # "new" (dashed header/end) | "old" ("arguments:")
        self._args_dirty = False
        self._timer_mode: str | None = None  # "minmax" | "max" | "all" while a block is open
        self._timer_target: dict[str, TimerValue] | None = None
        self._timer_gap = 0
        self._all_current: str | None = None  # timer name under which 'all' rank rows go
        self._step_timer_names: set[str] = set()  # the pending record's step timers (see _note_step_timer)
        self._blocks_for_pending = 0  # timer blocks printed since the pending record's line
        self._intervals = RunIntervals()  # iterations each record of this run covers
        self._arrived: float | None = None  # the line being fed: when it was printed, if known
        self._startup_seen = False  # start-up output since the last record: the next one starts a run
        # A checkpoint save or an evaluation the loop announced and has not ended: its timer
        # (save-checkpoint, evaluate) is printed as it ends and belongs to the pending record, so a
        # live reader holds that record while the phase is open (collector.py) rather than emit it
        # on the log's quiet. Cleared by the phase's end or by the next iteration line.
        self._phase_open: str | None = None
        # A rank armed for a capture (perfd.core.armed: perfd ncu-exec's line, ncu's banner) since the last
        # record, and whether the current run's records are armed: from its first step to its end.
        self._armed_seen = False
        self._run_armed = False

    # ---------------------------------------------------------------------------------------
    # Public API
    # ---------------------------------------------------------------------------------------

    @property
    def pending(self) -> StepRecord | None:
        """The iteration whose record is not complete yet (its timers may still come)."""
        return self._pending

    @property
    def phase_open(self) -> str | None:
        """The announced pause still open ("checkpoint" | "evaluation"), else None."""
        return self._phase_open

    def feed(self, line: str, arrived: float | None = None) -> list[StepRecord]:
        """Parse one raw line (trailing newline optional); return the records it completed.
        ``arrived``: when the line was printed (epoch seconds, perfd.core.linetimes), finer than the
        log's own one-second stamp; it becomes an iteration line's end time."""
        out: list[StepRecord] = []
        self._arrived = arrived
        try:
            text = line[:-1] if line.endswith("\n") else line
            for piece in text.split("\n"):  # a caller passing several lines at once still works
                self._line(piece, out)
        except Exception as exc:  # never raise into the agent; a parser bug is counted instead
            self._issue("internal-error", f"{type(exc).__name__}: {exc}")
        return out

    def flush(self) -> list[StepRecord]:
        """End of input: close open blocks and return the pending record, if any."""
        out: list[StepRecord] = []
        try:
            self._close_args()
            self._close_timers()
            self._complete(out)
        except Exception as exc:  # pragma: no cover - defensive, as in feed()
            self._issue("internal-error", f"{type(exc).__name__}: {exc}")
        return out

    # ---------------------------------------------------------------------------------------
    # Bookkeeping
    # ---------------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _issue(self, reason: str, text: str, line_no: int | None = None) -> None:
        self._count(f"malformed:{reason}")
        if len(self.issues) < MAX_ISSUES:
            at = self._line_no if line_no is None else line_no
            self.issues.append(ParseIssue(at, reason, text[:ISSUE_TEXT_CHARS]))
        else:
            self._count("issues_dropped")

    # ---------------------------------------------------------------------------------------
    # Line dispatch
    # ---------------------------------------------------------------------------------------

    def _line(self, raw: str, out: list[StepRecord]) -> None:
        self._line_no += 1
        self._count("lines")
        line = raw.rstrip("\r")  # leading spaces matter (arguments, timer bodies): keep them
        if len(line) > MAX_LINE_CHARS:
            self._count("long_lines")
            line = line[:MAX_LINE_CHARS]
        line = strip_launcher_prefix(line)
        if self._arrived is not None:
            self._started(self._arrived)
        if not line.strip():
            self._count("empty")
            return
        if self._args_mode is not None and self._argument_line(line):
            return
        if self._timer_mode is not None and self._timer_line(line):
            return
        self._dispatch(line, out)

    def _argument_line(self, line: str) -> bool:
        if margs.ARGS_END_RE.search(line):
            self._close_args()
            return True
        parsed = margs.parse_argument_line(line)
        if parsed is not None:
            self.job_info.arguments[parsed[0]] = parsed[1]
            self._args_dirty = True
            self._count("argument_lines")
            return True
        if self._args_mode == "old":  # 2019 format: no end marker; the block ends here
            self._close_args()
        # New format: another rank's output inside the block. Handle it normally; the block
        # stays open until its end marker (or a training line: see _dispatch).
        return False

    def _timer_line(self, line: str) -> bool:
        target = self._timer_target
        if target is None:  # pragma: no cover - set whenever _timer_mode is
            return False
        if self._timer_mode == "all":
            row = parse_all_timer_rank(line)
            if isinstance(row, tuple) and self._all_current is not None:
                if self._all_current not in target:
                    self._note_step_timer(self._all_current)
                tv = target.setdefault(self._all_current, TimerValue())
                rank, value = row
                if rank in tv.per_rank or tv.min_ms is None or tv.max_ms is None:
                    # A rank printed twice replaces its value: recompute (rare). Otherwise min and
                    # max move with each row — recomputing them per row is O(ranks²) a block.
                    tv.per_rank[rank] = value
                    tv.min_ms, tv.max_ms = min(tv.per_rank.values()), max(tv.per_rank.values())
                else:
                    tv.per_rank[rank] = value
                    tv.min_ms, tv.max_ms = min(tv.min_ms, value), max(tv.max_ms, value)
                self._count("timer_lines")
                self._timer_gap = 0
                return True
            if isinstance(row, str):
                self._issue(row, line)
                return True
            name = parse_all_timer_name(line)
            if name is not None:
                self._all_current = name
                self._timer_gap = 0
                return True
        else:
            body = parse_timer_body(line)
            if isinstance(body, tuple):
                # A second block for the same record (e.g. save-checkpoint) never overwrites.
                if body[0] not in target:
                    target[body[0]] = body[1]
                    self._note_step_timer(body[0])
                self._count("timer_lines")
                self._timer_gap = 0
                return True
            if isinstance(body, str):
                self._issue(body, line)
                return True
        self._timer_gap += 1
        if self._timer_gap > MAX_TIMER_GAP:
            self._close_timers()
        return False

    def _phase(self, phase: str, state: str, iteration: int | None, line: str) -> None:
        """A pause the loop announces: a ``job_phase`` event (the live stall detector does not call
        it a hang)."""
        self._count(f"{phase}_{state}_lines")
        self._phase_open = phase if state == "begin" else None
        self.events.append({
            "kind": JOB_PHASE.name, "severity": "info", "job": self.job,
            "text": f"{phase} {state}s" + (f" at iteration {iteration}" if iteration is not None else ""),
            "payload": {"job": self.job, "phase": phase, "state": state, "iteration": iteration,
                        "at": self._arrived if self._arrived is not None else parse_timestamp(line),
                        "source": str(Provenance(COLLECTOR, f"{self.source_name}:{self._line_no}"))},
        })

    def _dispatch(self, line: str, out: list[StepRecord]) -> None:
        if (ARMED_MARK in line or BANNER_MARK in line) and armed_rank(line) is not None:
            self._armed_seen = True
            self._count("armed_lines")
            return
        phase = parse_phase(line)
        if phase is not None:
            self._phase(phase.phase, phase.state, phase.iteration, line)
            return
        # Validation before iteration: " validation loss at iteration 100 | lm loss value: ..."
        validation = parse_validation(line)
        if validation is not None:
            self._close_timers()
            self._phase("evaluation", "end", validation.iteration, line)
            self._count("validation_lines")
            self.events.append({
                "kind": VALIDATION.name,
                "label": validation.label,
                "iteration": validation.iteration,
                "values": validation.values,
                "source": str(Provenance(COLLECTOR, f"{self.source_name}:{self._line_no}")),
            })
            return
        if "iteration" in line:
            it = parse_iteration(line)
            if isinstance(it, IterationLine):
                self._close_args()
                self._close_timers()
                self._phase_open = None  # the loop steps again: whatever it announced is over
                self._start_record(it, line, out)
                return
            if isinstance(it, str):
                self._issue(it, line)
                return
        mode = parse_timer_header(line)
        if mode is not None:
            self._close_args()
            self._open_timers(mode)
            return
        straggler = parse_straggler(line)
        if straggler is not None:
            # Rank 0 prints this while the last rank prints the timers: it may land inside the
            # block, so it does not close it (neither do memory reports, printed by every rank).
            if isinstance(straggler, str):
                self._issue(straggler, line)
                return
            self._count("straggler_lines")
            if straggler.unpaired:
                self._count("straggler_unpaired_quantities", straggler.unpaired)
            if self._pending is None:
                self._count("straggler_unattached")
            elif self._pending.straggler is not None:
                self._count("straggler_duplicate")
            else:
                self._pending.straggler = StragglerLine(straggler.time, straggler.quantities, self._line_no)
            return
        memory = parse_memory(line)
        if memory is not None:
            if isinstance(memory, str):
                self._issue(memory, line)
                return
            self._count("memory_lines")
            # Printed right after the iteration line it names; anything else is not attached.
            if self._pending is not None and self._pending.iteration == memory.iteration:
                self._pending.memory_mb[memory.rank] = memory.values
            else:
                self._count("memory_unattached")
            return
        one_line = parse_one_line_timers(line)
        if one_line is not None:
            self._close_timers()
            if isinstance(one_line, str):
                self._issue(one_line, line)
                return
            self._count("timer_blocks")
            self._count("timer_lines", len(one_line))
            if self._pending is not None:
                self._blocks_for_pending += 1
            target = self._timer_owner()
            for name, tv in one_line.items():
                if name not in target:
                    target[name] = tv
                    self._note_step_timer(name)
            if self.job_info.timing_log_option is None:
                self.job_info.timing_log_option = "one-line"
            return
        if "datetime:" in line:
            stamp = parse_datetime_line(line)
            if stamp is not None:
                self._count("datetime_lines")
                self._started(stamp[1])
                return
        if not self._startup_line(line, out):
            self._count("other")

    def _startup_line(self, line: str, out: list[StepRecord]) -> bool:
        info = self.job_info
        packages = margs.parse_packages(line) if "installed" in line or "Engine version" in line else []
        for name, stated in packages:
            if stated != ABSENT or info.packages.get(name, ABSENT) == ABSENT:  # a version line wins
                info.packages[name] = stated
        if packages:
            return True
        if "version" in line:
            version = margs.version_after(line, "Megatron-Core version")
            if version is not None:
                self._run_start(out)
                info.framework_version = version
                return True
            version = margs.version_after(line, "PyTorch version")
            if version is not None:
                self._run_start(out)
                info.torch_version = version
                return True
        if "using world size:" in line:
            sizes = margs.parse_world_sizes(line)
            if "world" not in sizes:
                self._issue("world-size-line-unparseable", line)
                return True
            self._run_start(out)
            self._facts.world_sizes = sizes
            margs.apply_facts(info, self._facts, self._issue)
            return True
        stripped = line.strip()
        if margs.ARGS_HEADER_RE.fullmatch(stripped) or stripped == margs.OLD_ARGS_HEADER:
            self._run_start(out)
            self._close_timers()
            self._args_mode = "old" if stripped == margs.OLD_ARGS_HEADER else "new"
            info.arguments = {}  # a restart appended to the log prints its own, complete block
            return True
        n = margs.parse_microbatches(line)
        if n is not None:
            self._facts.num_microbatches = n
            margs.apply_facts(info, self._facts, self._issue)
            return True
        vocab = margs.parse_padded_vocab(line)
        if vocab is not None:
            self._facts.vocab = vocab
            margs.apply_facts(info, self._facts, self._issue)
            return True
        seen, stages = margs.parse_virtual_stages(line)
        if seen:
            self._facts.virtual_stages_seen, self._facts.virtual_stages = True, stages
            margs.apply_facts(info, self._facts, self._issue)
            return True
        return False

    # ---------------------------------------------------------------------------------------
    # State transitions
    # ---------------------------------------------------------------------------------------

    def _started(self, when: float) -> None:
        """The job's earliest time seen: the start of its goodput's wall time (a restart appended to
        the log keeps the first run's)."""
        if self.job_info.started_at is None or when < self.job_info.started_at:
            self.job_info.started_at = when

    def _run_start(self, out: list[StepRecord]) -> None:
        """Start-up output: a new run (or a restart appended to the same log) begins here."""
        self._complete(out)  # the previous run's last record is complete
        self._startup_seen = True
        self._intervals = RunIntervals()

    def _close_args(self) -> None:
        self._args_mode = None
        if self._args_dirty:
            self._args_dirty = False
            margs.apply_arguments(self.job_info, self._facts, self._issue)

    def _open_timers(self, mode: str) -> None:
        self._close_timers()
        self._count("timer_blocks")
        if self._pending is not None:
            self._blocks_for_pending += 1
        self._timer_mode = mode
        self._timer_target = self._timer_owner()
        self._timer_gap = 0
        self._all_current = None
        if self.job_info.timing_log_option is None:  # old logs lack the argument: infer it
            self.job_info.timing_log_option = mode

    def _note_step_timer(self, name: str) -> None:
        """Timers of the first block after an iteration line are training_log's step timers
        (normalised by log_interval); later blocks (save-checkpoint, evaluate) are not."""
        if self._pending is not None and self._blocks_for_pending == 1:
            self._step_timer_names.add(name)

    def _timer_owner(self) -> dict[str, TimerValue]:
        """Timers printed after iteration N's line belong to N; before any, to start-up. A block
        after a record already handed out (a reader that emitted it on the log's quiet, before a
        save's timer came) has no owner: an issue (``timer-after-record``), never taken for
        start-up's."""
        if self._pending is not None:
            return self._pending.timers
        if self._intervals.prev is not None and not self._startup_seen:
            # An issue, so that the agent counts it (collector errors "parse:timer-after-record").
            it = self._intervals.prev.iteration
            self._issue("timer-after-record", f"a timer block after iteration {it}'s record was handed out: "
                                              "its timers are lost")
            return {}
        return self.job_info.startup_timers

    def _close_timers(self) -> None:
        if self._timer_target is not None and self._timer_target is self.job_info.startup_timers:
            # Start-up timers are job info: the same bounds as the rest of it (perfd.core.bounds).
            for reason in check_job_info(self.job_info):
                self._issue(BOUND_REASON, reason)
        self._timer_mode = None
        self._timer_target = None
        self._all_current = None

    def _complete(self, out: list[StepRecord]) -> None:
        """The pending record is final: put its step timers on a per-iteration basis, hand it out."""
        rec = self._pending
        if rec is None:
            return
        self._pending = None
        li = self.job_info.log_interval
        if li and rec.interval and rec.interval != li and self._step_timer_names:
            # Megatron divides the step timers by log_interval even when the log covers another
            # number of iterations (a run's first log, and the one after it: see intervals.py).
            scale = li / rec.interval
            for name in self._step_timer_names:
                tv = rec.timers.get(name)
                if tv is not None:
                    tv.min_ms = None if tv.min_ms is None else tv.min_ms * scale
                    tv.max_ms = None if tv.max_ms is None else tv.max_ms * scale
                    tv.per_rank = {r: v * scale for r, v in tv.per_rank.items()}
            self._count("records_timers_rescaled")
        # Every number of the record within perfd.core.bounds before anything sums it (two step times of
        # 1e308 overflowed the analysis' sums): one out of bounds is absent, never 0, and counted.
        for reason in check_step_record(rec):
            self._issue(STEP_REASON, f"iteration {rec.iteration}: {reason}", self._pending_line)
        out.append(rec)

    def _start_record(self, it: IterationLine, line: str, out: list[StepRecord]) -> None:
        self._complete(out)
        self._count("iteration_lines")
        if self._arrived is not None:
            self._count("end_times_from_line_arrival")
        rec = StepRecord(
            job=self.job,
            iteration=it.iteration,
            rank="last",
            end_time=it.end_time if self._arrived is None else self._arrived,
            train_iters=it.train_iters,
            fields=dict(it.pairs),
            source=Provenance(COLLECTOR, f"{self.source_name}:{self._line_no}"),
        )
        for key, value in it.pairs.items():
            if key in _FLOAT_FIELDS:
                setattr(rec, _FLOAT_FIELDS[key], to_float(value))
            elif key in _INT_FIELDS:
                setattr(rec, _INT_FIELDS[key], to_int(value))
            elif key.startswith(_THROUGHPUT_PREFIX):
                rec.logged_tflops_per_gpu = to_float(value)
        # Only start-up output seen marks a run's first record: a tail that starts (or an agent that
        # restarts) in the middle of a run has not seen any, and is no restart of the job.
        rec.first_of_run, self._startup_seen = self._startup_seen, False
        # A run is armed from its first step when its rank was armed before it began (the line comes
        # before the framework's start-up); a rank armed later (restarted alone) arms what follows.
        if rec.first_of_run or self._armed_seen:
            self._run_armed = self._armed_seen or (self._run_armed and not rec.first_of_run)
        self._armed_seen = False
        rec.armed = self._run_armed
        rec.interval = self._intervals.of(rec, self.job_info.log_interval)
        if it.truncated:
            self._issue("truncated-iteration-line", line)
        if it.intrusion is not None or it.bad_segments:
            # Another rank's text glued onto the line: dropped, never turned into a field.
            self._count("intrusions", (it.intrusion is not None) + it.bad_segments)
        self._pending, self._pending_line = rec, self._line_no
        self._step_timer_names = set()
        self._blocks_for_pending = 0


def parse_lines(lines: Iterable[str], job: str = "megatron", source_name: str = "<lines>") -> ParsedLog:
    parser = MegatronLogParser(job=job, source_name=source_name)
    records: list[StepRecord] = []
    for line in lines:
        records.extend(parser.feed(line))
    records.extend(parser.flush())
    return ParsedLog(parser.job_info, records, parser.issues, parser.counts, parser.events)


def parse_file(path: str | Path, job: str = "megatron") -> ParsedLog:
    """Parse a whole log file, plain, gzip, xz or zstd (perfd.core.logfiles). Bytes that are not UTF-8 are
    replaced; only OSError (an unreadable path, a corrupt archive), EOFError (a truncated one) and
    LogFileError are raised. Lines are split on b"\\n" alone, as LogTail does, so both see the same
    lines."""
    p = Path(path)
    return parse_lines(iter_text_lines(p), job=job, source_name=p.name)
