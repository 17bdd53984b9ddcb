"""Never stuck: absurd values from a log or from the network are removed with a
counted reason before any analysis sees them; analyses bound their loops; JSON never carries
inf/NaN; rule expressions and rule YAML have depth limits with a clear error.

The issue's probe: ``num_layers`` 10^29 or ``hidden_size`` 1e308 gave OverflowError tracebacks and an
analysis loop that never ended; a 1,000-deep rule expression raised RecursionError. These tests are
timing-free: each checks that the value is refused and counted (a hang would fail by the suite's
timeout, not by a clock here)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.request
from pathlib import Path

import pytest

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.steps.flops import moe_layer_pattern
from perfd.analytics.steps.pipeline import rebalance_estimate
from perfd.analytics.steps.provenance import Code, cite
from perfd.app.cli import main as cli_main
from perfd.collectors.megatron import parse_file, parse_lines
from perfd.core import bounds, finite_json
from perfd.core import limits as L
from perfd.core.jobinfo_json import decode_job_info, job_info_to_json
from perfd.core.model import JobInfo
from perfd.rules.expr import MAX_EXPR_DEPTH, ExprError, compile_expr
from perfd.rules.pack_loader import MAX_YAML_DEPTH, parse_pack

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "megatron"
REAL_LOG = DATA / "tp2_mha_gelu.log"


def _with_arguments(text: str, **values: str) -> list[str]:
    """The real log's lines with some arguments of its arguments block replaced."""
    out = []
    for line in text.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name in values and " ..." in line:
            line = line.split(" ...", 1)[0] + " " + "." * 10 + " " + values[name]
        out.append(line)
    return out


def test_num_layers_ten_to_the_29_in_a_log_is_a_counted_rejection() -> None:
    clean = parse_file(REAL_LOG)
    assert clean.job_info.spec.num_layers is not None
    assert clean.counts.get("malformed:value-out-of-range") is None
    lines = _with_arguments(REAL_LOG.read_text(), num_layers="1" + "0" * 29, hidden_size="1e308")
    bad = parse_lines(lines)
    assert bad.counts["malformed:value-out-of-range"] >= 2
    reasons = [i.text for i in bad.issues if i.reason == bounds.REASON]
    assert any(r.startswith("spec.num_layers") for r in reasons)
    assert any(r.startswith("spec.hidden_size") for r in reasons)
    assert bad.job_info.spec.num_layers is None and bad.job_info.spec.hidden_size is None
    # Everything else of the log is kept: the same iterations, the other model values.
    assert len(bad.records) == len(clean.records) > 0
    assert bad.job_info.spec.seq_length == clean.job_info.spec.seq_length
    # The analysis runs, and the numbers that needed the model size are absent, not invented.
    result = analyze_run(bad.job_info, bad.records)
    assert result.flops.flops_per_iteration is None and "num_layers" in " ".join(result.flops.missing)
    assert len(result.iterations) == len(bad.records)


@pytest.mark.parametrize("field,value", [("num_layers", 0), ("num_layers", -3), ("seq_length", 1 << 40),
                                         ("padded_vocab_size", 10**12), ("num_experts", 10**9)])
def test_each_spec_bound_refuses(field: str, value: int) -> None:
    info = JobInfo()
    setattr(info.spec, field, value)
    info.spec.dtype = "bf16"
    reasons = bounds.check_job_info(info)
    assert len(reasons) == 1 and reasons[0].startswith(f"spec.{field}")
    assert getattr(info.spec, field) is None and info.spec.dtype == "bf16"


def test_values_within_bounds_and_real_logs_pass() -> None:
    for log in sorted(DATA.glob("*.log")):
        parsed = parse_file(log)
        assert "malformed:value-out-of-range" not in parsed.counts, log.name
    info = JobInfo()
    info.layout.tp, info.layout.pp, info.spec.num_layers, info.spec.moe_layer_freq = 8, 16, 126, [1, 0] * 63
    assert bounds.check_job_info(info) == [] and info.spec.moe_layer_freq == [1, 0] * 63


def test_job_info_json_with_absurd_values_is_cleaned_with_reasons() -> None:
    text = json.dumps({"framework": "megatron", "log_interval": -1,
                       "layout": {"tp": 2, "pp": 10**40, "global_batch_size": "64"},
                       "spec": {"num_layers": 10**29, "hidden_size": 1e308, "seq_length": 4096,
                                "moe_layer_freq": [1] * 20_000},
                       "startup_timers": {"load": {"min_ms": 1e300, "max_ms": None}}})
    info, reasons = decode_job_info(text)
    assert info.layout.tp == 2 and info.spec.seq_length == 4096
    assert info.layout.pp is None and info.layout.global_batch_size is None  # a string is no count
    assert info.spec.num_layers is None and info.spec.hidden_size is None and info.spec.moe_layer_freq is None
    assert info.log_interval is None and info.startup_timers == {}
    assert len(reasons) == 7
    # What the decoder keeps encodes again (no inf, no giant ints).
    decode_job_info(job_info_to_json(info))


def test_analytics_loops_are_bounded_by_the_declared_bounds() -> None:
    assert rebalance_estimate(10**29, 2, 10.0, 20.0) is None
    assert rebalance_estimate(8, 2, 10.0, math.inf) is None
    est = rebalance_estimate(8, 2, 10.0, 20.0)
    assert est is not None and est.best_move == 2 and est.new_heavier_ms == 15.0
    assert moe_layer_pattern(1, 10**29) == cite(Code.FLOPS_LAYERS_OUT_OF_BOUNDS, 10**29,
                                                  *bounds.SPEC_BOUNDS["num_layers"])
    assert moe_layer_pattern(2, 4) == [1, 0, 1, 0]


def test_network_job_info_with_absurd_values_is_refused_and_counted() -> None:
    """One batch from a real agent client over real gRPC: the aggregator counts the refusal in
    perfd_aggregator_refused_total{reason="job_info_value"}, keeps the rest, and still answers."""
    from perfd.transport.client import AgentClient

    parsed = parse_file(REAL_LOG)
    info = parsed.job_info
    info.spec.num_layers = 10**29
    text = job_info_to_json(info).replace('"hidden_size":', '"hidden_size":1e308,"x":')

    async def main() -> tuple[dict[str, object], JobInfo | None, str]:
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[]))
        await agg.start()
        try:
            c = AgentClient(f"127.0.0.1:{agg.grpc_port}", "node-a", jobs=["big"])
            c.submit(steps=[r for r in parsed.records], job_info_json={"big": text})
            task = asyncio.create_task(c.run())
            assert await c.flush(60)
            task.cancel()
            assert agg.http is not None
            port = agg.http.port

            def get(path: str) -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
                    return str(r.read().decode())
            summary = json.loads(await asyncio.to_thread(get, "/api/jobs/big/summary"))
            metrics = await asyncio.to_thread(get, "/metrics")
            return summary, agg.state.job_info("big"), metrics
        finally:
            await agg.stop()

    for r in parsed.records:
        r.job = "big"
    summary, held, metrics = asyncio.run(main())
    assert held is not None and held.spec.num_layers is None and held.spec.hidden_size is None
    assert held.spec.seq_length == parsed.job_info.spec.seq_length
    assert f'perfd_aggregator_refused_total{{reason="{L.REFUSED_JOB_INFO_VALUE}"}} 2.0' in metrics
    assert summary  # answered: no overflow, no endless loop


def test_finite_json_drops_inf_and_nan_and_names_them() -> None:
    text = finite_json.dumps({"a": 1.0, "b": [math.inf, {"c": math.nan}], "d": "x"})
    d = json.loads(text)
    assert d["a"] == 1.0 and d["b"] == [None, {"c": None}] and d["d"] == "x"
    assert d[finite_json.NON_FINITE_KEY] == [".b[0]", ".b[1].c"]
    assert json.loads(finite_json.dumps({"ok": 2.5})) == {"ok": 2.5}


def test_analyze_sglang_json_never_carries_inf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A recorded log whose throughputs are 1.7e308 (finite, but their sum overflowed: fsum raised
    OverflowError): refused by the parser with a counted reason, and the JSON parses strictly."""
    src = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"
    lines = [re.sub(r"(gen throughput \(token/s\): )[0-9.]+", r"\g<1>1.7e308", ln)
             for ln in src.read_text().splitlines()]
    n = sum("1.7e308" in ln for ln in lines)
    assert n > 1
    log = tmp_path / "s.log"
    log.write_text("\n".join(lines) + "\n")
    assert cli_main(["analyze", "sglang", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"JSON carries {c}"))
    assert out["parse"]["counts"]["malformed:bad-value:gen throughput (token/s)"] == n


@pytest.mark.parametrize("text", [
    "(" * 1000 + "1" + ")" * 1000 + " > 0",
    "(" * (MAX_EXPR_DEPTH + 1) + "1" + ")" * (MAX_EXPR_DEPTH + 1) + " > 0",
    "not " * (MAX_EXPR_DEPTH + 1) + "1 > 0",
    "-" * (MAX_EXPR_DEPTH + 1) + "1 > 0",
    " + ".join(["1"] * 1000) + " > 0",
])
def test_deep_or_long_rule_expression_is_a_clear_error(text: str) -> None:
    with pytest.raises(ExprError, match=r"nested deeper|too long"):
        compile_expr(text)


def test_rule_expression_within_the_depth_limit_compiles() -> None:
    depth = MAX_EXPR_DEPTH - 2
    assert compile_expr("(" * depth + "1" + ")" * depth + " > 0")


@pytest.mark.parametrize("text", ["rules: " + "[" * 5000, "rules:\n  - " + "{a: " * (MAX_YAML_DEPTH + 1)])
def test_deep_rule_yaml_is_a_clear_error(text: str) -> None:
    pack, errors = parse_pack(text)
    assert pack is None and len(errors) == 1
    assert f"nested deeper than {MAX_YAML_DEPTH} levels" in errors[0].message


def test_series_label_caps_count_bytes_of_utf8_not_characters() -> None:
    """label_cap: more than MAX_LABELS_PER_SERIES labels, a key over MAX_LABEL_VALUE_BYTES
    characters or a value over as many bytes of UTF-8 is refused and counted; at the cap it is
    admitted (the fast path that skips encoding short values must not change the answer)."""
    from perfd.aggregator.guard import Guard
    from perfd.core.model import label_set
    from perfd.core.refusals import Refusals

    m = L.MAX_LABEL_VALUE_BYTES
    refusals = Refusals()
    g = Guard(L.Limits(), refusals)
    cases = [
        ({}, True),
        ({"gpu": "0", "node": "n1"}, True),
        ({"k": "a" * m}, True),
        ({"k": "a" * (m + 1)}, False),
        ({"k": "\U0001F600" * (m // 4)}, True),  # 4 bytes each: exactly at the cap
        ({"k": "\U0001F600" * (m // 4) + "a"}, False),
        ({"k": "é" * (m // 2 + 1)}, False),  # 2 bytes each: fewer characters than the cap, too many bytes
        ({"k" * (m + 1): "v"}, False),
        ({f"l{i}": "v" for i in range(L.MAX_LABELS_PER_SERIES)}, True),
        ({f"l{i}": "v" for i in range(L.MAX_LABELS_PER_SERIES + 1)}, False),
    ]
    got = [g.admit_series("a1", "perfd_gpu_x", label_set(labels)) for labels, _ in cases]
    assert got == [ok for _, ok in cases]
    assert refusals.snapshot().get(L.REFUSED_LABELS) == sum(1 for _, ok in cases if not ok)
