"""The top Nsight Compute kernels beside the budget part they explain, on recorded H100
data: the capture perfd took by rule on real Megatron-LM (docs/evidence/ncu_h100/ncu_megatron_rule.json,
its ``capture.result``: the rows as the agent's event carried them, joined to the job's Kineto capture of
3 steps), the same range's exports (tests/data/ncu/h100_megatron_rank0_*.csv) and the MLP loop's
details page (tests/data/ncu/h100_mlp_sol_details_5.csv: no raw page, so no tensor pipe)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.capture_records import CaptureRecord, CaptureResult, ncu_of
from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.http import job_summary
from perfd.aggregator.state import AggregatorState
from perfd.analytics.breakdown import kernels as kc
from perfd.analytics.breakdown.budget import BudgetPart, Source, StepBudget
from perfd.analytics.breakdown.job_budget import with_ncu
from perfd.analytics.breakdown.kernel_rows import (
    NCU_KERNEL_ROWS,
    KernelRow,
    Reading,
    RowVerdict,
    TimeBasis,
    kernel_rows,
)
from perfd.analytics.breakdown.ncu_kernels import KernelBound, MatchKind
from perfd.analytics.breakdown.ncu_rows import JoinedKernel
from perfd.analytics.breakdown.step_parts import Part
from perfd.analytics.ncu.join import join, short_name
from perfd.capture.ncu_report import parse_csv, parse_exports
from perfd.core.model import CaptureStatus
from perfd.report import budget_view, ncu_view
from perfd.transport.codec import Command

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence" / "ncu_h100" / "ncu_megatron_rule.json"
NCU_DATA = ROOT / "tests" / "data" / "ncu"
JOB = "ncu-rule"
# The Kineto capture the rows were joined to (c20261123-223603-bf9e4a) held 3 steps: the rule of
# tests/gpu/ncu_megatron_rule.py that took it asks for 3. The recording predates the rows carrying it.
TIMELINE_STEPS = 3
MASKED_FILL, TNT, SOFTMAX = "masked_fill_kernel", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", \
    "softmax_warp_forward"


def rank0(steps: int | None = TIMELINE_STEPS) -> dict[str, Any]:
    """The capture's rank-0 result as the aggregator received it, the rows with the timeline's steps."""
    r = json.loads(EVIDENCE.read_text())["capture"]["result"]["ranks"]["0"]
    assert isinstance(r, dict)
    if steps is not None:
        r["ncu_kernels"] = [{**k, "timeline_steps": steps} for k in r["ncu_kernels"]]
    return r


def typed(rows: list[dict[str, Any]]) -> list[JoinedKernel]:
    """Joined rows as the aggregator reads them from a capture's event."""
    got = [JoinedKernel.from_json(r) for r in rows]
    assert all(g is not None for g in got)
    return [g for g in got if g is not None]


def recorded(name_part: str, grid: str | None = None) -> dict[str, Any]:
    return next(k for k in rank0()["ncu_kernels"] if name_part in k["name"] and grid in (None, k["grid"]))


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """A real Megatron-LM log's steps (the timers' budget: compute not divided) and the ncu capture's
    result, through the aggregator, as in test_ncu_answer."""
    from perfd.collectors.megatron import parse_file

    parsed = parse_file(ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log", job=JOB)
    end = max(r.end_time or 0.0 for r in parsed.records)
    st = AggregatorState(min_recompute_s=0.0)
    st.hello("agent-a", [JOB])
    st.ingest_job_info("agent-a", JOB, parsed.job_info)

    def send(agent: str, cmd: Command) -> bool:
        return True

    coord = CaptureCoordinator(st, None, send)
    st.ingest_steps("agent-a", parsed.records)
    rec = coord.request(JOB, [0], "ncu", 1, "rule:ncu-deep-dive", now=end - 5.7)
    for kind, at, payload in (("capture_started", end - 5.0, None),
                              ("capture_finished", end + 10.0, {"status": "ok", "ranks": {"0": result}})):
        st.ingest_events("agent-a", [{"kind": kind, "time": at, "job": JOB, "text": kind,
                                      "labels": {"job": JOB, "tool": "ncu", "ranks": "0"},
                                      "links": {"command_id": rec.id, "capture_id": "c1"},
                                      "payload": payload}])
    st.analysis(JOB, force=True)
    s = job_summary(st, JOB)
    assert s is not None
    return s


def compute_part(s: dict[str, Any]) -> dict[str, Any]:
    (part,) = [p for p in s["report"]["step_budget"]["parts"] if p["part"] == "compute"]
    assert isinstance(part, dict)
    return part


def test_the_top_kernels_sit_on_the_part_in_time_order_with_the_recorded_figures() -> None:
    s = summary_of(rank0())
    part = compute_part(s)
    rows = [KernelRow.from_json(d) for d in part["detail"]["ncu_kernels"]]
    assert len(rows) == NCU_KERNEL_ROWS
    fill, tnt, softmax = rows
    assert fill is not None and tnt is not None and softmax is not None
    assert [short_name(r.name) for r in (fill, tnt, softmax)] == [
        f"elementwise_kernel<{MASKED_FILL}>", TNT, SOFTMAX]
    # time per step: the joined Kineto kernel's time over its 3 steps; share of the part's ms
    rec = recorded(MASKED_FILL)
    assert fill.time_basis is TimeBasis.TIMELINE and fill.match is MatchKind.TEMPLATE
    assert fill.step_ms == pytest.approx(rec["captured_ms"] / TIMELINE_STEPS)  # 6.90 ms
    assert fill.part_share == pytest.approx(rec["captured_ms"] / TIMELINE_STEPS / part["ms"])
    assert fill.step_ms > tnt.step_ms > softmax.step_ms  # type: ignore[operator]
    # the figures are ncu's, unchanged
    assert (fill.compute, fill.memory, fill.dram, fill.tensor, fill.occupancy) == (
        rec["compute_throughput"], rec["memory_throughput"], rec["dram_throughput"], rec["tensor_pipe"],
        rec["achieved_occupancy"])
    assert fill.bound is KernelBound.COMPUTE and fill.reading is Reading.ISSUE_SLOTS
    assert fill.verdict is RowVerdict.ISSUE_BOUND and fill.timeline == "c20261123-223603-bf9e4a"
    assert fill.profiled_ms == pytest.approx(rec["duration_ms"] * rec["invocations"])
    # the GEMM's two grids joined one Kineto kernel: one row, its time counted once, its figures the
    # means weighted by each grid's profiled time; balanced (0.47 ms of its 0.66 ms)
    a, b = (k for k in rank0()["ncu_kernels"] if k["name"] == TNT)
    wa, wb = a["duration_ms"] * a["invocations"], b["duration_ms"] * b["invocations"]
    assert tnt.rows == 2 and tnt.invocations == a["invocations"] + b["invocations"]
    assert tnt.step_ms == pytest.approx(a["captured_ms"] / TIMELINE_STEPS)
    mean = (a["compute_throughput"] * wa + b["compute_throughput"] * wb) / (wa + wb)
    assert tnt.compute == pytest.approx(mean)
    assert tnt.bound is KernelBound.BALANCED and tnt.reading is Reading.TENSOR_MATH
    assert tnt.verdict is RowVerdict.SHAPE  # 59% of compute SOL: under the latency bar
    # attention's softmax: compute-bound, not pointwise: no reading beyond ncu's class, no verdict
    assert softmax.bound is KernelBound.COMPUTE and softmax.reading is None and softmax.verdict is None


def test_the_text_report_shows_them_under_their_part() -> None:
    from perfd.report.render import render_text
    from perfd.report.training_report import Report

    s = summary_of(rank0())
    text = render_text(Report.from_json(s["report"]))
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.lstrip().startswith("compute (not divided)"))
    end = next(i for i, x in enumerate(lines) if x.lstrip().startswith("= step"))
    block = "\n".join(lines[at:end])
    assert block.index("ncu: gemm (3 kernel(s))") < block.index("ncu kernel 1:")
    flat = " ".join(block.split())
    assert f"ncu kernel 1: elementwise_kernel<{MASKED_FILL}>, 6.90 ms a step, 1.9% of the part" in flat
    assert ("compute SOL 64%, memory SOL 34%, DRAM 33%, tensor pipe 4%, occupancy 93%; ncu: compute-bound; "
            "perfd: issue slots and integer index arithmetic, not math (tensor pipe under 10%); → fuse it"
            in flat)
    assert f"ncu kernel 2: {TNT}, 4.09 ms a step" in flat and "2 ncu rows (grid, block)" in flat
    assert f"ncu kernel 3: {SOFTMAX}, 2.39 ms a step" in flat
    assert all(len(x) <= 100 for x in lines[at + 4:end])  # the kernel lines wrap at the report's width


def test_rows_whose_timeline_steps_are_unknown_give_no_time_per_step() -> None:
    """The recording as the agent sent it (before the rows carried the timeline's steps): each joined
    row has its share of the captured kernel time, and no ms per step, said so."""
    part = compute_part(summary_of(rank0(steps=None)))
    rows = [r for d in part["detail"]["ncu_kernels"] if (r := KernelRow.from_json(d)) is not None]
    assert [r.time_basis for r in rows] == [TimeBasis.TIMELINE_TOTAL] * 3
    assert all(r.step_ms is None and r.part_share is None for r in rows)
    assert rows[0].captured_share == recorded(MASKED_FILL)["captured_share"]
    budget = StepBudget.from_json({"step_ms": 100.0, "parts": [{**part, "ms": 100.0, "share": 1.0}]})
    flat = " ".join(" ".join(ncu_view.text_lines(budget, Part.COMPUTE, "", 200)).split())
    assert ("12.1% of the kernel time of timeline c20261123-223603-bf9e4a (its steps unknown: no time per "
            "step)") in flat and "ms a step" not in flat


def test_kernels_with_no_timeline_match_show_ncus_replayed_time() -> None:
    """The same range's exports with no timeline to join (perfd analyze ncu without --capture), then one
    row the timeline does not list beside joined ones: the time is ncu's replayed duration, said so,
    with no share of the part, after the rows with a time per step."""
    texts = [(NCU_DATA / f"h100_megatron_rank0_{p}.csv").read_text() for p in ("details", "raw")]
    report = parse_exports(texts)
    rows = kernel_rows(join(report.kernels), 300.0, "c9")
    assert all(r.time_basis is TimeBasis.REPLAY and r.step_ms is None and r.part_share is None for r in rows)
    by_replay = sorted(report.kernels, key=lambda k: -(k.profiled_ms or 0.0))[:NCU_KERNEL_ROWS]
    assert [r.profiled_ms for r in rows] == [k.profiled_ms for k in by_replay]
    assert "no timeline of the job to join: ncu's own replayed duration, not a time per step" \
        in ncu_view.time_text(rows[0])
    # a row the timeline does not list, beside the joined ones
    ks = rank0()["ncu_kernels"]
    gelu = next(k for k in ks if "Gelu" in k["name"])
    gelu.update(match="none", timeline_name=None, captured_ms=None, captured_share=None)
    rows = kernel_rows(typed(ks), 300.0, "c9", n=len(ks), joined_to="tl1")
    g = next(r for r in rows if "Gelu" in r.name)
    assert g.time_basis is TimeBasis.REPLAY and g.step_ms is None
    assert g.profiled_ms == pytest.approx(gelu["duration_ms"] * gelu["invocations"])
    assert rows[-1] is g  # no time per step: after every joined row
    text = ncu_view.time_text(g)
    assert text.startswith(f"{gelu['duration_ms'] * 3:.3f} ms in ncu's replay of 3 launches")
    assert "not among timeline tl1's top kernels" in text
    html = ncu_view.html_table(_one_part(Part.POINTWISE, [g.to_json()]))
    assert "replayed by ncu<br><small>not in the timeline" in html


def test_absent_figures_stay_absent() -> None:
    """The MLP loop's details page has no raw page, so no tensor pipe: no row says one, no reading or
    verdict that needs it is given, and the HTML shows it as absent."""
    report = parse_csv((NCU_DATA / "h100_mlp_sol_details_5.csv").read_text())
    rows = kernel_rows(join(report.kernels), None, "c2", n=5)
    assert rows and all(r.tensor is None for r in rows)
    norm = next(r for r in rows if "layer_norm" in r.name)
    # compute-bound (SM 73%) normalisation: with the tensor pipe unknown, no "issue slots" reading
    assert norm.bound is KernelBound.COMPUTE and norm.reading is None and norm.verdict is None
    assert norm.occupancy == pytest.approx(0.8836)
    labels = [label for label, _ in ncu_view.figures(norm)]
    assert labels == ["compute SOL", "memory SOL", "DRAM", "occupancy"]
    html = ncu_view.html_table(_one_part(Part.NORM, [norm.to_json()]))
    cells = html.split("<td")
    assert cells[8].startswith(">–<")  # the tensor pipe's cell (part, kernel, time, share, 3 SOL, tensor)
    # the probe's head: no duration, no compute SOL: none invented
    probe = parse_csv((NCU_DATA / "h100_probe_sol_head.csv").read_text())
    (row,) = kernel_rows(join(probe.kernels), 50.0, "c3")
    assert row.profiled_ms is None and row.compute is None and row.bound is None and row.verdict is None
    assert [label for label, _ in ncu_view.figures(row)] == ["memory SOL"]
    assert "no duration in ncu's replay" in ncu_view.time_text(row)
    assert "ncu: class unknown" == ncu_view.bound_text(row)


def test_each_kernel_goes_to_the_part_its_time_is_in() -> None:
    """A budget divided by op (linear, attention, activation, pointwise): the GEMMs on the linear
    layers, softmax and the masked fill (beside softmax kernels: the attention mask) on attention, the
    GELU on the activation, the rest pointwise; the category summaries stay where they were."""
    parts = tuple(BudgetPart(p, ms, ms / 100.0, Source.CAPTURE) for p, ms in (
        (Part.LINEAR, 40.0), (Part.ATTENTION, 30.0), (Part.ACTIVATION, 5.0), (Part.POINTWISE, 25.0)))
    b = StepBudget(100.0, parts, (Source.CAPTURE,), iterations=3.0, basis="capture k1")
    got = ncu_of([CaptureRecord("n1", JOB, [0], "ncu", 1, "rule:ncu", 0.0, status=CaptureStatus.FINISHED,
                                finished_at=1.0, result=CaptureResult.of({"ranks": {"0": rank0()}}))])
    assert got.capture_id == "n1" and len(got.kernels) == 12
    assert got.joined_to == "c20261123-223603-bf9e4a"
    # read from the event as the agent wrote them: the same rows back (this recording's agent wrote no
    # launch-by-launch keys yet: they read as their defaults, no match by launch)
    for typed_rows, sent in (([k.to_json() for k in got.kernels], rank0()["ncu_kernels"]),
                             ([c.summary.to_json() for c in got.categories], rank0()["ncu_categories"])):
        assert [{k: v for k, v in t.items() if k in s} for t, s in zip(typed_rows, sent, strict=True)] == sent
    assert {k.part for k in got.kernels} == {None} and {c.summary.part for c in got.categories} == {None}
    nb = with_ncu(b, got.categories, got.capture_id, got.kernels, got.joined_to)

    def names(part: Part) -> list[str]:
        p = nb.get(part)
        assert p is not None
        return [short_name(r.name) for r in p.ncu_kernels or ()]

    assert names(Part.LINEAR) == [TNT, "nvjet_sm90_tst_64x512_64x2_1x2_h_bz_coopB_NNT"]
    assert names(Part.ATTENTION) == [f"elementwise_kernel<{MASKED_FILL}>", SOFTMAX]
    assert names(Part.ACTIVATION) == ["vectorized_elementwise_kernel<GeluCUDAKernelImpl>"]
    assert names(Part.POINTWISE) == [  # 3 of its 5, by time
        "fused_dropout_kernel_vec", "vectorized_elementwise_kernel<CUDAFunctor_add>",
        "elementwise_kernel<direct_copy_kernel_cuda>"]
    pw = nb.get(Part.POINTWISE)
    assert pw is not None and {c.summary.category for c in pw.ncu or ()} == {kc.ELEMENTWISE}
    att = nb.get(Part.ATTENTION)
    assert att is not None
    assert att.ncu_kernels
    share = att.ncu_kernels[0].part_share
    assert share == pytest.approx(recorded(MASKED_FILL)["captured_ms"] / TIMELINE_STEPS / 30.0)
    assert sum(p.ms for p in nb.parts) == b.step_ms  # the rows change no time
    lines = budget_view.text_lines(StepBudget.from_json(nb.to_json()))
    at = next(i for i, x in enumerate(lines) if x.lstrip().startswith("MLP activation"))
    gelu = "ncu kernel 1: vectorized_elementwise_kernel<GeluCUDAKernelImpl>"
    assert lines[at + 1].lstrip().startswith(gelu)


def test_the_html_shows_the_rows_beside_their_part_with_names_escaped() -> None:
    s = summary_of(rank0())
    html = budget_view.html_section(StepBudget.from_json(s["report"]["step_budget"]))
    table = html[html.index('<table class="ncu ncu-kernels">'):]
    assert '<td rowspan="3">compute (not divided)</td>' in table
    assert f"<code>elementwise_kernel&lt;{MASKED_FILL}&gt;</code>" in table
    # the full name in the title: a template with < > & escaped
    rec = recorded(MASKED_FILL)["name"]
    assert "&" in rec and "<" in rec
    assert ('title="void at::elementwise_kernel&lt;128, 4, void at::gpu_kernel_impl_nocast&lt;at::&lt;'
            "unnamed&gt;::masked_fill_kernel(at::TensorIterator &amp;, const c10::Scalar &amp;)") in table
    assert "<unnamed>" not in table and "TensorIterator &," not in table
    assert "<td>6.90 ms a step</td>" not in table and ">6.90 ms a step</td><td>1.9%</td>" in table
    assert "fuse it (fewer launches, index arithmetic done once)" in table
    # the same through the whole page
    from perfd.report.html import page_from_json, render_html

    page = render_html(page_from_json({"job": {}, "iterations": [], "summary": {}, "report": s["report"],
                                       "ranks": [], "incidents": []}), source="t", generated="t", version="t")
    assert table[:2000] in page


def test_rows_round_trip_and_unreadable_rows_are_skipped() -> None:
    rows = kernel_rows(typed(rank0()["ncu_kernels"]), 100.0, "c1", n=20, joined_to="t")
    assert len(rows) == 10  # 12 ncu rows: the GEMM's two grids one timeline kernel, the float fill's too
    assert all(KernelRow.from_json(r.to_json()) == r for r in rows)
    assert KernelRow.from_json({"name": "x", "match": "sideways", "time_basis": "timeline"}) is None
    budget = _one_part(Part.COMPUTE, [{"name": "x"}, rows[0].to_json()])
    assert len(ncu_view.rows_of(budget)[Part.COMPUTE]) == 1


def _one_part(part: Part, ncu_kernels: list[dict[str, Any]]) -> StepBudget:
    """A budget of one part holding these kernel rows (its JSON, as with_ncu's rows are written and read
    back)."""
    b = StepBudget.from_json({"step_ms": 0.0, "sources": [], "parts": [
        {"part": part.value, "ms": 0.0, "share": 0.0, "source": Source.NCU.value,
         "detail": {"ncu_kernels": ncu_kernels}}]})
    assert b is not None
    return b


@pytest.mark.parametrize(("name", "short"), [
    (recorded(MASKED_FILL)["name"], f"elementwise_kernel<{MASKED_FILL}>"),  # cut at 200 characters
    ("void at::vectorized_elementwise_kernel<8, at::CUDAFunctor_add<c10::BFloat16>, std::array<char *, 3>>"
     "(int, T2, T3)", "vectorized_elementwise_kernel<CUDAFunctor_add>"),
    ("void <unnamed>::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, 0, 0>(T2 *, const T1 *, "
     "int, int, int, const bool *, int, bool)", SOFTMAX),
    (TNT, TNT),
])
def test_short_names(name: str, short: str) -> None:
    assert short_name(name) == short


def test_a_kernel_whose_time_by_name_exceeds_the_part_by_op_has_no_share_and_says_so() -> None:
    """On the H100 (docs/evidence/entries/28-nsight-compute-by-rule-in-the-answer-2026-11-24-1-h100.md) the
    dropout kernel held 12.9 ms a step by name under "other pointwise", a part of 8.5 ms by op (attention's
    dropout is attention's): "152% of the part" was printed. The share goes; the row says its launches serve
    other parts too."""
    rec = recorded(MASKED_FILL)
    step_ms = rec["captured_ms"] / TIMELINE_STEPS
    (row,) = kernel_rows(typed([rec]), part_ms=0.66 * step_ms, joined_to="c-timeline")
    assert row.step_ms == pytest.approx(step_ms) and row.part_share is None and row.spans_parts
    assert "more than the part holds by op" in ncu_view.time_text(row)
    assert KernelRow.from_json(row.to_json()) == row
    (inside,) = kernel_rows(typed([rec]), part_ms=2.0 * step_ms, joined_to="c-timeline")
    assert inside.part_share == pytest.approx(0.5) and not inside.spans_parts
