"""The streaming parser over whole logs: start-up facts, counts, issues, the 0.2.x clock, streaming."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.collectors.sglang import SglangLogParser, parse_file, parse_lines

DATA = Path(__file__).parent / "data"


def test_dp2_log_records_server_facts_and_issues() -> None:
    log = parse_file(DATA / "sglang_0_5_5_dp2.log")
    assert log.counts["prefill_lines"] == 4 and log.counts["decode_lines"] == 8
    assert [r.group() for r in log.records[:2]] == ["DP0", "DP1"]
    s = log.server
    assert (s.max_total_num_tokens, s.chunked_prefill_size, s.max_prefill_tokens, s.max_running_requests,
            s.context_len) == (400000, 8192, 16384, 4096, 131072)
    assert s.available_gpu_mem_gb == 12.36
    assert s.model_class == "LlamaForCausalLM" and s.torch_dtype == "bfloat16"
    assert s.weight_bytes_per_gpu == pytest.approx(14.99 * 2**30)
    assert s.kv_pool_tokens == 400000 and s.kv_pool_bytes_per_gpu == pytest.approx(48.82 * 2**30)
    assert s.args["model_path"] == "meta-llama/Llama-3.1-8B-Instruct" and s.arg_int("dp_size") == 2
    assert s.arg_str("quantization") is None and s.arg_str("schedule_policy") == "fcfs"
    assert s.arg_str("enable_dp_attention") == "False" and s.arg_int("model_path") is None
    # the bad '#queue-req' value and the truncated last line are issues; their good pairs are kept
    reasons = sorted(i.reason for i in log.issues)
    assert reasons == ["bad-value:#queue-req", "truncated-batch-line"]
    bad = log.records[-2]
    assert bad.queue_req is None and bad.kv_tokens == 17700 and bad.line_no == 20
    last = log.records[-1]
    assert last.cuda_graph is None and last.kv_tokens == 17800
    assert log.counts["other"] == 2 and log.counts["startup_server_args"] == 1
    assert last.source is not None and str(last.source) == "sglang:sglang_0_5_5_dp2.log:21"


def test_0_2_x_clock_is_unwrapped_across_midnight() -> None:
    log = parse_file(DATA / "sglang_0_2_15_midnight.log")
    clocks = [r.clock_time for r in log.records]
    assert clocks == [86398.0, 86399.0, 86401.0, 86403.0]
    assert all(r.time is None for r in log.records)
    assert log.server.max_running_requests == 100 and log.server.chunked_prefill_size is None


def test_streaming_feed_returns_records_as_lines_arrive() -> None:
    p = SglangLogParser("live.log")
    assert p.feed("[2025-01-01 00:00:00] max_total_num_tokens=10, max_prefill_tokens=5, "
                  "max_running_requests=2, context_len=4") == []
    assert p.server_changed and p.server.max_total_num_tokens == 10
    recs = p.feed("[2025-01-01 00:00:01] Decode batch. #running-req: 1, #token: 5, token usage: 0.50, "
                  "gen throughput (token/s): 3.00, #queue-req: 0\n")
    assert len(recs) == 1 and recs[0].token_usage == 0.5 and recs[0].line_no == 2
    assert p.feed("") == [] and p.counts["empty"] == 1


def test_never_raises_and_caps_long_lines() -> None:
    junk = ["\x00\xff garbage", "Decode batch. " + "x" * 100_000, "[" * 10_000 + " Decode batch. #queue-req: "
                                                                                 "1",
            "Prefill batch, , , ,", "Decode batch."]
    log = parse_lines(junk)
    assert log.counts["lines"] == 5 and log.counts["long_lines"] == 1
    assert all(i.reason for i in log.issues)
    assert log.counts["malformed:internal-error"] == 0
    assert [r.queue_req for r in log.records] == [1]


def test_startup_lines_fill_only_once() -> None:
    log = parse_lines([
        "[2025-01-01 00:00:00 DP0] max_total_num_tokens=100, max_running_requests=8, context_len=4",
        "[2025-01-01 00:00:00 DP1] max_total_num_tokens=999, max_running_requests=9, context_len=4",
        "[2025-01-01 00:00:00] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, KV size: 1.00 GB",
        "[2025-01-01 00:00:00] Load weight end. elapsed=3.00 s, type=Qwen3ForCausalLM, avail mem=10.00 GB, "
        "mem usage=8.00 GB.",
    ])
    s = log.server
    assert s.max_total_num_tokens == 100 and s.max_running_requests == 8
    assert s.kv_pool_tokens == 1000 and s.kv_pool_bytes_per_gpu == 2**30  # 0.5.23 single "KV size" form
    assert s.model_class == "Qwen3ForCausalLM" and s.torch_dtype is None  # 0.5.23 prints no dtype there
    assert s.weight_bytes_per_gpu == 8 * 2**30
