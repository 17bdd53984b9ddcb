"""Steps of different sizes and the model's shape: ``step_end(tokens=,
flops=, seq_len=)`` puts each step's own work on the wire, ``model=`` derives what its other fields
define (kv_channels, the vocabulary), and a value the hook cannot read without a device sync is
refused and counted, never guessed. A real CPU torch loop over variable-length batches, its truth
from the loop's own counts."""

from __future__ import annotations

import functools
import math
import random
import socket
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.steps.flops import (
    complete_spec,
    flops_for_tokens,
    megatron_flops,
    read_spec,
    token_flops,
)
from perfd.core.model import ModelSpec
from perfd.hook import StepHook, wire

Hook = functools.partial(StepHook, flush_interval_s=0, cuda=False, rank=0, warmup_steps=0)
GPT = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256,
       "vocab_size": 1000}


def _steps(sock: socket.socket) -> list[wire.StepMsg]:
    out: list[wire.StepMsg] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return out
        recs, problem = wire.split_records(data)
        assert problem is None
        out += [wire.unpack_step(d) for k, d in recs if k in wire.STEP_KINDS]


def test_the_model_spec_derives_what_its_fields_define() -> None:
    spec = complete_spec(GPT)
    assert spec.kv_channels == 16 and spec.padded_vocab_size == 1000  # 64 ÷ 4; no padding
    named = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 128}
    hf = complete_spec(named)
    # The context limit is not the steps' sequence length (the attention term grows with it): noted.
    assert (hf.num_layers, hf.num_query_groups, hf.ffn_hidden_size, hf.seq_length) == (2, 2, 256, None)
    assert any("context limit" in n for n in read_spec(named).notes)
    # Stated fields are kept as stated (a head size other than hidden ÷ heads is the model's own).
    assert complete_spec({**GPT, "kv_channels": 32}).kv_channels == 32
    # No MLP width: Megatron's default (4·h; with swiglu 2/3 of it, a multiple of 64), said in the notes.
    no_ffn = {k: v for k, v in GPT.items() if k != "ffn_hidden_size"}
    assert complete_spec(no_ffn).ffn_hidden_size == 4 * 64
    assert any(n.startswith("ffn_hidden_size not given: 256 assumed") for n in read_spec(no_ffn).notes)
    assert complete_spec({**no_ffn, "hidden_size": 4096, "swiglu": True}).ffn_hidden_size == 10880
    with pytest.raises(ValueError, match="kv_channels = hidden_size"):  # 64 ÷ 3 is no head size
        token_flops({**GPT, "num_attention_heads": 3})
    with pytest.raises(ValueError, match="unknown field"):
        complete_spec({"layers": 2})
    # Per token and per position: the formula at any (tokens, seq) equals Megatron's at gbs = tokens ÷ seq.
    tf = token_flops(GPT)
    for seq in (128, 512, 2048):
        full = megatron_flops(dataclasses_replace(spec, seq), 8, None, "pytorch").flops_per_iteration
        assert tf.flops(8 * seq, seq) == pytest.approx(full, rel=1e-12)
        assert flops_for_tokens(GPT, 8 * seq, seq) == pytest.approx(full, rel=1e-12)


def dataclasses_replace(spec: ModelSpec, seq: int) -> ModelSpec:
    import dataclasses

    return dataclasses.replace(spec, seq_length=seq)


def test_a_hook_with_model_and_no_kv_channels_constructs(tmp_path: Path) -> None:
    """The issue's report: StepHook(model=dict(num_layers, hidden_size, num_attention_heads, ...))
    raised "missing kv_channels"."""
    h = StepHook(str(tmp_path / "none.sock"), tokens_per_step=4 * 512, model={**GPT, "seq_length": 512},
                 enabled=False)
    assert h.flops_per_step == pytest.approx(flops_for_tokens(GPT, 4 * 512, 512))


@pytest.mark.slow
def test_variable_length_steps_carry_their_own_work(agent: tuple[str, socket.socket]) -> None:
    torch = pytest.importorskip("torch")
    path, sock = agent
    hook = Hook(path, model=GPT)  # no seq_length: each step says its own
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256, batch_first=True)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    rng = random.Random(44)
    truth: list[tuple[int, int]] = []  # (tokens, seq) as the loop drew them
    got: list[wire.StepMsg] = []
    for _ in range(30):
        seq = rng.choice((16, 32, 64))
        hook.step_begin()
        x = torch.randn(4, seq, 64)
        hook.data_ready()
        layer(x).sum().backward()
        opt.step()
        opt.zero_grad()
        hook.step_end(tokens=4 * seq, seq_len=seq)
        truth.append((4 * seq, seq))
        got += _steps(sock)
    hook.close()
    got += _steps(sock)
    assert len(got) == 30 and hook.counters()["step_arg_errors"] == 0
    tf = token_flops(GPT)
    for m, (tokens, seq) in zip(got, truth, strict=True):
        assert m.tokens_per_step == tokens
        assert m.flops_per_step == pytest.approx(tf.flops(tokens, seq), rel=1e-12)
    # MFU over the run is FLOPs summed over time summed: against a median step with mean tokens (what a
    # constant tokens_per_step gives) it differs whenever sizes differ, which is the 12%.
    total = sum(tf.flops(t, s) for t, s in truth)
    assert sum(m.flops_per_step or 0.0 for m in got) == pytest.approx(total, rel=1e-12)


@pytest.mark.slow
def test_stated_flops_win_and_bad_values_are_refused_not_guessed(agent: tuple[str, socket.socket]) -> None:
    torch = pytest.importorskip("torch")
    path, sock = agent
    hook2 = Hook(path, tokens_per_step=100.0, flops_per_step=1e9)
    cases: list[dict[str, Any]] = [{"tokens": 50, "flops": 7e8}, {"tokens": 50}, {"tokens": torch.tensor(50)},
                                   {"flops": -1.0}, {}, {"tokens": True}, {"seq_len": math.nan}]
    for kw in cases:
        hook2.step_begin()
        hook2.step_end(**kw)
    hook2.close()
    got = [(m.tokens_per_step, m.flops_per_step) for m in _steps(sock)]
    assert got == [(50.0, 7e8),  # its own
                   (50.0, 5e8),  # scaled from the defaults (FLOPs linear in tokens at one length)
                   (None, None),  # a tensor: refused (reading it syncs the device), absent
                   (100.0, None),  # a negative FLOPs count: refused, absent
                   (100.0, 1e9),  # nothing said: the defaults
                   (None, None),  # a bool is no count
                   (100.0, None)]  # a NaN length: no FLOPs
    c = hook2.counters()
    assert c["step_arg_errors"] == 4 and c["internal_errors"] == 0
    assert "seq_len=float" in (c["last_error"] or "")


def test_the_readmes_model_without_ffn_counts_as_megatron_does(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A GPT-2 script handed the README's model= (no ffn_hidden_size) died at start-up with "cannot
    count FLOPs per step: missing ffn_hidden_size": now its FLOPs are those of ffn = 4·hidden, and
    what was assumed is said once, at construction."""
    gpt2 = {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "seq_length": 1024,
            "vocab_size": 50304}
    with caplog.at_level("WARNING", logger="perfd.hook"):
        h = StepHook(str(tmp_path / "none.sock"), tokens_per_step=64 * 1024, model=gpt2, enabled=False)
    as_4h = flops_for_tokens({**gpt2, "ffn_hidden_size": 4 * 768}, 64 * 1024)
    assert h.flops_per_step == pytest.approx(as_4h)
    said = [r.getMessage() for r in caplog.records]
    assert any("ffn_hidden_size not given: 3072 assumed (4·hidden_size, Megatron's default)" in m
               for m in said)
    assert any("kv_channels not given: 64 assumed" in m for m in said)
    assert h.argument_problems == ()


@pytest.mark.parametrize("kwargs", [
    {"model": {"num_layers": 2}},  # nothing to count with
    {"model": {"layers": 2, "hidden_size": 64}},  # a typo
    {"model": {**GPT, "num_attention_heads": 3, "seq_length": 64}},  # no head size
    {"model": {**GPT, "hidden_size": "64", "seq_length": 64}},  # a string for a size
    {"model": "gpt2"},  # not a mapping
    {"model": {**GPT, "seq_length": 64}, "tokens_per_step": float("nan")},
    {"tokens_per_step": -1, "flops_per_step": "1e12"},
    {"flops_per_step": float("inf")},
    {"layout": {"tp": 0, "dq": 2}},
    {"layout": [("tp", 2)]},
    {"pool_size": 0, "window": 0, "harvest_interval_s": -1, "warmup_steps": "5"},
])
def test_no_argument_raises_in_the_users_script(tmp_path: Path, kwargs: dict[str, Any],
                                                caplog: pytest.LogCaptureFixture) -> None:
    """What the hook cannot use is said (a warning) and left absent; the hook is made and steps."""
    with caplog.at_level("WARNING", logger="perfd.hook"):
        h = Hook(str(tmp_path / "none.sock"), **kwargs)
    assert any(r.levelname == "WARNING" and r.getMessage().startswith("perfd step hook: ")
               for r in caplog.records), "nothing was said"
    if "flops_per_step" in kwargs or "model" in kwargs:
        assert h.flops_per_step is None  # MFU absent, never a guess
    for _ in range(3):
        with h.step():
            pass
    assert h.counters()["steps_reported"] + h.counters()["harvest_drops"] <= 3
    h.close()
