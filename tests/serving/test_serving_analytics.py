"""Serving analytics numbers, checked by hand on the DP=2 fixture log (SGLang 0.5.5 format), and
absent inputs giving absent results with reasons."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from perfd.analytics.serving.serving_analysis import (
    CATALOG_NAMES,
    ServingWindow,
    analyze_serving,
    serving_job_metrics,
    summarize,
)
from perfd.analytics.serving.serving_facts import QueueFacts
from perfd.analytics.serving.serving_findings import ServingFinding
from perfd.analytics.serving.spec import decode_step_rate, resolve
from perfd.analytics.steps.provenance import Cited, Code, cite
from perfd.collectors.sglang import ParsedServingLog, parse_file, parse_lines
from perfd.core.serving_model import ServingModelSpec
from perfd.core.serving_records import ServerInfo, ServingRecord
from perfd.report.provenance_text import text
from perfd.report.serving_report import build_serving_report, serving_json

DATA = Path(__file__).resolve().parents[2] / "perfd" / "collectors" / "sglang" / "tests" / "data"
H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30


def codes(c: Cited) -> set[Code]:
    """Every code a sentence is made of (its nested ones too)."""
    return {c.code}.union(*(codes(a) for a in c.args if isinstance(a, Cited)))


@pytest.fixture(scope="module")
def dp2() -> ParsedServingLog:
    return parse_file(DATA / "sglang_0_5_5_dp2.log")


def slope(points: list[tuple[float, float]]) -> float:
    mt = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((t - mt) * (y - my) for t, y in points) / sum((t - mt) ** 2 for t, _ in points)


def test_throughput_load_and_cache_numbers(dp2: ParsedServingLog) -> None:
    s = summarize(dp2.records, dp2.server)
    v = s.value
    # gen throughput: per DP rank the mean of its logged values, summed over the two ranks
    assert v("gen_throughput") == pytest.approx((640 + 1280 * 3) / 4 + (600 + 1200 + 1200) / 3)
    # input: no 'input throughput' logged -> Σ #new-token after each rank's first line ÷ its span
    assert v("input_throughput") == pytest.approx(4000 / 21 + 4000 / 22)
    assert v("running_requests") == pytest.approx(2 * (8 + 16 * 3) / 4)  # decode lines only
    assert v("queued_requests") == pytest.approx(2 * (0 + 0 + 2 + 4 + 6) / 5)  # the bad value is absent
    t0 = dp2.records[0].time or 0.0
    pts = {dp: [((r.time or 0.0) - t0, float(r.queue_req)) for r in dp2.records
                if r.group() == dp and r.queue_req is not None] for dp in ("DP0", "DP1")}
    assert v("queue_growth") == pytest.approx(slope(pts["DP0"]) + slope(pts["DP1"]))
    assert v("batch_fill") == pytest.approx(28 / 4096)
    assert v("kv_usage") == pytest.approx((2 * 0.02 + 4 * 0.04) / 6)
    assert v("prefix_hit") == pytest.approx((4000 / 16000 + 6000 / 16000) / 2)
    assert v("prefix_hit_batches") == pytest.approx((1 / 2 + 2 / 2) / 2)
    assert v("cuda_graph") == pytest.approx((1.0 + 2 / 3) / 2)
    assert v("spec_accept_length") is None
    assert s.values["spec_accept_length"].reason == cite(Code.SG_NO_ACCEPT_LEN)
    assert s.extras["dp_groups"] == ["DP0", "DP1"] and s.extras["decode_lines"] == 8
    # the source as a code and its numbers: the log's lines of each DP group, summed over the two
    src = s.values["gen_throughput"].source
    assert src is not None and src.code is Code.SG_LOG
    over = src.args[0]
    assert isinstance(over, Cited) and over.code is Code.SG_PER_GROUP_SUM
    assert over.args[0] == cite(Code.SG_GEN_TPUT)
    assert over.args[2] == 2 and isinstance(over.args[1], Cited) and over.args[1].code is Code.SG_LINES
    # worded where shown (a golden check of the sentence)
    assert text(src).startswith("sglang-log:mean of 'gen throughput (token/s)' over 8 line(s), log lines ")
    assert text(src).endswith(", summed over 2 DP groups")


def test_mbu_from_the_logs_own_startup_lines(dp2: ParsedServingLog) -> None:
    """Without any model spec: weights from 'Load weight end ... mem usage', KV bytes per token from
    'KV Cache is allocated', both per GPU; bandwidth from the table."""
    s = summarize(dp2.records, dp2.server, gpu_name=H100)
    w, kvpt, bw = 14.99 * GIB, 48.82 * GIB / 400000, 3.35e12
    per_rank = []
    for dp in ("DP0", "DP1"):
        vals = [(w + (r.kv_tokens or 0) * kvpt) * (r.gen_throughput / (r.running_req or 1)) / bw
                for r in dp2.records
                if r.group() == dp and r.kind == "decode" and r.gen_throughput is not None]
        per_rank.append(statistics.fmean(vals))
    assert s.value("decode_mbu") == pytest.approx(statistics.fmean(per_rank))
    assert 0.3 < s.value("decode_mbu") < 0.5  # type: ignore[operator]
    src = s.values["decode_mbu"].source
    assert src is not None and {Code.SG_MBU, Code.SG_WEIGHTS_LOGGED, Code.SG_KV_LOGGED} <= codes(src)
    assert "H100 SXM 3.35 TB/s" in text(src)  # the bandwidth table's row, quoted
    # MFU needs the parameter count: absent, with the reason
    why = s.values["decode_mfu"].reason
    assert s.value("decode_mfu") is None and why is not None and Code.SG_PARAMS_UNKNOWN in codes(why)


def test_mfu_and_mbu_from_a_model_spec(dp2: ParsedServingLog) -> None:
    spec = ServingModelSpec(params=8.03e9, num_layers=32, num_kv_heads=8, head_dim=128, dtype="bf16")
    s = summarize(dp2.records, dp2.server, spec=spec, gpu_name=H100)
    gen, inp = s.value("gen_throughput"), s.value("input_throughput")
    assert gen is not None and inp is not None
    assert s.value("decode_mfu") == pytest.approx(2 * 8.03e9 * gen / (2 * 989e12))
    assert s.value("prefill_mfu") == pytest.approx(2 * 8.03e9 * inp / (2 * 989e12))
    assert s.extras["gpus_per_dp_group"] == 1  # tp_size=1, pp_size=1 from server_args
    # the config wins over the log: KV = 2 × 32 × 8 × 128 × 2 B = 128 KiB per token
    assert s.extras["kv_bytes_per_token_per_gpu"] == 2 * 32 * 8 * 128 * 2
    assert s.extras["weight_bytes_per_gpu"] == pytest.approx(8.03e9 * 2)


def test_absent_inputs_give_absent_results_with_reasons() -> None:
    recs = parse_lines(["[2025-01-01 00:00:00] Decode batch. #running-req: 4, #token: 100, token usage: "
                        "0.10, "
                        "gen throughput (token/s): 40.00, #queue-req: 0"]).records
    s = summarize(recs)
    mbu = s.values["decode_mbu"]
    assert mbu.value is None and mbu.reason is not None
    assert {Code.SG_WEIGHTS_UNKNOWN, Code.BANDWIDTH_NO_GPU} <= codes(mbu.reason)
    assert s.value("input_throughput") is None and s.value("batch_fill") is None
    assert s.values["batch_fill"].reason == cite(Code.SG_NO_MRR)
    assert s.value("queue_growth") is None and s.value("ttft_p99") is None
    spec = ServingModelSpec(params=1e9, dtype="bf16", kv_bytes_per_token=1e5, tp=1)
    unknown_gpu = summarize(recs, spec=spec, gpu_name="NVIDIA GeForce RTX 4090")
    why = unknown_gpu.values["decode_mbu"].reason
    assert unknown_gpu.value("decode_mbu") is None and why == cite(Code.BANDWIDTH_GPU_UNLISTED,
                                                                   "NVIDIA GeForce RTX 4090")
    ok = summarize(recs, spec=ServingModelSpec(params=1e9, dtype="bf16", kv_bytes_per_token=1e5, tp=1),
                   gpu_name="NVIDIA GeForce RTX 4090", peak_bandwidth=1e12, peak_tflops=100.0)
    assert ok.value("decode_mbu") == pytest.approx((2e9 + 100 * 1e5) * (40 / 4) / 1e12)
    assert ok.value("decode_mfu") == pytest.approx(2e9 * 40 / 100e12)
    assert serving_job_metrics(recs) == summarize(recs).job_metrics()
    assert set(summarize(recs).job_metrics()) <= set(CATALOG_NAMES.values())
    assert all(v is not None for v in s.job_metrics().values())


def test_spec_resolution_rules() -> None:
    server = ServerInfo(args={"tp_size": "4", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"})
    res = resolve(ServingModelSpec(params=70e9, num_layers=80, num_kv_heads=8, head_dim=128), server, 4)
    assert res.weight_bytes_gpu.value == pytest.approx(70e9 / 4)  # fp8 weights: 1 byte
    assert res.kv_bytes_per_token_gpu.value == pytest.approx(2 * 80 * 8 * 128 * 1 / 4)
    rep = resolve(ServingModelSpec(num_layers=2, num_kv_heads=2, head_dim=64, dtype="bf16", tp=8), None, 8)
    # 2 KV heads on 8 GPUs: each head is replicated 4×
    assert rep.kv_bytes_per_token_gpu.value == pytest.approx(2 * 2 * 2 * 64 * 2 * (8 / 2) / 8)
    awq = resolve(ServingModelSpec(params=7e9), ServerInfo(args={"quantization": "awq"}), 1)
    assert awq.weight_bytes_gpu.value is None
    assert awq.weight_bytes_gpu.reason == cite(Code.SG_QUANT_UNKNOWN, "awq")
    half = resolve(ServingModelSpec(num_layers=2, dtype="bf16"), None, 1)
    assert half.kv_bytes_per_token_gpu.value is None
    missing = ("kv heads", "head dim (or hidden and heads)")
    assert half.kv_bytes_per_token_gpu.reason == cite(Code.SG_KV_MISSING, missing)
    with pytest.raises(ValueError, match="unknown model spec key"):
        ServingModelSpec.from_mapping({"param": 1})
    assert ServingModelSpec.from_mapping({"params": "8e9", "tp": "2"}) == ServingModelSpec(params=8e9, tp=2)
    assert decode_step_rate(100.0, 4, 2.5) == pytest.approx(10.0)  # speculative: 2.5 tokens per step
    assert decode_step_rate(100.0, 0, None) is None and decode_step_rate(None, 4, None) is None


def rec(kind: str, t: float | None, **kw: object) -> ServingRecord:
    return ServingRecord(kind=kind, time=t, **kw)  # type: ignore[arg-type]


def test_window_drops_old_records_and_keeps_a_scrape_baseline() -> None:
    w = ServingWindow(window_s=60.0, max_records=5)
    w.add_records([rec("decode", 0.0, queue_req=9, running_req=1),
                   rec("decode", 30.0, queue_req=1, running_req=1)], now=1e9)
    w.add_records([rec("decode", 70.0, queue_req=3, running_req=1)], now=1e9)
    assert [r.time for r in w.records()] == [30.0, 70.0]  # 0 s is older than 70 − 60
    assert w.metrics()["perfd_serving_queued_requests"] == 2.0
    w.add_records([rec("decode", None, queue_req=5)], now=75.0)  # no log time: placed at 'now'
    assert len(w.records()) == 3
    w.add_records([rec("decode", 75.0 + i) for i in range(4)], now=0.0)
    assert len(w.records()) == 5 and w.dropped == 2
    from perfd.core.serving_records import MetricsSnapshot

    for t in (0.0, 30.0, 61.0, 95.0):
        w.add_scrape(MetricsSnapshot(time=t, source="x"))
    prev, cur = w.scrape_pair()
    assert prev is not None and cur is not None and (prev.time, cur.time) == (30.0, 95.0)
    with pytest.raises(ValueError):
        ServingWindow(window_s=0)


def test_analysis_findings_on_the_fixture(dp2: ParsedServingLog) -> None:
    a = analyze_serving("llm", dp2.records, dp2.server, gpu_name=H100)
    ids = [f.id for f in a.findings]
    assert "queue-growing" in ids  # the queue grows ~0.3/s while 28 of 4096 requests run
    assert "kv-low-while-queued" in ids and "cuda-graph-low" in ids and "latency-absent" in ids
    assert {r.finding_id for r in a.recommendations} <= set(ids)
    assert [r.priority for r in a.recommendations] == list(range(1, len(a.recommendations) + 1))
    assert serving_json(a)["server"]["max_running_requests"] == 4096  # type: ignore[index]
    # a kind and its numbers, worded where shown (a golden check of the report's sentences)
    queue = next(f for f in a.findings if isinstance(f, ServingFinding) and f.id == "queue-growing")
    assert isinstance(queue.facts, QueueFacts) and queue.title == "" and not queue.facts.memory
    assert (queue.facts.mrr, round(queue.facts.growth * 60, 1)) == (4096, 37.9)
    rep = build_serving_report(a)
    assert next(f.title for f in rep.findings if f.id == "queue-growing") == \
        "Queue grows 37.9/min while the batch is small"
    assert next(r.action for r in rep.recommendations if r.finding_id == "queue-growing") == (
        "Admit requests faster: a larger --chunked-prefill-size / --max-prefill-tokens, or a lower "
        "--schedule-conservativeness")
    assert (rep.summary.status, rep.summary.status_text) == ("warning",
                                                             "the serving playbook has suggestions")
