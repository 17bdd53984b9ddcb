"""Provenance as codes: each sentence declared once (in the report), rendered where shown, kept compact in
a table."""

from __future__ import annotations

import math
import string

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_grade import MfuFacts, MfuFinding, MfuSaid
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table, _Cites
from perfd.analytics.steps.provenance import Code, Kind, cite
from perfd.core.model import Provenance
from perfd.report import build_report
from perfd.report.provenance_text import TEMPLATE, line, text
from tests.analytics.analytics_helpers import fixture_job, fixture_records

LOG = Provenance("megatron", "train.log:1769")


def test_golden_sentences() -> None:
    """A few renderings pinned word for word: the report and the JSON legend show these."""
    assert line(cite(Code.RECORD, LOG)) == "megatron:train.log:1769"
    share = cite(Code.TIMER_SHARE, "megatron", "batch-generator", "max across ranks", 12.7, 331.1, LOG)
    assert line(share) == ("megatron:timer batch-generator (max across ranks) 12.7 ms ÷ step time 331.1 ms; "
                           "megatron:train.log:1769")
    comm = cite(Code.COMM_SUM_OF_MAX, "megatron", ("all-grads-sync", "forward-recv"), 8.6, 331.1, LOG)
    assert line(comm) == (
        "megatron:Σ max across ranks(all-grads-sync, forward-recv) = 8.60 ms ÷ step 331.1 ms (maxima may "
        "come from different ranks: upper bound); megatron:train.log:1769")
    bubble = cite(Code.BUBBLE_INTERLEAVED, 1, 2, 16)
    assert line(bubble) == "analytics:interleaved 1F1B (p-1)/(v·m+p-1) = 1/(2·16+1)"
    assert line(cite(Code.NO_LOSS)) == "absent: no loss on this iteration (a NaN loss removes the field)"
    # an absence quoted inside a source: its reason alone, without "absent: "
    nested = cite(Code.THROUGHPUT_LOGGED, "megatron", cite(Code.MISSING, ("world size",)))
    assert line(nested) == ("megatron:logged throughput per GPU (perfd's formula unavailable: missing world "
                            "size)")
    assert text(cite(Code.NON_POSITIVE, 0.0, 2)) == "non-positive step time 0.0 ms or world 2"


def _fields(template: str) -> set[int]:
    return {int(f) for _, f, _, _ in string.Formatter().parse(template) if f is not None}


def test_every_code_has_a_kind_and_one_template_of_its_arity() -> None:
    """The analytics declare a code's kind and arity; the report its sentence, taking exactly those
    arguments (a template that skips one, or reads one past the end, fails here, not in a report)."""
    assert len({c.value for c in Code}) == len(Code)  # two codes of one kind and arity stay two codes
    assert set(TEMPLATE) == set(Code)
    for c in Code:
        assert isinstance(c.kind, Kind) and TEMPLATE[c]
        assert _fields(TEMPLATE[c]) == set(range(c.arity)), c
    assert cite(Code.WHY, "x").absent and not cite(Code.RECORD, LOG).absent
    assert all(c.kind is not Kind.CAVEAT or c.arity == 0 for c in Code)  # a caveat takes no numbers


def _row(i: int, **sources: object) -> IterationResult:
    return IterationResult(i, sources=dict(sources))  # type: ignore[arg-type]


def test_the_table_reads_back_every_argument_as_it_was() -> None:
    rows = [
        _row(1, step_time_ms=cite(Code.RECORD, LOG), data_share=cite(
            Code.TIMER_SHARE, "megatron", "batch-generator", "max across ranks", -0.0, 0.0, LOG)),
        # a leading zero: the number stays in the text
        _row(2, step_time_ms=cite(Code.RECORD, Provenance("hook", "rank1:pid0042")),
             mfu=cite(Code.WHY, "GPU name unknown"),
             pp_idle_max=cite(Code.IDLE_LIGHTER, 1.5, math.inf, 3.25, Provenance("j", "iteration 2"),
                              caveat=Code.MINMAX_PAIRING)),
        _row(3, step_time_ms=cite(Code.RECORD, Provenance("megatron", "x.log:" + "9" * 20)),  # past a double
             model_tflops_per_gpu=cite(Code.THROUGHPUT_LOGGED, "megatron",
                                       cite(Code.MISSING, ("world size",))),
             comm_exposed_share=cite(Code.COMM_PER_RANK, "megatron", ("all-grads-sync",), 3, 2.7, 369.8,
                                     LOG)),
    ]
    t: Table[IterationResult] = Table(IterationResult, key="iteration")
    t.extend(rows)
    assert list(t) == rows
    zero = t[0].sources["data_share"].args[3]
    assert isinstance(zero, float) and math.copysign(1.0, zero) == -1.0  # -0.0 stays -0.0
    assert [r.sources for r in t.take([2, 0])] == [rows[2].sources, rows[0].sources]
    assert [r.sources for r in t.slice(1, 3)] == [rows[1].sources, rows[2].sources]
    t.put(0, sources=rows[1].sources)
    assert t[0].sources == rows[1].sources and t[1] == rows[1]
    # a NaN argument (never equal to itself) reads back as a NaN
    t.append(_row(4, data_share=cite(Code.TIMER_SHARE, "hook", "data-wait", "max across ranks", math.nan, 1.0,
                                     LOG)))
    nan = t[3].sources["data_share"].args[3]
    assert isinstance(nan, float) and math.isnan(nan)


def test_a_run_keeps_one_shape_and_its_numbers_per_row() -> None:
    """The rows of a run share their codes and texts: a row holds only its numbers and log line."""
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200", live=False)
    col = a.iterations._cols["sources"]
    assert isinstance(col, _Cites)
    assert len(a.iterations) == 40 and len(col.shapes) <= 3  # warm-up rows differ (a NaN loss, ...)
    assert len(col.nums) <= 12 * len(a.iterations)  # its log line, step, data wait, 3 sums, 5 timers
    assert not any(isinstance(x, str) for x in col.store)


def test_a_finding_quotes_a_source_as_a_code_and_the_report_words_it() -> None:
    """The MFU-absent finding carries the first iteration's MFU source as a code; the report's
    finding reads as it always did (a golden observation), the analysis' own holds no sentence."""
    a = analyze_run(fixture_job(), fixture_records(), gpu_name=None, live=False)
    (raw,) = [f for f in a.findings if f.id == "mfu-absent"]
    assert isinstance(raw, MfuFinding) and raw.facts == MfuFacts(said=MfuSaid.QUOTED,
                                                                 quoted=a.iterations[0].sources["mfu"])
    assert raw.facts.quoted is not None and raw.facts.quoted.code is Code.PEAK_NO_GPU
    assert raw.observation == ""  # the analysis' own holds no sentence
    (shown,) = [f for f in build_report(a).findings if f.id == "mfu-absent"]
    assert shown.observation == ("MFU absent: GPU name unknown; give the GPU (--gpu NAME, as NVML names it) "
                                 "or its peak (--peak-tflops N) to get MFU")
    assert "quotes" not in shown.to_json() and shown.to_json()["observation"] == shown.observation
