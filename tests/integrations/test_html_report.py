"""`perfd report --html`: one self-contained page with the charts and the four-part report."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from perfd.aggregator.http import _StateCollector, job_iterations
from perfd.aggregator.state import AggregatorState
from perfd.analytics.steps.iteration import IterationResult
from perfd.analytics.steps.iteration_table import Table
from perfd.app.cli import main as perfd_main
from perfd.app.commands.analyze import analyze_megatron_file
from perfd.collectors.megatron import parse_file
from perfd.exporters.prometheus import job_families
from perfd.report.html import page_from_json, render_html
from perfd.report.svg import diverging_color, nice_ticks
from perfd.report.training_report import analysis_json, format_value
from tests.integrations.integrations_helpers import ROOT

DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
COTENANT = ROOT / "tests" / "data" / "incidents" / "costraggler_dp2" / "dp2_cotenant.log"
SVG = "{http://www.w3.org/2000/svg}"


def _pp2_log() -> Path:
    return DEMO_LOG  # the real 2×H200 TP=1 PP=2 run, in every checkout


def _svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg .*?</svg>", page, flags=re.S)]


def _page(log: Path, gpu: str = "NVIDIA H200") -> tuple[str, dict[str, Any]]:
    _, analysis = analyze_megatron_file(str(log), gpu=gpu)
    data = analysis_json(analysis)
    return render_html(page_from_json(data), source=f"log {log.name}", generated="2026-01-01 00:00:00 UTC",
                       version="test"), data


def test_report_of_the_shared_fixture_has_charts_and_numbers() -> None:
    page, data = _page(_pp2_log())
    med = data["summary"]["medians"]
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Self-contained: nothing fetched when opened, no script.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "@import" not in page
    # The four parts, in order, and the charts.
    heads = [h for h in ("Summary", "Charts", "Metrics (steady state:", "Findings", "Recommendations")]
    positions = [page.index(f">{h}") for h in heads]
    assert positions == sorted(positions)
    for title in ("Step time per iteration", "MFU per iteration", "Time breakdown per iteration",
                  "Pipeline bubble: analytic vs measured stage idle"):
        assert f"<title>{title}</title>" in page, title
    # Numbers: the report's medians, formatted as the text report formats them.
    assert format_value(med["mfu"], "ratio") == "8.2%" and "8.2%" in page
    assert "344.5 ms" in page and "80.9 TFLOP/s" in page  # the mean step; FLOPs summed over time summed
    assert format_value(med["pp_idle_max"], "ratio") in page
    assert format_value(med["pp_bubble_analytic"], "ratio") in page
    for m in data["report"]["metrics"]:
        assert f"<code>{m['name']}</code>" in page
    for f in data["report"]["findings"]:
        assert f["id"] in page
    for r in data["report"]["recommendations"]:
        assert r["finding_id"] in page
    # Per-rank heat map: the fixture has minmax timers only, so the page says why there is none.
    assert "No per-rank heat map" in page and "--timing-log-option all" in page
    # Every chart is well-formed SVG; one point per iteration on the step-time line.
    svgs = _svgs(page)
    # the step budget's waterfall, goodput, step time, MFU, step-time distribution, breakdown, pipeline
    assert len(svgs) == 7
    budget = next(s for s in svgs if (s.findtext(f"{SVG}title") or "").startswith("Step budget"))
    budget_bars = [r for r in budget.findall(f".//{SVG}rect") if r.find(f"{SVG}title") is not None]
    parts = data["report"]["step_budget"]["parts"]
    assert len(budget_bars) == len(parts) + 1  # a bar per part, and the step
    for p, r in zip(parts, budget_bars, strict=False):
        assert f"{p['ms']:.1f} ms per step" in (r.findtext(f"{SVG}title") or "")
    dist = next(s for s in svgs if s.findtext(f"{SVG}title") == "Step time distribution")
    bars_n = [r for r in dist.findall(f".//{SVG}rect") if r.find(f"{SVG}title") is not None]
    warm = data["summary"]["warmup_records"]
    assert sum(int((r.findtext(f"{SVG}title") or "").rsplit(" ", 1)[-1]) for r in bars_n) == \
        len(data["iterations"]) - warm  # every post-warm-up iteration in one bin
    d = data["summary"]["step_time_distribution_ms"]
    assert d["p50"] <= d["p90"] <= d["p99"] <= d["max"] and f"p99 {d['p99']:.1f} ms" in page
    assert "No rank placement" in page  # offline: no GPU table, and the page says why
    step = next(s for s in svgs if s.findtext(f"{SVG}title") == "Step time per iteration")
    n = len(data["iterations"])
    points = step.findall(f".//{SVG}circle")
    off_scale = step.findall(f".//{SVG}path")  # warm-up iterations above the axis
    assert len(points) + len(off_scale) == n
    assert any("5868" in (p.findtext(f"{SVG}title") or "") for p in off_scale)  # iteration 1's 5.9 s
    # Stacked breakdown: four parts per steady iteration (data, DP comm, PP comm, remainder).
    bars = next(s for s in svgs if s.findtext(f"{SVG}title") == "Time breakdown per iteration")
    rects = [r for r in bars.findall(f".//{SVG}rect") if r.find(f"{SVG}title") is not None]
    titles = [r.findtext(f"{SVG}title") or "" for r in rects]
    for it in data["iterations"]:
        if it["steady_state"]:
            assert sum(t.startswith(f"iteration {it['iteration']}:") for t in titles) == 4, it["iteration"]
    last = [r.findtext(f"{SVG}title") or "" for r in rects[-4:]]
    it = data["iterations"][-1]
    assert f"data loading {it['data_share'] * it['step_time_ms']:.0f} ms" in last[0]


def test_per_rank_heat_map_from_per_rank_timers() -> None:
    page, data = _page(DP2)
    assert "No per-rank heat map" not in page
    heat = next(s for s in _svgs(page) if s.findtext(f"{SVG}title") == "Per-rank compute ÷ stage median")
    cells = [r for r in heat.findall(f".//{SVG}rect") if r.find(f"{SVG}title") is not None]
    n = len(data["iterations"])
    assert len(cells) == 2 * n  # 2 ranks × every iteration
    it = data["iterations"][13]  # iteration 14: rank 0 at 1.15× its stage median
    r0 = it["straggler_rank_compute_ratio"]["0"]
    assert f"rank 0, iteration {it['iteration']}: {r0:.2f}×" in page
    # No pipeline parallelism: no pipeline chart (it would be a flat zero line).
    assert "Pipeline bubble" not in page


def test_heat_map_bins_many_iterations_and_labels_rank_placement() -> None:
    _, analysis = analyze_megatron_file(str(DP2), gpu="NVIDIA H200")
    data = analysis_json(analysis)
    many = []
    for k in range(20):  # 600 iterations: binned to at most 240 columns
        for it in data["iterations"]:
            many.append({**it, "iteration": it["iteration"] + 30 * k})
    data["iterations"] = many
    data["ranks"] = [{"rank": 0, "node": "n1", "gpu": "0"}, {"rank": 1, "node": "n2", "gpu": "3"}]
    page = render_html(page_from_json(data))
    heat = next(s for s in _svgs(page) if s.findtext(f"{SVG}title") == "Per-rank compute ÷ stage median")
    cells = [r for r in heat.findall(f".//{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert 2 * 200 <= len(cells) <= 2 * 240
    assert "rank 1 n2/gpu3" in page
    assert "Bars average consecutive iterations" in page


def test_absent_values_are_said_not_drawn_as_zero() -> None:
    page, data = _page(_pp2_log(), gpu="")  # no GPU: no peak, so no MFU
    assert all("mfu" not in it for it in data["iterations"])  # absent, never 0
    assert "MFU is absent" in page and "MFU per iteration" not in page
    empty = page_from_json({"job": {}, "iterations": [], "summary": {}, "report": {}})
    assert render_html(empty).count("No analysed") == 1


def test_cli_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert perfd_main(["report", "--log", str(_pp2_log()), "--gpu", "NVIDIA H200", "--html", str(out)]) == 0
    assert "MFU 8.2%" in out.read_text()
    assert perfd_main(["report", "--log", str(tmp_path / "missing.log"), "--html", str(out)]) == 2
    assert "no such log file" in capsys.readouterr().err
    assert perfd_main(["report", "--html", str(out)]) == 2
    assert perfd_main(["report", "--aggregator", "http://127.0.0.1:9", "--html", str(out)]) == 2  # no --job


def test_the_page_says_where_it_was_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page read from an aggregator said "the report was made offline" where its job had no rank
    placement: it names the live aggregator it was read from; a page made from a log says so."""
    from perfd.app.commands import report as report_cmd

    _, analysis = analyze_megatron_file(str(_pp2_log()), gpu="NVIDIA H200")
    data = analysis_json(analysis)
    summary = {"job": data["job"], "summary": data["summary"], "report": data["report"],
               "incidents": data["incidents"], "ranks": []}
    served = {"/api/jobs/gpt/summary": summary,
              "/api/jobs/gpt/iterations?sources=0": {"iterations": data["iterations"]}}
    monkeypatch.setattr(report_cmd, "_get_json", lambda url, *_: served[url.removeprefix("http://agg:9401")])
    live, offline = tmp_path / "live.html", tmp_path / "offline.html"
    assert perfd_main(["report", "--job", "gpt", "--aggregator", "agg:9401", "--html", str(live)]) == 0
    page = live.read_text()
    assert "made offline" not in page and "source: live, the aggregator at http://agg:9401, job gpt" in page
    assert "No rank placement: the aggregator at http://agg:9401 has none for this job" in page
    args = ["report", "--log", str(_pp2_log()), "--gpu", "NVIDIA H200", "--html", str(offline)]
    assert perfd_main(args) == 0
    page = offline.read_text()
    assert "No rank placement: the report was made offline, from a log" in page
    assert f"source: offline, log {_pp2_log()}" in page


def test_cli_aggregator_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integrations.integrations_helpers import free_port

    port = free_port()  # nothing listens there
    rc = perfd_main(["report", "--job", "j", "--aggregator", f"127.0.0.1:{port}", "--timeout", "2",
                     "--html", str(tmp_path / "r.html")])
    assert rc == 2 and f"127.0.0.1:{port}" in capsys.readouterr().err


def test_svg_helpers() -> None:
    assert nice_ticks(0, 7.3) == [0, 2, 4, 6, 8]
    assert nice_ticks(0, 0.084)[-1] >= 0.084
    assert diverging_color(1.0, 1.0, 0.2) == "#f7f7f7"
    assert diverging_color(1.2, 1.0, 0.2) == "#b2182b" and diverging_color(0.5, 1.0, 0.2) == "#2166ac"


def test_per_rank_series_switch_and_iterations_api() -> None:
    st = AggregatorState(gpu_override="NVIDIA H200")
    parsed = parse_file(DP2, job="big")
    st.hello("a1", ["big"])
    st.ingest_job_info("a1", "big", parsed.job_info)
    st.ingest_steps("a1", parsed.records)
    st.ingest_events("a1", [{"kind": "gpu_processes", "labels": {"node": "n1", "gpu": str(r)},
                             "payload": [{"pid": 100 + r, "rank": r, "world_size": 2}]} for r in (0, 1)])
    st.refresh()  # what the aggregator's refresher does: /metrics serves the last analysis
    text = {}
    for on in (True, False):
        reg = CollectorRegistry()
        reg.register(_StateCollector(st, per_rank_series=on))
        text[on] = generate_latest(reg).decode()
    assert 'perfd_job_rank_compute_ratio{job_name="big",rank="1"}' in text[True]
    assert 'perfd_job_rank_info{gpu="1",job_name="big",node="n1",rank="1"} 1.0' in text[True]
    assert "perfd_job_rank_compute_ratio{" not in text[False] and "perfd_job_rank_info{" not in text[False]
    assert 'perfd_job_mfu_ratio{job_name="big"}' in text[False]  # job series stay
    # The JSON API keeps the per-rank values either way.
    its = job_iterations(st, "big")
    assert its is not None and len(its["iterations"]) == len(parsed.records)
    assert its["iterations"][-1]["straggler_rank_compute_ratio"]
    assert job_iterations(st, "nope") is None
    one: Table[IterationResult] = Table(IterationResult, "iteration")
    one.append(IterationResult(1, straggler_rank_compute_ratio={0: 1.2}))
    fams = {f.name: f for f in job_families({"j": one}, per_rank=False)}
    assert fams["perfd_job_rank_compute_ratio"].samples == []


def test_no_rank_series_flag() -> None:
    from perfd.app.cli import build_parser

    args = build_parser().parse_args(["aggregator", "--no-rank-series"])
    assert args.no_rank_series is True
    assert build_parser().parse_args(["aggregator"]).no_rank_series is False


def test_heat_map_shows_the_cotenant_rank_as_a_band_under_its_incident() -> None:
    """The recorded co-tenant run: rank 1 (GPU shared with a foreign matmul, iterations 69-90) is a
    red band — every one of its cells there above 1.1x — and the incident is marked over the same
    columns; outside it neither rank stands out. The goodput bar adds up to the wall time."""
    page, data = _page(COTENANT)
    heat = next(s for s in _svgs(page) if s.findtext(f"{SVG}title") == "Per-rank compute ÷ stage median")
    band: dict[int, list[float]] = {0: [], 1: []}
    outside: list[float] = []
    marks = []
    for r in heat.findall(f".//{SVG}rect"):
        text = r.findtext(f"{SVG}title") or ""
        m = re.fullmatch(r"rank rank (\d+), iteration (\d+): ([\d.]+)×", text)
        if m:
            rank, it, v = int(m[1]), int(m[2]), float(m[3])
            if 70 <= it <= 89:
                band[rank].append(v)
            elif it > 30 and not 69 <= it <= 90:
                outside.append(v)
        elif text.startswith("incident"):
            marks.append(text)
    assert len(band[1]) == 20 and min(band[1]) > 1.1 and max(band[0]) < 0.9
    assert outside and max(outside) < 1.2  # past warm-up, a few single iterations reach 1.12x: noise
    # the co-tenant began inside step 69 (707 ms, 1.15x: not itself slow); the incident is its slow steps
    assert marks and all("iterations 70–90" in t for t in marks)
    gp = data["summary"]["goodput"]
    bar = next(s for s in _svgs(page) if s.findtext(f"{SVG}title") == "Where the wall time went")
    widths = [float(r.get("width") or 0) for r in bar.findall(f".//{SVG}rect")
              if r.find(f"{SVG}title") is not None]
    assert sum(widths) == pytest.approx(920 - 32, abs=1.0) and gp["ratio"] == pytest.approx(0.70, abs=0.01)


def test_heat_map_groups_ranks_by_pipeline_stage_and_marks_captures() -> None:
    from perfd.report.picture import ChartIteration, rank_heatmap

    its = [ChartIteration(i, straggler_rank_compute_ratio={r: 1.0 + 0.01 * r for r in range(4)})
           for i in range(1, 11)]
    from perfd.analytics.run.run_summary import DisturbanceStretch, JobLayout

    lay = JobLayout(world_size=4, tp=1, pp=2, dp=2, cp=1)
    stretches = (DisturbanceStretch(first_iteration=4, last_iteration=5, excess_s=None),)
    html = rank_heatmap(its, (), lay, stretches, [])
    svg = _svgs(html)[0]
    labels = [t.text for t in svg.findall(f".//{SVG}text")]
    assert "stage 0" in labels and "stage 1" in labels
    rows = [t for t in labels if t and t.startswith("rank ")]
    assert rows == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert len(svg.findall(f".//{SVG}line")) == 1  # the line between the two stages
    captures = [r for r in svg.findall(f".//{SVG}rect") if (r.findtext(f"{SVG}title") or "").startswith(
        "perfd capture (iterations 4–5)")]
    assert len(captures) == 2  # the bar above and the outline over the columns


@pytest.mark.slow
def test_cli_offline_with_a_capture_puts_the_budget_and_its_remedies_in_the_html(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`perfd report --html --capture`: the same analysis as `perfd analyze megatron LOG
    --capture TRACE` — the step budget by op and the remedies fitted to the job — in the HTML."""
    k = Path(__file__).resolve().parents[1] / "data" / "captures" / "kineto_h100_megatron"
    out = tmp_path / "r.html"
    args = ["report", "--log", str(k / "ops_megatron.log.gz"), "--gpu", "NVIDIA H100 80GB HBM3", "--html",
            str(out)]
    assert perfd_main([*args, "--capture", str(k / "ops_default_rank0.json.gz")]) == 0
    page = out.read_text()
    assert 'id="budget"' in page and "divided by ops" in page
    assert "3 steps marked in the trace, per step from the 2 complete" in page
    assert "the window cut a step&#x27;s optimizer" in page  # the third step's optimizer phase, cut
    assert "Fused attention: install Transformer Engine, then --transformer-impl transformer_engine" in page
    assert "--attention-dropout 0.0" in page
    # the plan: stages in order of effort, each with its combined gain, the overlaps named
    plan = page[page.index('id="plan"'):page.index('id="charts"')]
    assert plan.index("Options (minutes") < plan.index("Install Transformer Engine")
    assert "moot once R1 is in" in plan and "counted once" in plan
    assert "Transformer Engine or Apex (both missing at start-up)" in plan
    assert perfd_main([*args, "--capture", str(tmp_path / "none.json")]) == 2
    assert "no such capture file" in capsys.readouterr().err
