"""`perfd analyze megatron LOG` over a log of any length: the log is parsed and analysed as it is
read, so memory follows what the analysis keeps (compact per-iteration columns), not the log.

A StepRecord (timers, raw fields, straggler line) is analysed the moment the parser completes it and
then dropped. Its metrics depend on the job's start-up facts (layout, model, arguments), which a
Megatron log prints before its first iteration; if the parser still learns a job fact after the
first record (an unusual log), the file is read a second time with the complete facts, so the
result is always the analysis of the whole log's records under its final job info. Standard input
is spooled to a temporary file first, for the same reason.
"""

from __future__ import annotations

import copy
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perfd.analytics.breakdown.diagnosis import TimelineClass
from perfd.analytics.run.run_analysis import RunBuilder
from perfd.analytics.run.run_result import RunAnalysis, digest
from perfd.analytics.run.runs import RunDigest
from perfd.collectors.megatron.parser import MegatronLogParser
from perfd.core.model import JobInfo, ParseIssue, StepRecord


@dataclass
class OfflineParse:
    """What `perfd analyze megatron` reports of the parse (the records themselves are not kept)."""

    job_info: JobInfo
    n_records: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)  # as the parser keeps them (capped there)
    passes: int = 1  # 2 when the job info grew after the first record


def analyze_stream(path: str, read_lines: Callable[[str], Iterable[str]], job: str, source_name: str,
                   gpu: str | None = None, peak_tflops: float | None = None,
                   dtype: str | None = None, timeline: TimelineClass | None = None
                   ) -> tuple[OfflineParse, RunAnalysis | None]:
    """Parse and analyse the log at ``path`` (``read_lines(path)`` gives its lines) without keeping
    its records; (parse facts, analysis), the analysis None when the log has no iteration."""
    parse, run, first_job = _pass(read_lines(path), job, source_name, gpu, peak_tflops, dtype, None, timeline)
    if run is not None and parse.job_info != first_job:
        final = parse.job_info
        parse, run, _ = _pass(read_lines(path), job, source_name, gpu, peak_tflops, dtype, final, timeline)
        parse.passes = 2
    return parse, (run.finish() if run is not None else None)


def _pass(lines: Iterable[str], job: str, source_name: str, gpu: str | None, peak: float | None,
          dtype: str | None, fixed_job: JobInfo | None, timeline: TimelineClass | None = None
          ) -> tuple[OfflineParse, RunBuilder | None, JobInfo | None]:
    """One read of the log. The analysis takes ``fixed_job`` or, without it, the job info as the
    parser knows it at the first record (a copy: the parser goes on filling its own)."""
    parser = MegatronLogParser(job=job, source_name=source_name)
    run: RunBuilder | None = None
    used: JobInfo | None = None
    earlier: list[RunDigest] = []  # the log's earlier runs, digested as the live aggregator does
    n = 0

    def add(records: Iterable[StepRecord]) -> None:
        nonlocal run, used, n
        for rec in records:
            if run is not None and rec.first_of_run and n:  # a restart appended to the log: a new run
                earlier.append(digest(run.finish(job), run.run))
                run = None
            if run is None:
                info = fixed_job or copy.deepcopy(parser.job_info)
                used = used or info
                run = RunBuilder(info, gpu, peak, dtype, timeline=timeline, live=False, earlier=earlier)
            run.add(rec)
            n += 1

    for line in lines:
        add(parser.feed(line))
        # Validation results are not part of this report; a long run prints one per eval interval.
        parser.events.clear()
    add(parser.flush())
    return OfflineParse(parser.job_info, n, dict(parser.counts), parser.issues), run, used


def spooled_stdin(directory: str) -> str:
    """Standard input copied to a file under ``directory`` (it may have to be read twice)."""
    dst = Path(directory) / "stdin.log"
    with dst.open("wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f)
    return str(dst)


def temporary_directory() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="perfd-analyze-")
