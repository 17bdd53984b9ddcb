"""Start-up output: versions, world-size lines of several eras, the arguments block, and how
they fill ParallelLayout and ModelSpec."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.collectors.megatron import parse_file, parse_lines
from perfd.collectors.megatron.args import parse_argument_line, parse_layer_freq
from perfd.core.model import JobInfo

DATA = Path(__file__).resolve().parent / "data"
HEADER = "------------------------ arguments ------------------------"
FOOTER = "-------------------- end of arguments ---------------------"


def arg(name: str, value: object) -> str:
    """An argument line exactly as Megatron's _print_args writes it."""
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


def job(*lines: str) -> JobInfo:
    return parse_lines(lines).job_info


def args_block(**values: object) -> list[str]:
    return [HEADER, *(arg(k, v) for k, v in values.items()), FOOTER]


def test_version_lines() -> None:
    info = job("> PyTorch version ................ 2.11.0+cu130", "> Megatron-Core version .......... 0.20.0")
    assert (info.framework_version, info.torch_version) == ("0.20.0", "2.11.0+cu130")


def test_new_world_size_line() -> None:
    lay = job(
        "using world size: 2, data-parallel size: 1, context-parallel size: 1, hierarchical context-parallel"
        " sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 2"
    ).layout
    assert (lay.world_size, lay.dp, lay.cp, lay.tp, lay.pp) == (2, 1, 1, 1, 2)


def test_old_world_size_line_with_dashed_names() -> None:
    lay = job(
        "using world size: 8, data-parallel-size: 2, tensor-model-parallel size: 2, "
        "pipeline-model-parallel size: 2 "
    ).layout
    assert (lay.world_size, lay.dp, lay.tp, lay.pp, lay.cp) == (8, 2, 2, 2, None)


def test_world_size_line_missing_a_comma() -> None:
    lay = job(
        "using world size: 16, data-parallel size: 2, context-parallel size: 2 "
        "tensor-model-parallel size: 2, "
        "pipeline-model-parallel size: 2 "
    ).layout
    assert (lay.world_size, lay.dp, lay.cp, lay.tp, lay.pp) == (16, 2, 2, 2, 2)


def test_2019_world_size_line_names_model_parallel() -> None:
    lay = job("using world size: 16 and model-parallel size: 2 ").layout
    assert (lay.world_size, lay.tp) == (16, 2)


def test_unparseable_world_size_line_is_an_issue() -> None:
    log = parse_lines(["using world size: lots"])
    assert [i.reason for i in log.issues] == ["world-size-line-unparseable"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  bf16 ............................................ True", ("bf16", "True")),
        ("  ddp_param_name_patterns_for_fp32_local_accumulation  []", (
            "ddp_param_name_patterns_for_fp32_local_accumulation", "[]")),
        ("  config_logger_dir ............................. ", ("config_logger_dir", "")),
        ("  config_logger_dir .............................", ("config_logger_dir", "")),
        ("  cp_comm_type .................................... ['p2p']", ("cp_comm_type", "['p2p']")),
        ("  data_path ....................................... ./data/a b", ("data_path", "./data/a b")),
        ("  return func(*args, **kwargs)", None),  # a traceback line inside the block
        ("    forward-backward ....: (1.0, 2.0)", None),
    ],
)
def test_argument_line_forms(line: str, expected: tuple[str, str] | None) -> None:
    assert parse_argument_line(line) == expected


def test_arguments_fill_layout_and_spec() -> None:
    info = job(*args_block(
        num_layers=8, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16, kv_channels=64,
        seq_length=1024, micro_batch_size=4, global_batch_size=64, tensor_model_parallel_size=1,
        pipeline_model_parallel_size=2, data_parallel_size=1, context_parallel_size=1,
        expert_model_parallel_size=1, world_size=2, bf16=True, fp16=False, fp8=None, swiglu=False,
        untie_embeddings_and_output_weights=False, group_query_attention=False, num_query_groups=1,
        padded_vocab_size=None, vocab_size=32000, log_interval=1, timing_log_option="minmax",
        num_experts=None, moe_router_topk=2, moe_layer_freq=1, mtp_num_layers=None,
        multi_latent_attention=False, virtual_pipeline_model_parallel_size=None,
    ))
    lay, spec = info.layout, info.spec
    assert (lay.world_size, lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.vpp) == (2, 1, 2, 1, 1, 1, None)
    assert (lay.micro_batch_size, lay.global_batch_size) == (4, 64)
    assert lay.microbatches() == 16  # derived: no "setting number of microbatches" line here
    assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size) == (8, 1024, 4096)
    assert (spec.num_attention_heads, spec.kv_channels, spec.seq_length) == (16, 64, 1024)
    assert spec.num_query_groups is None  # printed as 1, but GQA is off
    assert spec.padded_vocab_size is None and spec.vocab_size == 32000
    assert spec.dtype == "bf16" and spec.swiglu is False and spec.untie_embeddings is False
    # Dense model: the MoE defaults Megatron prints (topk 2, layer freq 1) are not model facts.
    assert (spec.num_experts, spec.moe_router_topk, spec.moe_layer_freq) == (None, None, None)
    assert (info.log_interval, info.timing_log_option) == (1, "minmax")
    assert info.arguments["fp8"] == "None" and info.arguments["bf16"] == "True"


def test_padded_vocab_line_overrides_arguments_and_microbatches_line_is_used() -> None:
    info = job(
        *args_block(padded_vocab_size=None, vocab_size=50257, global_batch_size=64, micro_batch_size=1),
        "INFO:megatron.core.num_microbatches_calculator:setting number of microbatches to constant 16",
        "INFO:megatron.core.tokenizers.utils.build_tokenizer: > padded vocab (size: 50257) with 175 dummy"
        " tokens (new size: 50432)",
    )
    assert (info.spec.vocab_size, info.spec.padded_vocab_size) == (50257, 50432)
    assert info.layout.num_microbatches == 16


def test_old_micro_batches_spelling() -> None:
    assert job("setting number of micro-batches to constant 8").layout.num_microbatches == 8


def test_gqa_swiglu_untied_fp8() -> None:
    spec = job(*args_block(
        group_query_attention=True, num_query_groups=4, swiglu=True,
        untie_embeddings_and_output_weights=True, bf16=True, fp8="hybrid",
    )).spec
    assert (spec.num_query_groups, spec.swiglu, spec.untie_embeddings, spec.dtype) == (4, True, True, "fp8")


@pytest.mark.parametrize(
    ("bf16", "fp16", "dtype"), [(True, False, "bf16"), (False, True, "fp16"), (False, False, "fp32")]
)
def test_dtype_from_flags(bf16: bool, fp16: bool, dtype: str) -> None:
    assert job(*args_block(bf16=bf16, fp16=fp16, fp8=None)).spec.dtype == dtype


def test_moe_fields_when_the_model_has_experts() -> None:
    spec = job(*args_block(
        num_layers=4, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1408,
        moe_shared_expert_intermediate_size=2816, moe_layer_freq="[0, 1, 1, 1]", mtp_num_layers=1,
        multi_latent_attention=True,
    )).spec
    assert (spec.num_experts, spec.moe_router_topk, spec.moe_ffn_hidden_size) == (8, 2, 1408)
    assert spec.moe_shared_expert_ffn_hidden_size == 2816
    assert spec.moe_layer_freq == [0, 1, 1, 1]
    assert spec.mtp_num_layers == 1 and spec.multi_latent_attention is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("2", 2),
        ("[1,0,1]", [1, 0, 1]),
        ("[1, 0, 1]", [1, 0, 1]),
        ("([0]+[1]*3)*2", [0, 1, 1, 1, 0, 1, 1, 1]),
        ("None", None),
        ("__import__('os').system('true')", None),  # never evaluated as code
        ("[1]*10**9", None),  # bounded
        ("[[1], [0]]", None),
        ("garbage[", None),
    ],
)
def test_layer_freq_is_parsed_without_eval(text: str, expected: object) -> None:
    assert parse_layer_freq(text) == expected


def test_bad_layer_freq_is_an_issue() -> None:
    log = parse_lines(args_block(num_experts=8, moe_layer_freq="lambda: 1"))
    assert log.job_info.spec.moe_layer_freq is None
    assert [i.reason for i in log.issues] == ["argument-bad-layer-freq"]


def test_vpp_from_layers_per_virtual_stage() -> None:
    lay = job(*args_block(
        num_layers=8, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=2,
        virtual_pipeline_model_parallel_size=None,
    )).layout
    assert lay.vpp == 2


def test_vpp_stated_directly_and_by_the_virtual_stages_line() -> None:
    assert job(*args_block(virtual_pipeline_model_parallel_size=4)).layout.vpp == 4
    assert job("Number of virtual stages per pipeline stage: 3").layout.vpp == 3
    assert job("Number of virtual stages per pipeline stage: None").layout.vpp is None


def test_non_integer_argument_is_an_issue_and_stays_absent() -> None:
    log = parse_lines(args_block(num_layers="eight", hidden_size=1024))
    assert log.job_info.spec.num_layers is None and log.job_info.spec.hidden_size == 1024
    assert [(i.reason, i.text) for i in log.issues] == [("argument-not-int", "num_layers eight")]


def test_interleaved_output_inside_the_arguments_block() -> None:
    info = job(
        HEADER,
        arg("num_layers", 8),
        "megatron/training/arguments.py:12: UserWarning: something",
        "  warnings.warn(",
        "  return func(*args, **kwargs)",
        arg("hidden_size", 1024),
        FOOTER,
    )
    assert (info.spec.num_layers, info.spec.hidden_size) == (8, 1024)
    assert set(info.arguments) == {"num_layers", "hidden_size"}


def test_arguments_block_cut_short_still_applies_at_the_next_iteration() -> None:
    log = parse_lines([HEADER, arg("num_layers", 8), arg("log_interval", 5),
                       " iteration        5/      10 | consumed samples: 5 |"])
    assert log.job_info.spec.num_layers == 8 and log.job_info.log_interval == 5
    assert log.records[0].interval == 5


def test_2019_arguments_colon_block_without_end_marker() -> None:
    log = parse_file(DATA / "v2019_arguments_colon.log")
    info = log.job_info
    assert (info.layout.world_size, info.layout.tp) == (16, 2)
    assert (info.spec.num_layers, info.spec.hidden_size, info.spec.dtype) == (24, 1024, "fp16")
    assert info.log_interval == 100 and info.timing_log_option == "one-line"
    assert "batch_size" in info.arguments and "> building GPT2 datasets ..." not in str(info.arguments)
    [rec] = log.records
    assert (rec.iteration, rec.interval, rec.step_time_ms, rec.end_time) == (100, 100, 812.3, None)
    assert rec.timers["batch generator"].max_ms == 1.5
    assert log.issues == []


def test_2020_log_without_timestamps() -> None:
    log = parse_file(DATA / "old_2020_no_timestamp.log")
    lay, spec = log.job_info.layout, log.job_info.spec
    assert (lay.world_size, lay.tp, lay.pp, lay.dp, lay.num_microbatches) == (8, 2, 2, 2, 8)
    assert (spec.padded_vocab_size, spec.vocab_size, spec.dtype) == (50688, 50257, "fp16")
    assert log.job_info.framework_version is None
    first, second = log.records
    assert (first.iteration, first.interval, second.iteration, second.interval) == (100, 100, 200, 100)
    assert first.memory_mb[0]["max allocated"] == 2000.0
    assert second.grad_norm is None and second.skipped_iterations == 1
    assert second.timers["optimizer"].max_ms == 5.0 and "batch-generator" not in second.timers
    assert log.issues == []


def test_restart_appended_to_the_same_log_starts_a_new_run() -> None:
    run = [
        "> Megatron-Core version .......... 0.20.0",
        *args_block(num_layers=8, log_interval=1),
        " [2026-11-21 20:58:42.000000] iteration        1/      40 |"
        " elapsed time per iteration (ms): 500.0 |",
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    forward-backward ...............................: (1.0, 2.0)",
    ]
    restart = [
        "> Megatron-Core version .......... 0.20.0",
        *args_block(num_layers=16, log_interval=1),
        "INFO:megatron.core.timers:(min, max) time across ranks (ms):",
        "    startup-library-setup ..........................: (3.0, 4.0)",
        " [2026-11-21 21:30:00.000000] iteration        1/      40 |"
        " elapsed time per iteration (ms): 900.0 |",
    ]
    log = parse_lines(run + restart)
    assert [r.iteration for r in log.records] == [1, 1]
    assert set(log.records[0].timers) == {"forward-backward"}  # the restart's timers are not its
    assert "startup-library-setup" in log.job_info.startup_timers
    assert log.job_info.spec.num_layers == 16
    assert [r.interval for r in log.records] == [1, 1]
