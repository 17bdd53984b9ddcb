"""Per-iteration JSON rows sized for their readers: each fact once, provenance as codes, ranges not lists.

An iteration's typed result (perfd.analytics.steps.iteration.IterationResult) keeps the source of
every metric as a code with the row's own numbers and log line (perfd.analytics.steps.provenance);
in English that is ~1.7 KB an iteration, the same sentences on every row (`perfd analyze --iterations
all` of a 150-iteration log was twice the log's size when rows carried them). As JSON a row carries
instead:

- ``source``: its record's own provenance (the log line, the hook's rank and pid);
- the metrics it has (a metric it lacks is not in it: absent, never null; an empty list or mapping,
  no candidate rank, is not in it either, nor a flag not raised but ``steady_state``);
- ``absent``: ``{metric: code}`` for a metric it lacks that the run's newest row has — the code a key
  of the legend's ``absent`` (a NaN loss, a timer missing from one line); codes are the same in every
  document (a short hash of the reason), so rows compare across documents;
- ``excluded`` (an Exclusion code) and ``excluded_ref`` (the incident or capture, by id) when it is
  out of the steady state.

The legend (:meth:`RowCodes.legend`) says each once, in English: every metric's source as the newest
row has it, the absence reasons, the exclusion kinds, and the straggler notes and the measuring
methods (``comm_method``, ``pp_idle_method``) with the ranges of rows each held on (a note like
"per-rank timers present" is the run's, not one row's).
Here, where things are shown, not in the analytics: the rows' and the legend's English (each code's
sentence, perfd.report.provenance_text) is made only where it is shown — `perfd analyze --json` and
the aggregator's /api/jobs/<job>/iterations. A summary's excluded iterations as ranges of (kind,
reference): perfd.analytics.steps.steady.excluded_ranges. Pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from perfd.analytics.breakdown.bottleneck import Bottleneck
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.run_summary import JobBlock
from perfd.analytics.steps.iteration import IterationResult, json_value
from perfd.analytics.steps.steady import Exclusion
from perfd.report.bottleneck_text import bottleneck_json
from perfd.report.finding_text import runs_json
from perfd.report.incident_text import incident_json
from perfd.report.provenance_text import line, lines, text

# Row keys replaced by codes (the English in the legend), those a row never repeats (the MFU against
# the measured matmul ceiling is the row's MFU times the run's one ratio, in the job block), and those
# kept as they are.
CODED = ("sources", "excluded_reason", "straggler_notes")
# How a row's numbers were measured (the exposed communication's method, the stage idle's): the run's
# own, said once in the legend with the ranges of rows it held on.
RANGED = ("comm_method", "pp_idle_method")
DERIVED = ("mfu_vs_measured_ceiling",)
STATED = ("steady_state",)  # a flag every row states, raised or not (the rest: only where raised)
CODE_CHARS = 8  # of a text's SHA-1: a code per distinct reason or note
STEP_TIME = "step_time_ms"  # whose source is the record's own (its log line)

# Each kind in one sentence, for a reader of the codes (the per-iteration sentence, with its numbers,
# stays in SteadyState.excluded for the report's findings).
EXCLUSION_TEXT: dict[Exclusion, str] = {
    Exclusion.WARMUP: "warm-up: the run's first records",
    Exclusion.CAPTURE: "disturbed by perfd's own capture (its id in the range)",
    Exclusion.NO_STEP_TIME: "no step time",
    Exclusion.OUTLIER: "a step far slower than the steady one, in a slow window",
    Exclusion.INCIDENT: "part of an incident (its id in the range; its cause in the job's incidents)",
    Exclusion.PAUSE: "the loop's own pause (an evaluation, a checkpoint save) at a cadence (its id in the "
                     "range)",
}


def _plain(v: object) -> object:
    """JSON's own: non-finite floats are absent (finite_json), mappings keyed by text."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


class RowCodes:
    """Codes the rows of one run (one document: the codes index its legend)."""

    def __init__(self, newest: IterationResult | None, kinds: Mapping[int, Exclusion],
                 refs: Mapping[int, str]) -> None:
        self.newest = newest
        self.kinds, self.refs = kinds, refs
        self._absent: dict[str, str] = {}  # text -> its code
        self._notes: dict[str, str] = {}
        self._note_spans: dict[str, list[list[int]]] = {}  # code -> [first, last] of rows it held on
        self._last: int | None = None  # the previous row's iteration
        self._methods: dict[str, dict[str, list[list[int]]]] = {}  # field -> value -> its ranges

    @staticmethod
    def _code(table: dict[str, str], text: str) -> str:
        """A short code for ``text``, the same in every document (a run's rows shown whole or in part
        compare equal)."""
        code = table.get(text)
        if code is None:
            code = table[text] = hashlib.sha1(text.encode()).hexdigest()[:CODE_CHARS]
        return code

    def row(self, it: IterationResult) -> dict[str, object]:
        """One iteration's row (see the module docstring)."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(it):
            v = getattr(it, f.name)
            if f.name in RANGED and v is not None:
                self._span(self._methods.setdefault(f.name, {}).setdefault(str(v), []), it.iteration)
                continue
            if f.name in CODED or f.name in DERIVED or v is None or (isinstance(v, (list, dict)) and not v):
                continue  # absent, or nothing in it (no candidate rank, no per-rank ratio)
            if v is False and f.default is False and f.name not in STATED:
                continue  # a flag not raised (not armed, not between stages)
            out[f.name] = _plain(v)
        step = it.sources.get(STEP_TIME)
        src = line(step) if step is not None else None
        if src:
            out["source"] = src
        newest = self.newest
        if newest is not None:
            absent = {k: self._code(self._absent, line(c)) for k, c in it.sources.items()
                      if hasattr(it, k) and getattr(it, k) is None and getattr(newest, k) is not None}
            if absent:
                out["absent"] = absent
        kind = self.kinds.get(it.iteration)
        if kind is not None:
            out["excluded"] = kind.value
            ref = self.refs.get(it.iteration)
            if ref is not None:
                out["excluded_ref"] = ref
        for n in it.straggler_notes:  # a run's notes hold for stretches of it: ranges, in the legend
            self._span(self._note_spans.setdefault(self._code(self._notes, text(n)), []), it.iteration)
        self._last = it.iteration
        return out

    def _span(self, spans: list[list[int]], iteration: int) -> None:
        """Extend the last range of ``spans`` when the previous row was in it, else open one."""
        if spans and spans[-1][1] == self._last:
            spans[-1][1] = iteration
        else:
            spans.append([iteration, iteration])

    def rows(self, its: Iterable[IterationResult]) -> Iterator[dict[str, object]]:
        return (self.row(it) for it in its)

    def legend(self, sources: bool = True) -> dict[str, object]:
        """The English each code stands for, said once (after the rows: a streamed document has
        seen every code by then). ``sources``: every metric's source as the newest row has it."""
        out: dict[str, object] = {}
        if sources and self.newest is not None:
            out["sources"] = lines(self.newest.sources)
        out["absent"] = {code: text for text, code in self._absent.items()}
        out["notes"] = {code: {"text": text, "iterations": self._note_spans.get(code, [])}
                        for text, code in self._notes.items()}
        out["excluded"] = {k.value: t for k, t in EXCLUSION_TEXT.items()}
        out["methods"] = {name: dict(by) for name, by in self._methods.items()}
        return out


def row_codes(a: RunAnalysis) -> RowCodes:
    """The coder of a run's JSON rows: one per document."""
    n = len(a.iterations)
    return RowCodes(a.iterations[n - 1] if n else None, a.steady.kinds, a.steady.refs)


def iteration_rows(a: RunAnalysis, steady_only: bool = False, codes: RowCodes | None = None
                   ) -> Iterator[dict[str, Any]]:
    """JSON rows of every iteration, or of the steady ones, built one at a time (``codes``: the
    document's coder, whose legend says what the rows' codes mean)."""
    coder = codes if codes is not None else row_codes(a)
    return coder.rows(a.steady_rows() if steady_only else a.iterations)


def job_json(block: JobBlock) -> dict[str, Any]:
    """The job block's JSON as served (the API, W&B's config): its codes — where the dtype and the peak
    come from, or why there is no peak; the FLOPs count's notes — as their sentences, in their keys'
    places."""
    job = json_value(block.to_json())
    gpu = job.get("gpu") if isinstance(job, dict) else None
    assert isinstance(job, dict) and isinstance(gpu, dict)  # JobBlock.to_json's shape
    for key, c in (("dtype_source", block.gpu.dtype_source), ("peak_source", block.gpu.peak_source),
                   ("peak_reason", block.gpu.peak_reason)):
        if c is not None:
            gpu[key] = text(c)
    job["flops_notes"] = [text(n) for n in block.flops.notes]
    return job


def _with_bottleneck(summary: Mapping[str, Any], b: Bottleneck) -> dict[str, Any]:
    """The summary's JSON with its class's reason, votes and sources after the class."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        out[k] = v
        if k == "bottleneck":
            out.update(bottleneck_json(b))
    return out


def run_json(a: RunAnalysis, iterations: bool = True) -> dict[str, Any]:
    """Keys: job, iterations, iteration_codes (the rows' legend), summary, incidents (and
    capture_match, where a capture was read against the job: perfd.analytics.breakdown
    .capture_match). A row has the metrics it has (absent ones are not in it; the legend says why).
    ``iterations=False``: no rows (a caller that streams them, see iteration_rows)."""
    codes = row_codes(a)
    rows = list(iteration_rows(a, codes=codes)) if iterations else []
    rest = a.to_json()
    rest.pop("job")
    summary = _with_bottleneck(rest.pop("summary"), a.summary.bottleneck)
    summary["runs"] = runs_json(a.summary.runs, summary["runs"])  # with why the figures are elsewhere
    return {"job": job_json(a.job), "iterations": rows, "iteration_codes": codes.legend(),
            "summary": summary,
            "incidents": [json_value(incident_json(i)) for i in a.incidents], **rest}

