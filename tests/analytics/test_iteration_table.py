"""The column store of per-iteration results, and the streaming builder that fills it."""

from __future__ import annotations

import dataclasses

from perfd.analytics.run.run_analysis import RunBuilder, analyze_run
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.analytics.steps.provenance import Code, cite
from perfd.report import analysis_json
from tests.analytics.analytics_helpers import fixture_job, fixture_records


def _results() -> list[IterationResult]:
    a = analyze_run(fixture_job(), fixture_records(), gpu_name="NVIDIA H200")
    return [dataclasses.replace(it) for it in a.iterations]


def test_rows_read_back_as_they_were_added() -> None:
    rows = _results()
    rows[3].straggler_rank_compute_ratio = {0: 1.25, 1: 0.8}  # a container that is not empty
    rows[4].tflops_check_ok, rows[5].straggler_rtt_max_rank = None, None
    t: Table[IterationResult] = Table(IterationResult, key="iteration")
    t.extend(rows)
    assert len(t) == len(rows) and list(t) == rows and t[-1] == rows[-1]
    assert list(t[2:5]) == rows[2:5] and list(t.column("mfu")) == [r.mfu for r in rows]
    assert t.get(3, "straggler_rank_compute_ratio") == {0: 1.25, 1: 0.8}


def test_a_row_read_is_a_copy() -> None:
    t: Table[IterationResult] = Table(IterationResult, key="iteration")
    t.extend(_results())
    row = t[0]
    row.sources["mfu"] = cite(Code.UNKNOWN)
    row.straggler_candidate_ranks.append(7)
    row.mfu = 1.0
    assert t[0].sources.get("mfu") != cite(Code.UNKNOWN) and 7 not in t[0].straggler_candidate_ranks
    assert t[0].mfu != 1.0
    t.put(0, mfu=0.5)
    assert t[0].mfu == 0.5


def test_take_and_last_index_of() -> None:
    rows = _results()
    t: Table[IterationResult] = Table(IterationResult, key="iteration")
    t.extend(rows)
    back = t.take(range(len(rows) - 1, -1, -1))
    assert list(back) == rows[::-1]
    assert t.last_index_of(rows[7].iteration) == 7 and t.last_index_of(10**9) is None


def test_builder_takes_records_in_any_order() -> None:
    records = fixture_records()
    want = analysis_json(analyze_run(fixture_job(), records, gpu_name="NVIDIA H200"))
    run = RunBuilder(fixture_job(), "NVIDIA H200")
    for rec in reversed(records):
        run.add(rec)
    assert analysis_json(run.finish()) == want


def test_a_slice_is_a_new_table_and_a_projection_reads_only_its_fields() -> None:
    rows = _results()
    for pack in (True, False):
        t: Table[IterationResult] = Table(IterationResult, key="iteration", pack=pack)
        t.extend(rows)
        s = t.slice(2, 6)
        assert list(s) == rows[2:6]
        s.put(0, mfu=0.5, excluded_reason="x")
        s.append(rows[0])
        assert t[2] == rows[2] and len(t) == len(rows) and len(s) == 5  # the original is untouched
        proj = t.project(("iteration", "mfu"))
        assert [(p.iteration, p.mfu) for p in proj] == [(r.iteration, r.mfu) for r in rows]
        assert [p.iteration for p in proj[3:]] == [r.iteration for r in rows[3:]]
        assert proj[-1]._fields == ("iteration", "mfu")
