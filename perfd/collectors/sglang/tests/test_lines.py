"""One test per SGLang scheduler log format, each with lines written exactly as that release prints
them. Sources (read in the released wheels from PyPI, `pip download sglang==X --no-deps`):

- 0.2.5: srt/managers/controller/tp_worker.py (`[gpu_id=N] Prefill batch. ...`, logging "%(message)s")
- 0.2.7: srt/managers/tp_worker.py (`[gpu=N] Decode batch. ...`)
- 0.2.15: srt/managers/tp_worker.py + srt/utils.py configure_logger (datefmt "%H:%M:%S", prefix " TP0",
  controller_single.py " DP{i} TP0"); `Prefill batch(mixed #running-req: N). ...`
- 0.3.6: srt/managers/scheduler.py (prefix " DP{dp_rank} TP{tp_rank}", dp_rank -1 when DP_RANK unset;
  prefill with both `cache hit rate` and `token usage`)
- 0.4.3: srt/managers/scheduler.py (speculative `accept len`)
- 0.4.6: srt/managers/scheduler.py (no `cache hit rate`; PD prefill `#unbootstrapped-req`, trailing space)
- 0.4.9: srt/managers/scheduler.py + srt/mem_cache/allocator.py log_usage (`#token` on prefill lines,
  hybrid SWA `#token: full=N, swa=M, token usage: full=x, swa=y`, `cuda graph`, PD `input throughput`)
- 0.5.2: srt/managers/scheduler_metrics_mixin.py (trailing ", ", `full/swa token usage`, `cpu graph`)
- 0.5.5: scheduler_metrics_mixin.py (`Prefill batch,` / `Decode batch [N],`, mamba usage, accept rate)
- 0.5.10: srt/observability/scheduler_metrics_mixin.py + utils/common.py (`.%(msecs)03d` with
  SGLANG_LOG_MS; `cuda graph` and `input throughput` on prefill; `est. ... TFLOPS/s (per GPU)`)
- 0.5.23: srt/managers/scheduler_components/metrics_reporter.py (`#pending-token`, `fwd occupancy`,
  prefix tags DP/PP/ATTN_CP/MOE_DP/TP/EP)
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from perfd.collectors.sglang.lines import BatchParse, parse_batch_line, split_prefix


def ok(line: str) -> BatchParse:
    res = parse_batch_line(line, 7)
    assert isinstance(res, BatchParse), res
    assert res.issues == [], res.issues
    assert not res.truncated
    return res


def utc(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float:
    return datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()


# --- 0.2.x ------------------------------------------------------------------------------------

def test_0_2_5_gpu_id_prefix_prefill_with_cache_hit_rate() -> None:
    r = ok("[gpu_id=0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 1, cache hit rate: 12.50%, "
           "#running-req: 0, #queue-req: 0").record
    assert (r.kind, r.gpu, r.prefix_format, r.time, r.clock_time) == ("prefill", 0, "none", None, None)
    assert (r.new_seq, r.new_tokens, r.cached_tokens, r.running_req, r.queue_req) == (1, 7, 1, 0, 0)
    assert r.cache_hit_rate == pytest.approx(0.125)
    assert r.token_usage is None and r.gen_throughput is None and r.cuda_graph is None  # absent, not 0
    assert r.line_no == 7 and r.fields["cache hit rate"] == "12.50%"


def test_0_2_7_gpu_prefix_decode() -> None:
    r = ok("[gpu=1] Decode batch. #running-req: 1, #token: 41, token usage: 0.00, "
           "gen throughput (token/s): 85.37, #queue-req: 0").record
    assert (r.kind, r.gpu, r.running_req, r.kv_tokens, r.token_usage, r.gen_throughput, r.queue_req) == (
        "decode", 1, 1, 41, 0.0, 85.37, 0)
    assert r.new_tokens is None and r.cached_tokens is None and r.accept_len is None


def test_0_2_15_clock_prefix_and_dp_tag() -> None:
    r = ok("[14:03:27 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 1, cache hit rate: "
           "14.29%, "
           "#running-req: 0, #queue-req: 0").record
    assert r.prefix_format == "hms" and r.time is None and r.clock_time == 14 * 3600 + 3 * 60 + 27
    assert r.ranks == {"TP": 0} and r.time_text == "[14:03:27 TP0]"
    d = ok("[14:03:29 DP1 TP0] Decode batch. #running-req: 3, #token: 8299, token usage: 0.03, "
           "gen throughput (token/s): 112.01, #queue-req: 3").record
    assert d.ranks == {"DP": 1, "TP": 0} and d.group() == "DP1"


def test_0_2_15_mixed_chunk_prefill_head() -> None:
    r = ok("[14:03:27 TP0] Prefill batch(mixed #running-req: 2). #new-seq: 1, #new-token: 8192, "
           "#cached-token: 0, cache hit rate: 0.13%, #queue-req: 3").record
    assert r.mixed_running_req == 2 and r.running_req is None  # the line has no '#running-req' pair
    assert r.new_tokens == 8192 and r.queue_req == 3


# --- 0.3.x / 0.4.x ----------------------------------------------------------------------------

def test_0_3_6_dp_minus_one_prefix_and_both_usage_fields() -> None:
    r = ok("[2024-11-20 10:00:00 DP-1 TP0] Prefill batch. #new-seq: 1, #new-token: 630, #cached-token: 29, "
           "cache hit rate: 4.40%, token usage: 0.00, #running-req: 0, #queue-req: 0").record
    assert r.time == utc(2024, 11, 20, 10, 0, 0) and r.prefix_format == "ymd"
    assert r.ranks == {"DP": -1, "TP": 0}
    assert r.cache_hit_rate == pytest.approx(0.044) and r.token_usage == 0.0


def test_0_4_3_speculative_accept_len_without_trailing_comma() -> None:
    r = ok("[2025-02-14 09:30:01 TP0] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, "
           "accept len: 2.72, gen throughput (token/s): 120.44, #queue-req: 0").record
    assert r.accept_len == 2.72 and r.accept_rate is None and r.gen_throughput == 120.44


def test_0_4_6_pd_prefill_extra_keys_kept_raw() -> None:
    res = ok("[2025-05-01 08:00:00] Prefill batch. #new-seq: 1, #new-token: 16, #cached-token: 0, "
             "token usage: 0.00, #running-req: 0, #unbootstrapped-req: 0, #queue-req: 0, #transferring-req: "
             "1 ")
    r = res.record
    assert r.cache_hit_rate is None and r.queue_req == 0 and r.fields["#transferring-req"] == "1"
    assert res.unknown_keys == 2 and r.ranks == {}


def test_0_4_9_prefill_with_kv_tokens_and_cuda_graph_decode() -> None:
    p = ok("[2025-07-10 09:00:00] Prefill batch. #new-seq: 1, #new-token: 32, #cached-token: 0, #token: 33, "
           "token usage: 0.00, #running-req: 0, #queue-req: 0").record
    assert p.kv_tokens == 33 and p.kind == "prefill"
    d = ok("[2025-07-10 09:00:01 TP1] Decode batch. #running-req: 1, #token: 65, token usage: 0.00, "
           "cuda graph: True, gen throughput (token/s): 57.88, #queue-req: 0").record
    assert d.cuda_graph is True and d.graph_backend == "cuda graph" and d.ranks == {"TP": 1}


def test_0_4_9_hybrid_swa_usage_subvalues() -> None:
    d = ok("[2025-07-10 09:00:01] Decode batch. #running-req: 2, #token: full=1200, swa=400, "
           "token usage: full=0.12, swa=0.10, cuda graph: False, gen throughput (token/s): 90.00, "
           "#queue-req: 0").record
    assert (d.full_kv_tokens, d.swa_kv_tokens) == (1200, 400)
    assert (d.full_token_usage, d.swa_token_usage) == (0.12, 0.10)
    assert d.kv_tokens is None and d.token_usage is None  # never mixed up with the plain pool
    assert d.kv_usage() == 0.12 and d.kv_tokens_in_use() == 1200 and d.cuda_graph is False


def test_0_4_9_pd_prefill_input_throughput() -> None:
    r = ok("[2025-07-10 09:00:00] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, #token: "
           "513, "
           "token usage: 0.01, #unbootstrapped-req: 0, #queue-req: 0, #transferring-req: 1, "
           "input throughput (token/s): 3012.55 ").record
    assert r.input_throughput == 3012.55 and r.running_req is None


# --- 0.5.x ------------------------------------------------------------------------------------

def test_0_5_2_trailing_comma_and_hybrid_decode() -> None:
    p = ok("[2025-09-01 12:00:00] Prefill batch. #new-seq: 1, #new-token: 16, #cached-token: 0, "
           "full token usage: 0.01, swa token usage: 0.02, #running-req: 0, #queue-req: 0, ").record
    assert (p.full_token_usage, p.swa_token_usage, p.token_usage) == (0.01, 0.02, None)
    d = ok("[2025-09-01 12:00:01] Decode batch. #running-req: 1, #full token: 48, full token usage: 0.00, "
           "#swa token: 40, swa token usage: 0.00, cpu graph: False, gen throughput (token/s): 60.11, "
           "#queue-req: 0, ").record
    assert d.full_kv_tokens == 48 and d.swa_kv_tokens == 40 and d.graph_backend == "cpu graph"


def test_0_5_5_comma_head_iteration_tag_mamba_and_accept_rate() -> None:
    p = ok("[2025-11-05 07:00:00] Prefill batch [12], #new-seq: 2, #new-token: 40, #cached-token: 8, "
           "full token usage: 0.01, mamba usage: 0.05, #running-req: 1, #queue-req: 0, ").record
    assert p.forward_iter == 12 and p.mamba_usage == 0.05 and p.kv_usage() == 0.05
    res = ok("[2025-11-05 07:00:01] Decode batch [40], #running-req: 3, #full token: 120, "
             "full token usage: 0.00, mamba num: 3, mamba usage: 0.05, accept len: 3.10, accept rate: 0.70, "
             "cuda graph: True, gen throughput (token/s): 60.11, #queue-req: 0, ")
    d = res.record
    assert d.forward_iter == 40 and d.accept_len == 3.10 and d.accept_rate == 0.70
    assert d.fields["mamba num"] == "3" and res.unknown_keys == 1


def test_0_5_10_milliseconds_graph_and_estimates() -> None:
    p = ok("[2026-01-10 08:00:00.123] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, "
           "token usage: 0.01, #running-req: 0, #queue-req: 0, cuda graph: False, "
           "input throughput (token/s): 1234.56, est. prefill TFLOPS/s (per GPU): 12.34").record
    assert p.time == pytest.approx(utc(2026, 1, 10, 8, 0, 0) + 0.123) and p.prefix_format == "ymd-ms"
    assert p.cuda_graph is False and p.input_throughput == 1234.56 and p.est_tflops_per_gpu == 12.34
    d = ok("[2026-01-10 08:00:01.500 TP0] Decode batch, #running-req: 4, #token: 2000, token usage: 0.02, "
           "cuda graph: True, gen throughput (token/s): 160.00, #queue-req: 0, est. decode TFLOPS/s (per "
           "GPU): "
           "2.10, est. read BW (GB/s per GPU): 456.78, est. write BW (GB/s per GPU): 1.23").record
    assert d.est_tflops_per_gpu == 2.10 and d.est_read_gbs_per_gpu == 456.78


def test_0_5_23_pending_tokens_occupancy_and_all_rank_tags() -> None:
    p = ok("[2026-03-02 10:11:12 DP1 PP0 ATTN_CP1 MOE_DP0 TP3 EP3] Prefill batch, #new-seq: 1, "
           "#new-token: 8192, #cached-token: 0, token usage: 0.05, #running-req: 2, #queue-req: 1, "
           "#pending-token: 5810, cuda graph: False, input throughput (token/s): 30211.07, "
           "fwd occupancy: 87.50%, fwd+idle occupancy: 90.00%").record
    assert p.ranks == {"DP": 1, "PP": 0, "ATTN_CP": 1, "MOE_DP": 0, "TP": 3, "EP": 3}
    assert p.pending_tokens == 5810 and p.fields["fwd occupancy"] == "87.50%" and p.group() == "DP1"


def test_foreign_prefix_structured_logger_and_container_prefix() -> None:
    # a structured logger around SGLang's message (seen in public logs of 0.5.x deployments)
    r = ok("2026-07-08T22:28:50.274739Z  INFO scheduler_metrics_mixin.report_prefill_stats: Prefill batch, "
           "#new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: "
           "0, "
           "#pending-token: 0, cuda graph: True, input throughput (token/s): 0.23").record
    assert r.prefix_format == "foreign" and r.time == pytest.approx(utc(2026, 7, 8, 22, 28, 50) + 0.274739)
    c = ok("sglang-1  | [2025-06-01 12:00:00 TP0] Decode batch. #running-req: 1, #token: 5, token usage: "
           "0.00, "
           "gen throughput (token/s): 1.00, #queue-req: 0").record
    assert c.prefix_format == "ymd" and c.ranks == {"TP": 0}


# --- guards: never mis-parsed, never silently zero ----------------------------------------------

def test_keys_of_the_other_kind_are_kept_raw_and_reported() -> None:
    res = parse_batch_line("[2025-01-01 00:00:00] Decode batch. #running-req: 1, #new-token: 5, "
                           "gen throughput (token/s): 1.00", 1)
    assert isinstance(res, BatchParse)
    assert res.record.new_tokens is None and res.record.fields["#new-token"] == "5"
    assert res.issues == ["key-of-other-kind:#new-token"]


def test_bad_values_are_absent_with_a_reason() -> None:
    res = parse_batch_line("[2025-01-01 00:00:00] Decode batch. #running-req: 1.5, token usage: high, "
                           "cuda graph: maybe, gen throughput (token/s): nan, #queue-req: 2", 1)
    assert isinstance(res, BatchParse)
    r = res.record
    assert r.running_req is None and r.token_usage is None
    assert r.cuda_graph is None and r.gen_throughput is None
    assert r.queue_req == 2
    assert sorted(res.issues) == ["bad-value:#running-req", "bad-value:cuda graph", "bad-value:gen "
                                                                                    "throughput "
                                  "(token/s)", "bad-value:token usage"]


def test_cache_hit_rate_needs_its_percent_sign() -> None:
    res = parse_batch_line("Prefill batch. #new-seq: 1, cache hit rate: 0.5, #queue-req: 0", 1)
    assert isinstance(res, BatchParse) and res.record.cache_hit_rate is None
    assert res.issues == ["bad-value:cache hit rate"]


def test_truncated_line_keeps_complete_pairs() -> None:
    res = parse_batch_line("[2025-01-01 00:00:00] Decode batch. #running-req: 3, #token: 40, gen throu", 1)
    assert isinstance(res, BatchParse) and res.truncated
    assert res.record.running_req == 3 and res.record.gen_throughput is None
    res2 = parse_batch_line("[2025-01-01 00:00:00] Decode batch. #running-req: 3, #queue-req:", 1)
    assert isinstance(res2, BatchParse) and res2.truncated and res2.record.queue_req is None


@pytest.mark.parametrize("line", [
    "Decode batch stats are printed every 40 steps",  # prose: no '.'/',' right after 'batch'
    "[2025-01-01 00:00:00] Prefill batch size too large, reduce --max-prefill-tokens",
    "[2025-01-01 00:00:00] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=1.00 GB",
    "NoDecode batch. #running-req: 1",  # not at a word boundary
    "[2025-01-01 00:00:00] Decode batches. #running-req: 1",
    # other frameworks' throughput lines: Megatron-LM's iteration line, vLLM's metrics line
    " [2026-11-21 20:58:42.618274] iteration        1/      40 | consumed samples:           64 | "
    "global batch size:    64 | lm loss: 1.057704E+01 |",
    "INFO 01-01 00:00:00 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
    "4.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.1%",
])
def test_other_lines_are_not_batch_lines(line: str) -> None:
    assert parse_batch_line(line, 1) is None


def test_batch_head_without_pairs_is_an_issue() -> None:
    assert parse_batch_line("[2025-01-01 00:00:00] Decode batch. ", 1) == "batch-line-without-fields"
    assert parse_batch_line("[2025-01-01 00:00:00] Decode batch. hello: 1, world: 2", 1) == \
        "batch-line-without-known-fields"


def test_prefix_helpers() -> None:
    p, msg = split_prefix("[2025-06-01 12:00:00.5 DP0 TP1] [gpu=3] hello")
    assert p.fmt == "ymd-ms" and p.ranks == {"DP": 0, "TP": 1} and p.gpu == 3 and msg == "hello"
    assert p.time == pytest.approx(utc(2025, 6, 1, 12, 0, 0) + 0.5)
    p2, msg2 = split_prefix("[2025-13-45 12:00:00] bad date")
    assert p2.time is None and msg2 == "bad date"
    p3, _ = split_prefix("no prefix at all")
    assert p3.text is None and p3.fmt == "none"
