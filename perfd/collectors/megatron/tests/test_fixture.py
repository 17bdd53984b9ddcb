"""The real Megatron-LM log (perfd/app/demo/data, core 0.20.0, 2x H200, TP=1 PP=2 DP=1), its trimmed
copy in tests/data, the hand-written logs of other eras and options, and streaming == whole-file."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from perfd.collectors.megatron import LogTail, MegatronLogParser, parse_file
from perfd.core.model import StepRecord

DATA = Path(__file__).resolve().parent / "data"
_REPO = Path(__file__).resolve().parents[4]
# The real 2×H200 log as the demo ships it (perfd/app/demo/data): in every checkout, so these tests
# never skip for want of a file outside the repository.
FIXTURE = _REPO / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
TRIMMED = DATA / "h200x2_tp1_pp2_trimmed.log"
STEP_TIMERS = {
    "forward-backward", "embedding-grads-all-reduce", "all-grads-sync", "optimizer-copy-to-main-grad",
    "optimizer-inner-step", "optimizer-copy-main-to-model-params", "optimizer", "batch-generator",
    "forward-compute", "backward-compute", "forward-recv", "forward-send", "backward-recv",
    "backward-send", "forward-send-backward-recv", "backward-send-forward-recv",
}

needs_fixture = pytest.mark.skipif(not FIXTURE.exists(), reason=f"fixture missing: {FIXTURE}")


@needs_fixture
def test_full_fixture_records() -> None:
    log = parse_file(FIXTURE, job="fixture")
    assert [r.iteration for r in log.records] == list(range(1, 41))
    assert log.issues == []
    assert log.counts["lines"] == 1828 and log.counts["iteration_lines"] == 40
    assert log.counts["straggler_lines"] == 40 and log.counts["intrusions"] == 1
    for r in log.records:
        assert r.job == "fixture" and r.train_iters == 40 and r.global_batch_size == 64
        assert set(r.timers) == STEP_TIMERS, r.iteration
        assert all(t.min_ms is not None and t.max_ms is not None and t.min_ms <= t.max_ms
                   for t in r.timers.values())
        assert r.straggler is not None and len(r.straggler.quantities) == 7
        lo, hi = r.straggler.quantities["power"]
        assert 50 <= lo.value <= hi.value <= 1000 and lo.unit == "W"  # watts, not milliwatts
        assert r.consumed_samples == 64 * r.iteration
        assert r.lm_loss is not None and r.grad_norm is not None and r.nan_iterations == 0
        assert len(r.fields) == 10
    r38 = log.records[37]
    assert (r38.iteration, r38.step_time_ms, r38.logged_tflops_per_gpu) == (38, 331.1, 84.2)
    assert r38.timers["forward-backward"].min_ms == 322.66
    assert r38.straggler is not None and r38.straggler.quantities["tflops"][1].value == 85.32
    # Provenance names the iteration line of the file (line 1769 is iteration 38's).
    assert r38.source is not None and r38.source.detail == f"{FIXTURE.name}:1769"
    lines = FIXTURE.read_text().split("\n")
    assert "iteration       38/      40" in lines[1769 - 1]
    ends = [r.end_time for r in log.records]
    assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(ends))


@needs_fixture
def test_full_fixture_job_info() -> None:
    info = parse_file(FIXTURE).job_info
    assert (info.framework_version, info.torch_version) == ("0.20.0", "2.11.0+cu130")
    lay = info.layout
    assert (lay.world_size, lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.vpp) == (2, 1, 2, 1, 1, 1, None)
    assert (lay.micro_batch_size, lay.global_batch_size, lay.num_microbatches) == (4, 64, 16)
    spec = info.spec
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (8, 1024, 4096)
    assert spec.num_attention_heads == 16
    assert (spec.kv_channels, spec.num_query_groups, spec.seq_length) == (64, None, 1024)
    assert (spec.padded_vocab_size, spec.vocab_size, spec.dtype) == (32000, 32000, "bf16")
    assert (spec.swiglu, spec.untie_embeddings, spec.num_experts) == (False, False, None)
    assert (info.timing_log_option, info.log_interval) == ("minmax", 1)
    assert len(info.arguments) > 800
    assert info.arguments["ddp_param_name_patterns_for_fp32_local_accumulation"] == "[]"
    assert info.arguments["config_logger_dir"] == ""
    assert info.arguments["padded_vocab_size"] == "None"  # raw text kept; the spec has 32000
    assert info.startup_timers["startup-library-setup"].max_ms == 13435.15
    assert info.startup_timers["model-and-optimizer-setup"].min_ms == 306.48
    assert set(info.startup_timers).isdisjoint(STEP_TIMERS)


@needs_fixture
def test_full_fixture_first_iterations() -> None:
    log = parse_file(FIXTURE)
    r1, r2, r3 = log.records[:3]
    # The intrusion on iteration 1's line is dropped; the memory report of both ranks attaches.
    assert set(r1.memory_mb) == {0, 1} and r1.memory_mb[0]["max allocated"] == 4781.19
    assert set(r2.memory_mb) == {0, 1} and r3.memory_mb == {}
    # Megatron does not reset after the first iteration's log: record 2 averages iterations 1-2.
    assert [r.interval for r in log.records[:4]] == [1, 2, 1, 1]
    # Its timers were printed as the sum of both iterations (forward-backward 5955.99 ms, more
    # than the 3180.3 ms step time); the parser makes them per-iteration means again.
    assert r2.step_time_ms == 3180.3
    assert r2.timers["forward-backward"].min_ms == pytest.approx(5955.99 / 2)
    assert r2.timers["forward-backward"].max_ms == pytest.approx(5957.15 / 2)
    assert r1.timers["forward-backward"].max_ms == 5578.36 and r3.timers["forward-backward"].max_ms == 352.07
    assert log.counts["records_timers_rescaled"] == 1


def test_trimmed_copy_matches_the_start_of_the_full_fixture() -> None:
    trimmed = parse_file(TRIMMED)
    assert [r.iteration for r in trimmed.records] == [1, 2, 3, 4, 5]
    assert trimmed.issues == []
    assert trimmed.job_info.layout.num_microbatches == 16
    assert trimmed.job_info.spec.padded_vocab_size == 32000
    if FIXTURE.exists():
        full = parse_file(FIXTURE).records[:5]
        for a, b in zip(trimmed.records, full, strict=True):
            # Line numbers differ: lines were cut from the copy.
            a.source = b.source = None
            assert a.straggler is not None and b.straggler is not None
            a.straggler.line_no = b.straggler.line_no = 0
            assert a == b


def test_dp2_all_timers_log() -> None:
    log = parse_file(DATA / "dp2_all_timers.log")
    info = log.job_info
    assert (info.layout.dp, info.layout.num_microbatches, info.timing_log_option) == (2, 8, "all")
    r1, r2 = log.records
    assert r1.timers["batch-generator"].per_rank == {0: 10.5, 1: 45.25}
    assert r1.timers["batch-generator"].spread() == pytest.approx(45.25 / 10.5)
    assert r1.straggler is not None and r1.straggler.quantities["data_rtt"][1].rank == 1
    # Printed 190/195: the sum of iterations 1 and 2 divided by log_interval 1; per iteration:
    assert r2.interval == 2
    assert r2.timers["forward-backward"].per_rank == {0: 95.0, 1: 97.5}
    assert log.issues == []


def test_tp2_max_timers_moe_log() -> None:
    log = parse_file(DATA / "tp2_max_timers_moe.log")
    info = log.job_info
    lay, spec = info.layout, info.spec
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.vpp, lay.num_microbatches) == (2, 2, 2, 2, 2, 16)
    assert (spec.num_experts, spec.moe_router_topk, spec.moe_layer_freq) == (8, 2, [0, 1, 1, 1])
    assert (spec.num_query_groups, spec.swiglu, spec.untie_embeddings, spec.dtype) == (4, True, True, "fp8")
    assert (spec.padded_vocab_size, spec.vocab_size, spec.mtp_num_layers) == (50432, 50257, 1)
    r1, r10, r20 = log.records
    # Printed 880.00: one iteration divided by log_interval 10; per iteration 8800 (step 9000 ms).
    assert r1.timers["forward-backward"].max_ms == 8800.0 and r1.timers["forward-backward"].min_ms is None
    assert r10.timers["forward-backward"].max_ms == 950.0  # interval 10 == log_interval: as printed
    assert r1.fields["energy per GPU (J/iter/GPU)"] == "4000.0"
    assert r10.lm_loss is None and r10.nan_iterations == 1 and r10.fields["mtp_1 loss"] == "9.100000E+00"
    assert r20.grad_norm is None and r20.skipped_iterations == 1
    assert r20.timers["evaluate"].min_ms == 500.0  # evaluation timers follow iteration 20's line
    assert [r.interval for r in log.records] == [1, 10, 10]
    assert [e["iteration"] for e in log.events if e["kind"] == "validation"] == [20]
    assert log.issues == []


# ------------------------------------------------------------------------------------------
# Streaming equals whole-file parsing
# ------------------------------------------------------------------------------------------


def _stream(path: Path, *, newline: bool) -> list[StepRecord]:
    p = MegatronLogParser(source_name=path.name)
    out: list[StepRecord] = []
    data = path.read_bytes()
    raws = data.split(b"\n")
    if data.endswith(b"\n"):
        raws.pop()
    for raw in raws:
        line = raw.decode("utf-8", "replace")
        out.extend(p.feed(line + "\n" if newline else line))
    out.extend(p.flush())
    return out


# Real logs recorded by tests/gpu/run_megatron_configs.sh (TP=2, GQA, interleaved PP, DP=2 'all'
# timers, MoE, ...), checked by properties rather than by their exact numbers.
REAL_LOGS = [FIXTURE, *sorted((_REPO / "tests/data/megatron").glob("*.log"))]
ALL_LOGS = [*REAL_LOGS, *sorted(DATA.glob("*.log"))]


@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.name)
def test_real_logs_parse_completely_and_consistently(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"missing {path}")
    log = parse_file(path)
    info, lay, spec = log.job_info, log.job_info.layout, log.job_info.spec
    assert log.issues == [] and log.records
    assert info.framework_version is not None and info.log_interval is not None
    assert None not in (lay.world_size, lay.tp, lay.pp, lay.dp, lay.cp, lay.num_microbatches)
    assert lay.world_size == lay.tp * lay.pp * lay.dp * lay.cp  # type: ignore[operator]
    assert lay.num_microbatches == lay.global_batch_size // (lay.micro_batch_size * lay.dp)  # type: ignore[operator]
    assert None not in (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.seq_length,
                        spec.padded_vocab_size, spec.dtype)
    iterations = [r.iteration for r in log.records]
    # Each run of the log counts up (a run resumed from an older checkpoint starts below where the
    # one before it stopped: h100_resume_older.log), and the last reaches the job's train-iters.
    runs = [k for k, r in enumerate(log.records) if r.first_of_run or k == 0] + [len(iterations)]
    for a, b in itertools.pairwise(runs):
        assert iterations[a:b] == sorted(set(iterations[a:b])), (a, b)
    assert iterations[-1] == log.records[-1].train_iters
    li = info.log_interval
    for r in log.records:
        assert r.step_time_ms is not None and r.interval is not None and r.timers
        fb = r.timers["forward-backward"]
        assert fb.max_ms is not None
        # Per-iteration timers (after the first-log rescale) fit inside the per-iteration step.
        assert 0.5 * r.step_time_ms < fb.max_ms <= r.step_time_ms, (r.iteration, fb, r.step_time_ms)
        if info.timing_log_option == "all":
            assert fb.per_rank and len(fb.per_rank) <= lay.world_size  # type: ignore[operator]
        elif info.timing_log_option == "max":
            assert fb.min_ms is None
        else:
            assert fb.min_ms is not None and fb.min_ms <= fb.max_ms
        if info.arguments.get("log_straggler") == "True" and r.iteration % li == 0:
            assert r.straggler is not None and "rtt" in r.straggler.quantities


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("newline", [True, False])
def test_feeding_line_by_line_equals_parse_file(path: Path, newline: bool) -> None:
    if not path.exists():
        pytest.skip(f"missing {path}")
    whole = parse_file(path)
    assert _stream(path, newline=newline) == whole.records
    assert whole.records


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: p.name)
def test_tailing_a_growing_file_equals_parse_file(path: Path, tmp_path: Path) -> None:
    """The agent's path: the log grows in random chunks (cut mid-line, mid-character);
    LogTail hands complete lines to the parser."""
    if not path.exists():
        pytest.skip(f"missing {path}")
    data = path.read_bytes()
    live = tmp_path / path.name
    live.write_bytes(b"")
    tail = LogTail(live)
    parser = MegatronLogParser(source_name=path.name)
    records: list[StepRecord] = []
    rng = random.Random(7)
    pos = 0
    with live.open("ab") as fh:
        while pos < len(data):
            step = rng.randint(1, 4000)
            fh.write(data[pos:pos + step])
            fh.flush()
            pos += step
            for line in tail.read_lines(max_bytes=rng.randint(1, 8192)):
                records.extend(parser.feed(line))
    for _ in range(1000):  # drain what the small max_bytes left behind
        lines = tail.read_lines()
        if not lines:
            break
        for line in lines:
            records.extend(parser.feed(line))
    records.extend(parser.flush())
    tail.close()
    assert records == parse_file(path).records
    assert tail.errors == {}
