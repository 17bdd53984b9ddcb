"""Absurd `--dtype` / `--peak-tflops`, as a person types them: refused with one line and exit status 2
by every command that takes them, never an "MFU unknown" with status 0 or an MFU above 100% graded
"excellent". And the report names the collectives its timers do not see (TP, CP, EP)
instead of calling communication small. Real logs: tests/data/megatron and the shared fixture. The
commands by the CLI's own entry point, in the test's process (tests/cli_main.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.analytics.breakdown.advice_registry import Grade
from perfd.analytics.run.run_grade import grade_mfu
from perfd.app.commands.analyze import analyze_megatron_file
from perfd.report import build_report, render_text
from perfd.report.bottleneck_text import class_reason
from tests.cli_main import Ran
from tests.cli_main import perfd as run_perfd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "megatron"
BF16_PP2 = DATA / "pp2_vpp2_interleaved.log"  # --bf16, TP=1: every collective its timers see
TP2 = DATA / "tp2_swiglu_gqa_untied.log"  # TP=2 DP=1: only the (DP=1) gradient sync is timed
EP2 = DATA / "dp2_ep2_moe_top2.log"
H200 = "NVIDIA H200"


@pytest.fixture
def perfd(capsys: pytest.CaptureFixture[str]):
    def run(*args: str | Path) -> Ran:
        return run_perfd(capsys, *args)
    return run


def refused(r: Ran, prefix: str = "perfd") -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-400:], r.stderr[-400:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), r.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--peak-tflops", "0"], ["--peak-tflops", "-5"], ["--peak-tflops", "nan"],
                                   ["--peak-tflops", "inf"], ["--dtype", "int4"]],
                         ids=["peak-0", "peak-neg", "peak-nan", "peak-inf", "dtype-int4"])
@pytest.mark.parametrize("command", ["analyze", "report"])
def test_a_peak_or_dtype_that_cannot_be_is_refused_before_reading(tmp_path: Path, flags: list[str],
                                                                  command: str, perfd) -> None:
    if command == "analyze":
        line = refused(perfd("analyze", "megatron", BF16_PP2, "--gpu", H200, *flags))
    else:
        html = tmp_path / "r.html"
        r = perfd("report", "--html", html, "--log", BF16_PP2, "--gpu", H200, *flags)
        line = refused(r, "perfd report:")
        assert not html.exists()
    if flags[0] == "--dtype":
        assert "'int4'" in line and "bf16" in line and "give --dtype" not in line
    else:
        assert "--peak-tflops must be a positive number" in line


@pytest.mark.slow
def test_the_other_commands_refuse_them_too(tmp_path: Path, perfd) -> None:
    sglang = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"
    assert "--peak-tflops" in refused(perfd("analyze", "sglang", sglang, "--peak-tflops", "-1"))
    assert "'int4'" in refused(perfd("analyze", "sglang", sglang, "--dtype", "int4"))
    assert "--peak-bandwidth-tbs" in refused(perfd("analyze", "sglang", sglang, "--peak-bandwidth-tbs", "0"))
    titan = tmp_path / "t.log"
    titan.write_text("step: 1 loss: 2.0\n")
    assert "'int4'" in refused(perfd("analyze", "torchtitan", titan, "--dtype", "int4"))
    agg = perfd("aggregator", "--peak-tflops", "0", "--grpc-port", "0", "--http-port", "0")
    assert "--peak-tflops must be a positive number" in refused(agg, "perfd aggregator:")


@pytest.mark.slow
@pytest.mark.parametrize("log", [DATA / "dp2_all_timers.log",
                                 ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"],
                         ids=["dp2", "demo"])
def test_a_dtype_the_job_beats_is_refused_naming_the_logs_own(tmp_path: Path, log: Path, perfd) -> None:
    """fp32 on a bf16 log: the peak (67 TFLOP/s on an H200) is below what the job achieved (72.8
    and 80.9 TFLOP/s per GPU; the issue saw "MFU 132% excellent")."""
    line = refused(perfd("analyze", "megatron", log, "--gpu", H200, "--dtype", "fp32"))
    assert "--dtype fp32" in line and "the log trains in bf16" in line and "MFU" in line
    line = refused(perfd("analyze", "megatron", log, "--gpu", H200, "--peak-tflops", "5"))
    assert "--peak-tflops 5 is below" in line
    ok = perfd("analyze", "megatron", log, "--gpu", H200, "--dtype", "bfloat16")
    assert ok.returncode == 0, ok.stderr


def test_an_mfu_above_100_percent_is_never_graded() -> None:
    """Live, where no person gave the peak (a wrong --gpu on the aggregator, a wrong table row): the
    report says the peak is wrong and grades nothing."""
    assert grade_mfu(1.32) is Grade.IMPOSSIBLE and grade_mfu(0.55) is Grade.EXCELLENT
    _, analysis = analyze_megatron_file(str(BF16_PP2), gpu=H200, peak_tflops=5.0)
    assert analysis is not None and (analysis.summary.median("mfu") or 0) > 1
    rep = build_report(analysis)
    assert rep.summary.status == Grade.IMPOSSIBLE
    text = render_text(rep)
    assert "excellent" not in text and "the peak is wrong" in text
    grade = next(f for f in rep.findings if f.id == "mfu-grade")
    assert "impossible" in grade.observation and grade.evidence["grade"] == Grade.IMPOSSIBLE


def test_tp2_report_names_the_untimed_all_reduces_not_small_communication() -> None:
    _, analysis = analyze_megatron_file(str(TP2), gpu=H200)
    assert analysis is not None
    rep = build_report(analysis)
    # Before: "not data loading (2.5%) nor exposed communication (0.1%) here".
    assert "nor exposed communication" not in rep.summary.status_text
    assert "TP=2 tensor-parallel all-reduces, inside compute, are not timed" in rep.summary.status_text
    assert "of the timed collectives" in class_reason(analysis.summary.bottleneck)
    (f,) = [f for f in rep.findings if f.id == "comm-untimed"]
    assert f.evidence["untimed"] == ["TP"]
    _, ep = analyze_megatron_file(str(EP2), gpu=H200)
    assert ep is not None
    assert next(f for f in build_report(ep).findings if f.id == "comm-untimed").evidence["untimed"] == ["EP"]
    # A TP=1 PP=2 job's timers see its gradient sync and its p2p: nothing to add.
    _, pp2 = analyze_megatron_file(str(BF16_PP2), gpu=H200)
    assert pp2 is not None and not [f for f in build_report(pp2).findings if f.id == "comm-untimed"]


def test_the_python_api_refuses_them_with_the_same_line() -> None:
    import perfd.app.api as pa

    for kw, said in (({"dtype": "int4"}, "'int4'"),
                     ({"peak_tflops": 0.0}, "--peak-tflops must be a positive"),
                     ({"dtype": "fp32"}, "the log trains in bf16")):
        with pytest.raises(pa.PerfdInputError, match=said):
            pa.analyze_megatron_log(DATA / "dp2_all_timers.log", gpu=H200, **kw)
