"""torchtitan's training log: the parser, the collector, the run analysis and the cross-check.

The fixture (tests/data/llama3_debugmodel_1gpu.log) is torchtitan 0.3.0's format line for line —
the f-strings of components/metrics.py (``MetricsProcessor.log``, ``log_validation``), trainer.py,
train.py, distributed/parallel_dims.py and tools/logging.py, ANSI colours on (the default) — with
the numbers torchtitan computes: tps = tokens ÷ the time between log calls, tflops = FLOPs per token
(``get_dense_model_nparams_and_flops``: 6·(N − embedding) + 6·L·heads·2·head_dim·seq, 71,585,280
for llama3 debugmodel at seq 2048) × tps, MFU against 989 TFLOP/s. tests/gpu/torchtitan_live.py
records real ones on an H100: tests/data/h100_0.2.2 (torchtitan 0.2.2, the release that runs on
torch 2.11; same line format) is one, with its ``perfd launch`` line-time sidecar.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.steps.provenance import Code, cite
from perfd.collectors.torchtitan.collector import TorchtitanCollector, model_spec
from perfd.collectors.torchtitan.parser import TorchtitanLogParser
from perfd.core.model import StepRecord
from perfd.report import build_report

DATA = Path(__file__).parent / "data"
LOG = DATA / "llama3_debugmodel_1gpu.log"
REAL = DATA / "h100_0.2.2" / "titan_llama3_debug.log"  # 150 steps, local batch 32, seq 2048
SAMPLE = Path(__file__).parents[1] / "sample.yaml"
H100 = "NVIDIA H100 80GB HBM3"
TOKENS = 8 * 2048


def _parse(spec_cfg: dict[str, Any] | None = None) -> tuple[TorchtitanLogParser, list[StepRecord]]:
    cfg = yaml.safe_load(SAMPLE.read_text()) if spec_cfg is None else spec_cfg
    p = TorchtitanLogParser("llama3", LOG.name, model_spec(cfg))
    recs = [r for line in LOG.read_text().splitlines(keepends=True) for r in p.feed(line)]
    return p, recs


def test_startup_block_and_step_lines() -> None:
    p, recs = _parse()
    info = p.job_info
    assert info.framework == "torchtitan" and info.framework_version == "0.3.0"
    lay = info.layout
    assert (lay.world_size, lay.dp, lay.tp, lay.pp, lay.cp, lay.global_batch_size) == (1, 1, 1, 1, 1, 8)
    assert info.spec.seq_length == 2048 and info.spec.parameter_count == 6_163_712
    assert info.spec.num_layers == 6 and info.spec.dtype == "bf16"  # from the config, not the log
    assert info.arguments["peak_flops"] == "9.890e+14" and info.arguments["flavor"] == "debugmodel"
    assert [r.iteration for r in recs] == list(range(1, 41))
    r = recs[9]
    assert r.rank == "last" and r.interval == 1 and r.lm_loss is not None and r.grad_norm is not None
    assert r.fields["memory_max_reserved_gib"] == "1.42" and float(r.fields["mfu_pct"]) > 0
    assert r.logged_tflops_per_gpu is not None
    assert r.source is not None and r.source.collector == "torchtitan"
    assert p.issues == [] and p.counts["validation_lines"] == 1


def test_step_times_are_the_spans_torchtitan_measures() -> None:
    """Between two step lines (torchtitan's tps is tokens over the same span): tokens ÷ tps."""
    _, recs = _parse()
    for r in recs[1:]:
        tps = float(r.fields["tps"].replace(",", ""))
        assert r.step_time_ms == pytest.approx(TOKENS / tps * 1e3, rel=0.01), r.iteration  # ms stamps
    assert recs[0].step_time_ms is not None and recs[0].step_time_ms > 4000  # from "Training starts"
    # After validation, torchtitan's timer restarts: so does perfd's (step 21 is a normal step).
    typical = statistics.median(r.step_time_ms for r in recs[2:] if r.step_time_ms is not None)
    assert recs[20].step_time_ms == pytest.approx(typical, rel=0.1)


def test_perfd_mfu_agrees_with_torchtitans_within_two_percent() -> None:
    p, recs = _parse()
    a = analyze_run(p.job_info, recs, gpu_name=H100)
    assert a.flops.formula == "torchtitan (no causal halving)"
    steady = a.steady_iterations()
    assert len(steady) > 30
    logged = {r.iteration: float(r.fields["mfu_pct"]) / 100 for r in recs}
    for it in steady:
        assert it.mfu == pytest.approx(logged[it.iteration], rel=0.02), it.iteration
        assert it.tflops_check_ok is True
    assert a.summary.tflops_check_n_disagree == 0 and a.summary.tflops_check_n == len(steady)
    # perfd's count differs from torchtitan's by the norm weights only (6·13·256 FLOPs per token)
    assert a.flops.flops_per_iteration == pytest.approx((71_585_280 - 6 * 13 * 256) * TOKENS)
    line = build_report(a).summary.headline
    assert "None" not in line and "TP=1 PP=1 DP=1" in line, line
    assert a.job.gpu.dtype == "bf16"


def test_without_a_model_spec_the_logged_throughput_stands_in() -> None:
    p, recs = _parse({"dtype": "bf16"})
    a = analyze_run(p.job_info, recs, gpu_name=H100)
    it = a.steady_iterations()[0]
    # The parameter count from the log gives 6·N·tokens; perfd says which count it used.
    assert a.flops.formula == "6*N*tokens" and it.mfu is not None
    assert it.sources["logged_tflops_per_gpu"] == cite(Code.QUOTED, "torchtitan: tflops (per device)")


def test_per_rank_lines_make_per_rank_records() -> None:
    """torchrun --role rank --tee 3 (run_train.sh) prefixes each line with [rankN]:."""
    p = TorchtitanLogParser("j")
    lines = []
    for rank in (0, 1):
        lines.append(f"[rank{rank}]:[titan] 2026-11-23 14:00:00,000 - root - INFO - "
                     "Training starts at step 1")
    for step, (t0, t1) in enumerate(((",100", ",120"), (",200", ",260")), start=1):
        lines.append(f"[rank0]:[titan] 2026-11-23 14:00:00{t0} - root - INFO - step:  {step}  loss:  9.0  "
                     "grad_norm:  1.0  memory:  1.00GiB(1.00%)  tps: 1,000  tflops: 0.10  mfu: 0.01%")
        lines.append(f"[rank1]:[titan] 2026-11-23 14:00:00{t1} - root - INFO - step:  {step}  loss:  9.0  "
                     "grad_norm:  1.0  memory:  1.00GiB(1.00%)  tps: 1,000  tflops: 0.10  mfu: 0.01%")
    recs = [r for line in lines for r in p.feed(line)]
    got = {(r.rank, r.iteration): r.step_time_ms for r in recs}
    assert got == pytest.approx({(0, 1): 100.0, (1, 1): 120.0, (0, 2): 100.0, (1, 2): 140.0}, rel=1e-5)


def test_bad_lines_are_counted_not_fatal() -> None:
    p = TorchtitanLogParser("j")
    assert p.feed("[titan] 2026-11-23 14:00:00,000 - root - INFO - step: many  loss: 1") == []
    assert p.feed("[titan] garbage") == []
    assert p.feed("no titan here") == []
    assert p.feed("[titan] 2026-11-23 14:00:00,000 - root - INFO - step:  3  loss: x  tflops: ?") != []
    assert [i.reason for i in p.issues] == ["step-line-no-step-number"]
    assert p.counts["unrecognised_prefix"] == 1


def test_collector_tails_the_log(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    text = LOG.read_text()
    head, tail = text[: len(text) // 2], text[len(text) // 2:]
    log.write_text(head)
    cfg = {**yaml.safe_load(SAMPLE.read_text()), "path": str(log), "job": "llama3"}
    cfg.pop("line_times")
    c = TorchtitanCollector(cfg)
    assert c.probe().available
    c.start()
    try:
        first = c.collect(0.0)
        with log.open("a") as fh:
            fh.write(tail)
        second = c.collect(0.0)
    finally:
        c.stop()
    assert [r.iteration for r in first.steps + second.steps] == list(range(1, 41))
    assert list(first.job_info) == ["llama3"] and not second.job_info  # sent once, on change
    assert c.errors == {}
    with pytest.raises(ValueError, match="unknown key"):
        TorchtitanCollector({"path": str(log), "model": {"layers": 6}})
    with pytest.raises(ValueError, match="unknown config key"):
        TorchtitanCollector({"path": str(log), "modle": {}})
    with pytest.raises(ValueError, match="dtype"):
        TorchtitanCollector({"path": str(log), "dtype": "int3"})


def test_the_agent_knows_the_collector() -> None:
    from perfd.agent.node_agent import default_registry

    assert "torchtitan" in default_registry().names()


def test_perfd_analyze_torchtitan_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``perfd analyze torchtitan`` as a person runs it (the CLI's main() in this process:
    tests/cli_main.py): its JSON, and a log with no step line refused with exit status 2."""
    import json

    from tests.cli_main import perfd

    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(yaml.safe_load(SAMPLE.read_text())["model"]))
    out = perfd(capsys, "analyze", "torchtitan", LOG, "--model", model, "--dtype", "bf16", "--gpu", H100,
                "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["summary"]["tflops_check_n_disagree"] == 0 and data["summary"]["medians"]["mfu"] > 0
    assert "None" not in data["report"]["summary"]["headline"]
    bad = perfd(capsys, "analyze", "torchtitan", model)
    assert bad.returncode == 2 and "no torchtitan step lines" in bad.stderr


def test_the_gpu_scripts_reading_of_torchtitans_own_figures() -> None:
    """tests/gpu/torchtitan_live.py compares perfd with torchtitan's own per-step MFU: its reading."""
    from tests.gpu.torchtitan_live import titan_steps

    got = titan_steps(LOG)
    assert sorted(got) == list(range(1, 41))
    _, recs = _parse()
    for r in recs:
        assert got[r.iteration]["mfu"] == pytest.approx(float(r.fields["mfu_pct"]) / 100)
        assert got[r.iteration]["tflops"] == r.logged_tflops_per_gpu


def test_real_h100_log_startup_and_steps() -> None:
    """The recorded H100 run (torchtitan 0.2.2): the start-up block, 150 step lines, nothing unread."""
    p = TorchtitanLogParser("titan", REAL.name, model_spec(yaml.safe_load(SAMPLE.read_text())))
    recs = [r for line in REAL.read_text().splitlines(keepends=True) for r in p.feed(line)]
    info = p.job_info
    assert info.framework_version == "0.2.2" and info.spec.parameter_count == 6_163_712
    assert (info.arguments["model"], info.arguments["flavor"]) == ("llama3", "debugmodel")
    assert (info.layout.world_size, info.layout.global_batch_size, info.spec.seq_length) == (1, 32, 2048)
    assert [r.iteration for r in recs] == list(range(1, 151)) and p.issues == []


def test_real_h100_mfu_against_torchtitans_own() -> None:
    """perfd's MFU per steady step against the mfu torchtitan printed on the same line (its own count
    over its own clock), the step time from the launch's µs line times as the agent reads it."""
    from tests.gpu.torchtitan_live import titan_steps

    cfg = {**yaml.safe_load(SAMPLE.read_text()), "path": str(REAL), "line_times": f"{REAL}.times", "job": "t"}
    c = TorchtitanCollector(cfg)
    c.start()
    try:
        batch = c.collect(0.0)
    finally:
        c.stop()
    recs = batch.steps
    a = analyze_run(batch.job_info["t"], recs, gpu_name=H100)
    theirs = titan_steps(REAL)
    steady = a.steady_iterations()
    assert len(steady) >= 130
    mfu = {it.iteration: it.mfu for it in steady if it.mfu is not None}
    assert len(mfu) == len(steady)
    gaps = [abs(m - theirs[i]["mfu"]) / theirs[i]["mfu"] for i, m in mfu.items()]
    assert max(gaps) < 0.03  # µs line times vs torchtitan's perf_counter: 1.9% worst on this run
    med = statistics.median(mfu.values())
    assert med == pytest.approx(statistics.median(theirs[i]["mfu"] for i in mfu), rel=0.02)
    # independent of perfd's formula: tokens ÷ the step time against torchtitan's tps
    tokens = 32 * 2048
    for r in recs[20:]:
        assert r.step_time_ms is not None
        tps = float(r.fields["tps"].replace(",", ""))
        assert tokens / (r.step_time_ms / 1e3) == pytest.approx(tps, rel=0.03), r.iteration
    assert a.summary.tflops_check_n_disagree == 0
