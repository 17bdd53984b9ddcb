"""One test per Megatron-LM line format (iteration lines, timers, straggler, memory, validation),
each with a line written in that format. Start-up/arguments tests are in test_args.py; the real
fixture in test_fixture.py."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from perfd.collectors.megatron import MegatronLogParser, ParsedLog, parse_lines

# The real iteration line of the shared fixture (Megatron-Core 0.20.0), including the other
# rank's text glued onto its end.
NEW_LINE = (
    " [2026-11-21 20:58:42.618274] iteration        1/      40 | consumed samples:           64 |"
    " elapsed time per iteration (ms): 5868.0 | throughput per GPU (TFLOP/s/GPU): 4.8 |"
    " learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 1.057704E+01 |"
    " loss scale: 1.0 | grad norm: 2.696 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |"
)
INTRUSION = "Number of parameters in transformer block in billions:  0.10"


def it_line(
    n: int,
    total: int = 40,
    ts: str | None = "2026-11-21 20:58:42.618274",
    extra: dict[str, str] | None = None,
) -> str:
    """An iteration line as Megatron-Core formats it, with optional extra pairs before loss scale."""
    head = f" [{ts}]" if ts is not None else ""
    pairs = (
        f" iteration {n:8d}/{total:8d} | consumed samples: {n * 64:12d} |"
        " elapsed time per iteration (ms): 331.1 | throughput per GPU (TFLOP/s/GPU): 84.2 |"
        " learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 3.061306E+00 |"
    )
    for key, value in (extra or {}).items():
        pairs += f" {key}: {value} |"
    pairs += " loss scale: 1.0 | grad norm: 5.923 |"
    pairs += " number of skipped iterations:   0 | number of nan iterations:   0 |"
    return head + pairs


def parse(*lines: str) -> ParsedLog:
    return parse_lines(lines)


def utc(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int = 0) -> float:
    return datetime(y, mo, d, h, mi, s, us, tzinfo=timezone.utc).timestamp()


# ------------------------------------------------------------------------------------------
# Iteration lines
# ------------------------------------------------------------------------------------------


def test_new_format_iteration_line_fills_every_typed_field() -> None:
    log = parse(NEW_LINE)
    assert len(log.records) == 1
    r = log.records[0]
    assert (r.iteration, r.train_iters, r.rank) == (1, 40, "last")
    assert r.end_time == pytest.approx(utc(2026, 11, 21, 20, 58, 42, 618274))
    assert r.consumed_samples == 64 and r.global_batch_size == 64
    assert r.step_time_ms == 5868.0 and r.logged_tflops_per_gpu == 4.8
    assert r.learning_rate == pytest.approx(1e-4)
    assert r.lm_loss == pytest.approx(10.57704)
    assert (r.loss_scale, r.grad_norm) == (1.0, 2.696)
    assert (r.skipped_iterations, r.nan_iterations) == (0, 0)
    assert r.fields["lm loss"] == "1.057704E+01"  # raw text kept as printed
    assert len(r.fields) == 10
    assert r.source is not None and r.source.collector == "megatron"
    assert r.source.detail == "<lines>:1"
    assert log.issues == []


def test_old_format_without_timestamp() -> None:
    line = (
        " iteration      100/  500000 | consumed samples:         6400 | elapsed time per iteration (ms):"
        " 1234.5 | learning rate: 1.500E-04 | global batch size:    64 | lm loss: 7.123456E+00 |"
        " loss scale: 65536.0 | grad norm: 1.234 | number of skipped iterations:   0 |"
        " number of nan iterations:   0 |"
    )
    r = parse(line).records[0]
    assert (r.iteration, r.train_iters, r.end_time) == (100, 500000, None)
    assert r.step_time_ms == 1234.5 and r.loss_scale == 65536.0
    assert r.logged_tflops_per_gpu is None  # not printed (no --log-throughput): absent, not 0
    assert "throughput per GPU (TFLOP/s/GPU)" not in r.fields


def test_timestamp_without_microseconds() -> None:
    r = parse(it_line(10, 100, ts="2024-05-01 10:00:00")).records[0]
    assert r.end_time == utc(2024, 5, 1, 10, 0, 0)


@pytest.mark.parametrize(
    "head", ["iteration 100/ 1000 |", "iteration 100/1000|", "iteration      100/     1000 |"]
)
def test_iteration_head_spacing_variants(head: str) -> None:
    r = parse(f"{head} consumed samples: 6400 | elapsed time per iteration (ms): 12.5 |").records[0]
    assert (r.iteration, r.train_iters, r.consumed_samples, r.step_time_ms) == (100, 1000, 6400, 12.5)


def test_extra_fields_are_kept_raw_and_do_not_disturb_typed_ones() -> None:
    line = it_line(
        7,
        extra={
            "tokens per GPU (tokens/s/GPU)": "12345.6",
            "energy per GPU (J/iter/GPU)": "150.2",
            "power per GPU (W/GPU)": "450.1",
            "skipped samples": "3",
            "mtp_1 loss": "3.100000E+00",
            "load_balancing_loss": "1.002345",
            "params norm": "250.125",
            "num zeros": "17",
        },
    )
    r = parse(line).records[0]
    assert r.fields["tokens per GPU (tokens/s/GPU)"] == "12345.6"
    assert r.fields["energy per GPU (J/iter/GPU)"] == "150.2"
    assert r.fields["mtp_1 loss"] == "3.100000E+00"
    assert r.fields["load_balancing_loss"] == "1.002345"
    assert r.fields["skipped samples"] == "3"
    assert r.fields["params norm"] == "250.125" and r.fields["num zeros"] == "17"
    assert r.lm_loss == pytest.approx(3.061306) and r.grad_norm == 5.923


def test_moe_and_mtp_loss_keys_with_underscores() -> None:
    line = (
        " [2025-06-01 08:00:01.500000] iteration        1/     100 | consumed samples: 32 |"
        " elapsed time per iteration (ms): 9000.0 | lm loss: 1.100000E+01 | mtp_1 loss: 1.120000E+01 |"
        " load_balancing_loss: 1.050000 | loss scale: 1.0 |"
    )
    r = parse(line).records[0]
    assert r.fields["mtp_1 loss"] == "1.120000E+01"
    assert r.fields["load_balancing_loss"] == "1.050000"


def test_nan_loss_removes_lm_loss_field() -> None:
    line = it_line(9).replace(" lm loss: 3.061306E+00 |", "").replace(
        "number of nan iterations:   0", "number of nan iterations:   1"
    )
    r = parse(line).records[0]
    assert r.lm_loss is None and not r.has_field("lm loss")
    assert r.nan_iterations == 1
    assert r.grad_norm == 5.923


def test_skipped_iteration_removes_grad_norm() -> None:
    line = it_line(11).replace(" grad norm: 5.923 |", "").replace(
        "number of skipped iterations:   0", "number of skipped iterations:   1"
    )
    r = parse(line).records[0]
    assert r.grad_norm is None and not r.has_field("grad norm")
    assert r.skipped_iterations == 1
    assert r.lm_loss is not None


def test_intrusion_at_end_is_dropped_and_counted() -> None:
    log = parse(NEW_LINE + INTRUSION)
    r = log.records[0]
    assert r.nan_iterations == 0
    assert len(r.fields) == 10
    assert not any("Number of parameters" in k for k in r.fields)
    assert log.counts["intrusions"] == 1
    assert log.issues == []  # the line was usable


def test_intrusion_in_the_middle_drops_only_the_broken_segment() -> None:
    line = NEW_LINE.replace(" learning rate: 1.000000E-04 |", " learning rWARNING: disk is slow |")
    log = parse(line)
    r = log.records[0]
    assert r.learning_rate is None and "learning rWARNING" not in " ".join(r.fields)
    assert r.lm_loss == pytest.approx(10.57704) and r.nan_iterations == 0
    assert log.counts["intrusions"] == 1


def test_truncated_line_keeps_complete_pairs_and_reports_issue() -> None:
    line = (
        " [2026-11-21 20:58:43.000000] iteration       12/      40 | consumed samples:          768 |"
        " elapsed time per it"
    )
    log = parse(line)
    assert [r.iteration for r in log.records] == [12]
    r = log.records[0]
    assert r.consumed_samples == 768 and r.train_iters == 40
    assert r.step_time_ms is None and "elapsed time per it" not in r.fields
    assert [i.reason for i in log.issues] == ["truncated-iteration-line"]
    assert log.counts["malformed:truncated-iteration-line"] == 1
    assert "intrusions" not in log.counts


def test_truncated_inside_a_value_does_not_take_the_partial_number() -> None:
    log = parse(" iteration       12/      40 | consumed samples:          768 | lm loss: 1.05")
    r = log.records[0]
    assert r.lm_loss is None  # "1.05" may be the start of "1.057704E+01": not trusted
    assert log.issues[0].reason == "truncated-iteration-line"


def test_truncated_after_slash_still_gives_a_record_without_train_iters() -> None:
    log = parse(" [2026-11-21 20:58:43.000000] iteration       12/      4")
    assert [(r.iteration, r.train_iters) for r in log.records] == [(12, None)]
    assert log.issues[0].reason == "truncated-iteration-line"


def test_truncated_inside_the_iteration_number_gives_no_record() -> None:
    log = parse(" [2026-11-21 20:58:43.000000] iteration       1")
    assert log.records == []
    assert log.issues[0].reason == "truncated-iteration-line"


def test_iteration_line_without_number_is_an_issue() -> None:
    log = parse(" iteration      abc/      40 | consumed samples: 64 | elapsed time per iteration (ms): 5 |")
    assert log.records == []
    assert [i.reason for i in log.issues] == ["iteration-line-no-iteration-number"]


def test_memory_line_is_not_an_iteration_and_attaches_to_its_iteration() -> None:
    mem0 = ("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1638.72 | max allocated: 4781.19"
            " | reserved: 5006.00 | max reserved: 5006.00")
    mem1 = ("[Rank 1] (after 1 iterations) memory (MB) | allocated: 1636.75 | max allocated: 3597.09"
            " | reserved: 4112.00 | max reserved: 4112.00")
    alone = parse(mem0)
    assert alone.records == [] and alone.issues == []
    assert alone.counts["memory_lines"] == 1 and alone.counts["memory_unattached"] == 1
    log = parse(NEW_LINE, mem1, mem0)
    assert len(log.records) == 1
    assert log.records[0].memory_mb == {
        1: {"allocated": 1636.75, "max allocated": 3597.09, "reserved": 4112.0, "max reserved": 4112.0},
        0: {"allocated": 1638.72, "max allocated": 4781.19, "reserved": 5006.0, "max reserved": 5006.0},
    }


def test_memory_line_for_another_iteration_is_not_attached() -> None:
    mem = "[Rank 0] (after 5 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0"
    log = parse(NEW_LINE, mem)
    assert log.records[0].memory_mb == {}
    assert log.counts["memory_unattached"] == 1


def test_validation_line_is_an_event_not_a_step_record() -> None:
    val = " validation loss at iteration 100 | lm loss value: 2.950000E+00 | lm loss PPL: 1.910540E+01 | "
    log = parse(it_line(100, 1000), val)
    assert [r.iteration for r in log.records] == [100]
    assert log.counts["validation_lines"] == 1
    assert [e for e in log.events if e["kind"] == "validation"] == [{
        "kind": "validation", "label": "validation", "iteration": 100,
        "values": {"lm loss value": 2.95, "lm loss PPL": 19.1054},
        "source": "megatron:<lines>:2",
    }]
    # ... and the end of an evaluation pass (perfd.analytics.incidents.stall: no stall during one)
    (phase,) = [e["payload"] for e in log.events if e["kind"] == "job_phase"]
    assert isinstance(phase, dict)
    assert (phase["phase"], phase["state"], phase["iteration"]) == ("evaluation", "end", 100)
    end_of_training = " validation loss at iteration 100 on validation set | lm loss value: 2.9E+00 | "
    assert parse(end_of_training).records == []


def test_timer_body_line_alone_is_not_an_iteration_line() -> None:
    log = parse("    forward-backward ...............................: (1.0, 2.0)")
    assert log.records == [] and log.issues == []
    assert log.counts["other"] == 1


def test_prose_mentioning_iterations_is_not_an_iteration_line() -> None:
    log = parse(
        "Overwriting rerun_state_machine.current_iteration from -1 to 0...",
        " > saving checkpoint at iteration     100 to /ckpt in torch_dist format",
        "[after training is done] datetime: 2026-11-21 20:58:56.281626 ",
    )
    assert log.records == [] and log.issues == []


def test_launcher_prefixes_are_stripped() -> None:
    log = parse(
        "[default1]:" + it_line(3),
        "[default1]:INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "[default1]:    forward-backward ...............................: (351.90, 352.07)",
        "1: " + it_line(4),
    )
    assert [r.iteration for r in log.records] == [3, 4]
    assert log.records[0].timers["forward-backward"].max_ms == 352.07


# ------------------------------------------------------------------------------------------
# Timer blocks
# ------------------------------------------------------------------------------------------

MINMAX_BLOCK = [
    "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
    "    forward-backward ...............................: (5577.20, 5578.36)",
    "    batch-generator ................................: (48.75, 73.01)",
]


def test_minmax_timers_with_logger_prefix_attach_to_the_preceding_iteration() -> None:
    log = parse(it_line(1), *MINMAX_BLOCK, it_line(2))
    first, second = log.records
    assert first.timers["forward-backward"].min_ms == 5577.20
    assert first.timers["forward-backward"].max_ms == 5578.36
    assert first.timers["batch-generator"].spread() == pytest.approx(73.01 / 48.75)
    assert second.timers == {}
    assert log.job_info.timing_log_option == "minmax"  # inferred: no arguments block here


def test_minmax_timers_without_prefix() -> None:
    log = parse(it_line(1), "(min, max) time across ranks (ms):", MINMAX_BLOCK[1])
    assert log.records[0].timers["forward-backward"].max_ms == 5578.36


def test_max_timers_fill_max_only() -> None:
    log = parse(
        it_line(1),
        "INFO:megatron.core.timers:max time across ranks (ms):",
        "    forward-backward ...............................: 880.00",
        "    a-timer-name-that-is-exactly-long-enough-to-have-no-dots : 1.25",
    )
    timers = log.records[0].timers
    assert (timers["forward-backward"].min_ms, timers["forward-backward"].max_ms) == (None, 880.0)
    assert timers["a-timer-name-that-is-exactly-long-enough-to-have-no-dots"].max_ms == 1.25
    assert log.job_info.timing_log_option == "max"


def test_all_timers_give_per_rank_values_and_skip_interleaved_warnings() -> None:
    log = parse(
        it_line(1),
        "INFO:megatron.core.timers:times across ranks (ms):",
        "  forward-backward:",
        "     rank  0: 1800.10",
        "     rank  1: 1801.20",
        "  batch-generator:",
        "     rank  0: 10.50",
        "/opt/torch/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:83: UserWarning: barrier()",
        "  return func(*args, **kwargs)",
        "     rank  1: 45.25",
    )
    t = log.records[0].timers
    assert t["forward-backward"].per_rank == {0: 1800.10, 1: 1801.20}
    assert (t["batch-generator"].min_ms, t["batch-generator"].max_ms) == (10.50, 45.25)
    assert t["batch-generator"].per_rank == {0: 10.50, 1: 45.25}
    assert log.job_info.timing_log_option == "all"


def test_minmax_block_continues_across_an_interleaved_warning() -> None:
    log = parse(
        it_line(1),
        MINMAX_BLOCK[0],
        MINMAX_BLOCK[1],
        "megatron/core/pipeline_parallel/schedules.py:225: UserWarning: The AccumulateGrad node's stream",
        "  Variable._execution_engine.run_backward(",
        MINMAX_BLOCK[2],
    )
    assert set(log.records[0].timers) == {"forward-backward", "batch-generator"}


def test_one_line_timers_of_very_old_megatron() -> None:
    log = parse(
        " iteration      100/  500000 | elapsed time per iteration (ms): 812.3 | lm loss: 8.123456E+00 |",
        "time (ms) | forward-compute: 400.12 | backward-compute: 700.34 | batch-generator: 2.00",
    )
    t = log.records[0].timers
    assert {k: (v.min_ms, v.max_ms) for k, v in t.items()} == {
        "forward-compute": (None, 400.12), "backward-compute": (None, 700.34), "batch-generator": (None, 2.0)
    }


def test_startup_timers_go_to_job_info_not_to_a_record() -> None:
    log = parse(
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    startup-library-setup ..........................: (13388.04, 13435.15)",
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    model-and-optimizer-setup ......................: (306.48, 307.06)",
        it_line(1),
        *MINMAX_BLOCK,
    )
    assert set(log.job_info.startup_timers) == {"startup-library-setup", "model-and-optimizer-setup"}
    assert log.job_info.startup_timers["startup-library-setup"].max_ms == 13435.15
    assert set(log.records[0].timers) == {"forward-backward", "batch-generator"}


def test_bad_timer_value_is_an_issue() -> None:
    bad = "    forward-backward ...............................: (5577.20, oops)"
    log = parse(it_line(1), MINMAX_BLOCK[0], bad)
    assert log.records[0].timers == {}
    assert [i.reason for i in log.issues] == ["timer-line-bad-value"]


# ------------------------------------------------------------------------------------------
# Straggler detector
# ------------------------------------------------------------------------------------------

STRAGGLER = (
    "[2026-11-21 20:58:42] | MnRtt/Rnk: 1475.58ms/0 | MxRtt/Rnk: 2273.05ms/1 | MnPwr/Rnk: 207359.00W/0 |"
    " MxPwr/Rnk: 226827.00W/1 | MnTmp/Rnk: 41.00C/0 | MxTmp/Rnk: 41.00C/0 | MnUtl/Rnk: 0.00%/1 |"
    " MxUtl/Rnk: 2.00%/0 | MnClk/Rnk: 1980.00MHz/0 | MxClk/Rnk: 1980.00MHz/0 | MnDRtt/Rnk: 32.25ms/1 |"
    " MxDRtt/Rnk: 54.41ms/0 | MnEtpt/Rnk: 4.09TF/1 | MxEtpt/Rnk: 6.30TF/0"
)


@pytest.mark.parametrize("prefix", ["INFO:megatron.core.utils:", ""])
def test_straggler_line_with_and_without_logger_prefix(prefix: str) -> None:
    log = parse(it_line(1), *MINMAX_BLOCK, prefix + STRAGGLER)
    s = log.records[0].straggler
    assert s is not None and s.time == "2026-11-21 20:58:42" and s.line_no == 5
    assert set(s.quantities) == {"rtt", "power", "temp", "util", "clock", "data_rtt", "tflops"}
    lo, hi = s.quantities["rtt"]
    assert (lo.value, lo.rank, lo.unit, hi.value, hi.rank) == (1475.58, 0, "ms", 2273.05, 1)
    lo, hi = s.quantities["power"]  # printed "207359.00W" but it is milliwatts
    assert lo.value == pytest.approx(207.359) and hi.value == pytest.approx(226.827)
    assert (lo.unit, hi.unit, hi.rank) == ("W", "W", 1)
    assert s.quantities["tflops"][1].value == 6.30 and s.quantities["tflops"][1].unit == "TF"
    assert s.quantities["util"][0].unit == "%"
    assert set(log.records[0].timers) == {"forward-backward", "batch-generator"}


def test_straggler_line_inside_a_timer_block_does_not_end_it() -> None:
    log = parse(it_line(1), MINMAX_BLOCK[0], MINMAX_BLOCK[1], "INFO:megatron.core.utils:" + STRAGGLER,
                MINMAX_BLOCK[2], it_line(2))
    first = log.records[0]
    assert first.straggler is not None
    assert set(first.timers) == {"forward-backward", "batch-generator"}


def test_straggler_line_of_an_older_version_with_fewer_quantities() -> None:
    old = ("[2024-03-01 12:00:00] | MnRtt/Rnk: 98.88ms/0 | MxRtt/Rnk: 144.58ms/1 | MnEtpt/Rnk: 80.00TF/1"
           " | MxEtpt/Rnk: 99.00TF/0")
    s = parse(it_line(1), old).records[0].straggler
    assert s is not None and set(s.quantities) == {"rtt", "tflops"}


def test_unparseable_straggler_line_is_an_issue() -> None:
    log = parse(it_line(1), "INFO:megatron.core.utils:[2026-11-21 20:58:42] | MnRtt/Rnk: ???/x |")
    assert log.records[0].straggler is None
    assert [i.reason for i in log.issues] == ["straggler-line-unparseable"]


# ------------------------------------------------------------------------------------------
# Streaming semantics
# ------------------------------------------------------------------------------------------


def test_feed_returns_a_record_only_when_the_next_iteration_line_arrives() -> None:
    p = MegatronLogParser(job="j", source_name="train.log")
    assert p.feed(it_line(1) + "\n") == []
    assert p.feed(MINMAX_BLOCK[0] + "\n") == []
    assert p.feed(MINMAX_BLOCK[1]) == []
    assert p.feed("INFO:megatron.core.utils:" + STRAGGLER + "\n") == []
    done = p.feed(it_line(2) + "\n")
    assert [r.iteration for r in done] == [1]
    assert done[0].job == "j" and str(done[0].source) == "megatron:train.log:1"
    assert done[0].straggler is not None and "forward-backward" in done[0].timers
    last = p.flush()
    assert [r.iteration for r in last] == [2]
    assert p.flush() == []


def test_feed_accepts_several_lines_in_one_string() -> None:
    p = MegatronLogParser()
    assert p.feed(it_line(1) + "\n" + it_line(2) + "\n")[0].iteration == 1
    assert p.counts["lines"] == 2


def test_interval_covers_first_iteration_log_without_reset() -> None:
    # log interval 10: Megatron logs iteration 1 (first of the run) and then 10, 20, ...; the
    # record at 10 averages iterations 1..10 because the first log does not reset.
    args = ["------------------------ arguments ------------------------",
            "  log_interval .................................... 10",
            "-------------------- end of arguments ---------------------"]
    log = parse(*args, it_line(1), it_line(10), it_line(20))
    assert [(r.iteration, r.interval) for r in log.records] == [(1, 1), (10, 10), (20, 10)]


def test_interval_after_resume_from_checkpoint() -> None:
    args = ["------------------------ arguments ------------------------",
            "  log_interval .................................... 10",
            "-------------------- end of arguments ---------------------"]
    log = parse(*args, it_line(996), it_line(1000), it_line(1010))
    assert [(r.iteration, r.interval) for r in log.records] == [(996, 1), (1000, 5), (1010, 10)]


def test_first_log_timers_are_rescaled_to_per_iteration_but_later_blocks_are_not() -> None:
    # Megatron divides the step timers of the first-iteration log by log_interval (10) although
    # they cover one iteration; a later block (save-checkpoint) is printed without normaliser.
    args = ["------------------------ arguments ------------------------",
            "  log_interval .................................... 10",
            "-------------------- end of arguments ---------------------"]
    log = parse(
        *args, it_line(1), *MINMAX_BLOCK,
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    save-checkpoint ................................: (5.00, 6.00)",
        it_line(10), *MINMAX_BLOCK,
    )
    first, tenth = log.records
    assert first.timers["forward-backward"].max_ms == pytest.approx(55783.6)
    assert first.timers["save-checkpoint"].max_ms == 6.0
    assert tenth.interval == 10 and tenth.timers["forward-backward"].max_ms == 5578.36


def test_prose_ending_with_an_iteration_count_is_not_a_truncated_line() -> None:
    log = parse("checkpoint saved at iteration 5/10", " iteration 5/10 of warm-up done")
    assert log.records == [] and log.issues == []
