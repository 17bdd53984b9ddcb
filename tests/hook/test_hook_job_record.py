"""The hook's job record (wire.KIND_JOB): world size, parallel sizes, dtype -> a JobInfo; merged with
a framework log's JobInfo without losing either."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from perfd.collectors.hook import HookCollector
from perfd.core.model import JobInfo, ModelSpec, ParallelLayout, merge_job_info
from perfd.hook import StepHook, wire
from perfd.hook.jobinfo import job_msg, mesh_sizes
from perfd.hook.sender import DatagramSender


def test_job_record_round_trip() -> None:
    m = wire.JobMsg(3, 1234, world_size=8, tp=2, pp=None, dp=4, dtype="bf16")
    data = wire.pack_job(m)
    assert len(data) == wire.JOB.size and wire.kind_of(data) == wire.KIND_JOB
    assert wire.unpack_job(data) == m
    records, problem = wire.split_records(data + wire.pack_step(wire.StepMsg(3, 1234, 1, 0, 5)))
    assert problem is None and [k for k, _ in records] == [wire.KIND_JOB, wire.KIND_STEP2]


def test_mesh_and_named_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan-style mesh names; HSDP's replicate x shard is DP; named sizes win."""
    mesh = SimpleNamespace(mesh_dim_names=("dp_replicate", "dp_shard", "tp"),
                           mesh=SimpleNamespace(shape=(2, 4, 2)))
    assert mesh_sizes(mesh) == {"dp": 8, "tp": 2, "world_size": 16}
    assert mesh_sizes(object()) == {}
    monkeypatch.setenv("WORLD_SIZE", "4")
    m = job_msg(0, 1, "bf16", {"tp": 4}, mesh)
    assert (m.world_size, m.tp, m.dp, m.pp) == (16, 4, 8, None)
    m = job_msg(0, 1, None, {}, None)
    assert (m.world_size, m.tp) == (4, None)  # $WORLD_SIZE, nothing else assumed


def test_collector_turns_job_records_into_one_job_info(tmp_path: Path) -> None:
    c = HookCollector({"socket_path": str(tmp_path / "h.sock"), "job": "j"})
    c.start()
    try:
        hooks = [StepHook(str(tmp_path / "h.sock"), cuda=False, rank=r, flush_interval_s=0, dtype="bf16",
                          layout={"world_size": 2, "dp": 2}) for r in (0, 1)]
        for h in hooks:
            with h.step():
                h.data_ready()
            h.close()
        infos: list[JobInfo] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and c.counts.get("job_records", 0) < 2:
            infos += c.collect(time.time()).job_info.values()
            time.sleep(0.01)
        assert c.counts.get("job_records") == 2
        assert len(infos) == 1  # the second rank said the same: not sent again
        (info,) = infos
        assert info.framework == "pytorch" and info.spec.dtype == "bf16"
        assert (info.layout.world_size, info.layout.dp, info.layout.tp) == (2, 2, None)
        # A bad size is counted and left out, never stored (a datagram of this very process: its
        # sender check passes).
        DatagramSender(str(tmp_path / "h.sock")).send(
            wire.pack_job(wire.JobMsg(0, os.getpid(), world_size=0, dtype="int3")))
        got: list[JobInfo] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and c.errors.get("malformed:unknown_dtype") is None:
            got += c.collect(time.time()).job_info.values()
            time.sleep(0.01)
        assert c.errors.get("malformed:layout_out_of_bounds") == 1
        assert c.errors.get("malformed:unknown_dtype") == 1 and not got
    finally:
        c.stop()


def test_a_logs_job_info_keeps_its_own_and_takes_what_the_hooks_add() -> None:
    meg = JobInfo(framework="megatron", framework_version="0.20.0",
                  layout=ParallelLayout(world_size=8, tp=2, pp=2, dp=2), spec=ModelSpec(num_layers=8))
    hook = JobInfo(framework="pytorch", layout=ParallelLayout(world_size=4, cp=1),
                   spec=ModelSpec(dtype="bf16"))
    for merged in (merge_job_info(meg, hook), merge_job_info(hook, meg)):  # either arrival order
        assert merged.framework == "megatron" and merged.framework_version == "0.20.0"
        assert (merged.layout.world_size, merged.layout.tp, merged.layout.cp) == (8, 2, 1)
        assert merged.spec.num_layers == 8 and merged.spec.dtype == "bf16"
    newer = JobInfo(framework="pytorch", layout=ParallelLayout(world_size=2))
    assert merge_job_info(hook, newer) is newer  # the same describer replaces its own
    assert merge_job_info(None, hook) is hook


def test_a_trainers_hooks_are_still_the_hooks_beside_a_log() -> None:
    """A hook a trainer's callback drives describes the job as a plain hook does: a log's JobInfo keeps
    its own framework beside it, and a plain hook's word (an older hook, another node's) does not take
    the trainer's name away."""
    meg = JobInfo(framework="megatron", layout=ParallelLayout(world_size=8))
    hf = JobInfo(framework="hf_trainer", framework_version="5.17.0",
                 layout=ParallelLayout(world_size=8, cp=1), spec=ModelSpec(dtype="bf16"))
    for merged in (merge_job_info(meg, hf), merge_job_info(hf, meg)):
        assert merged.framework == "megatron" and merged.layout.cp == 1 and merged.spec.dtype == "bf16"
    plain = JobInfo(framework="pytorch", layout=ParallelLayout(world_size=4))
    kept = merge_job_info(hf, plain)
    assert (kept.framework, kept.framework_version, kept.layout.world_size) == ("hf_trainer", "5.17.0", 4)
    lit = JobInfo(framework="lightning")
    assert merge_job_info(plain, lit) is lit and merge_job_info(hf, lit) is lit


def test_the_collector_takes_a_known_trainer_and_counts_anything_else(tmp_path: Path) -> None:
    from perfd.collectors.collector import Collected

    c = HookCollector({"socket_path": str(tmp_path / "h.sock"), "job": "j"})
    out = Collected()
    c._trainer(wire.FrameworkMsg(0, 100, 99, "1.0"), out)  # a code this agent does not know
    c._trainer(wire.FrameworkMsg(0, 100, wire.FRAMEWORK_LIGHTNING, "2.6\n0"), out)  # not printable
    assert c.errors.get("malformed:framework") == 2 and not out.job_info
    c._trainer(wire.FrameworkMsg(0, 100, wire.FRAMEWORK_LIGHTNING, "2.6.0"), out)
    info = out.job_info["j"]
    assert (info.framework, info.framework_version) == ("lightning", "2.6.0")
    data = wire.pack_framework(wire.FrameworkMsg(3, 7, wire.FRAMEWORK_HF_TRAINER, "5" * 40))
    assert len(data) == wire.FRAMEWORK.size and wire.kind_of(data) == wire.KIND_FRAMEWORK
    assert wire.unpack_framework(data).version == "5" * wire.FRAMEWORK_VERSION_BYTES  # a longer one cut


def test_model_record_round_trip_and_bounds() -> None:
    """The model the hook counts with goes whole (a size the record cannot hold goes absent), after the
    step records of its datagram; the collector takes what perfd.core.bounds admits into the job's spec."""
    from perfd.analytics.steps.flops import read_spec
    from perfd.collectors.hook.model_record import take_model

    spec = read_spec({"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "seq_length": 1024,
                      "vocab_size": 50304}).spec
    m = wire.model_msg(2, 77, dataclasses.replace(spec, moe_layer_freq=[1, 0], parameter_count=124_000_000))
    data = wire.pack_model(m)
    assert len(data) == wire.MODEL.size and wire.kind_of(data) == wire.KIND_MODEL
    back = wire.unpack_model(data)
    assert back == m and back.sizes["moe_layer_freq"] is None  # a list: not in the record
    records, problem = wire.split_records(wire.pack_step(wire.StepMsg(2, 77, 1, 0, 5)) + data)
    assert problem is None and [k for k, _ in records] == [wire.KIND_STEP2, wire.KIND_MODEL]
    got = ModelSpec(dtype="bf16")
    assert take_model(got, back) == []
    assert (got.num_layers, got.ffn_hidden_size, got.kv_channels, got.padded_vocab_size, got.seq_length,
            got.parameter_count, got.dtype) == (12, 3072, 64, 50304, 1024, 124_000_000, "bf16")
    bad = wire.unpack_model(wire.pack_model(wire.ModelMsg(0, 1, {"num_layers": 20_000, "hidden_size": 64})))
    held = ModelSpec()
    assert take_model(held, bad) == ["num_layers=20000"] and (held.num_layers, held.hidden_size) == (None, 64)


def test_collector_takes_the_hooks_model_into_the_job_spec(tmp_path: Path) -> None:
    """StepHook(model=...) -> the agent's JobInfo.spec: what the analysis divides the hook's stated FLOPs
    by (the linear layers' GEMMs apart from core attention)."""
    c = HookCollector({"socket_path": str(tmp_path / "h.sock"), "job": "j"})
    c.start()
    try:
        h = StepHook(str(tmp_path / "h.sock"), cuda=False, rank=0, flush_interval_s=0, dtype="bf16",
                     tokens_per_step=65536, model={"num_layers": 12, "hidden_size": 768,
                                                   "num_attention_heads": 12, "seq_length": 1024,
                                                   "vocab_size": 50304})
        with h.step():
            h.data_ready()
        h.close()
        infos: list[JobInfo] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and c.counts.get("model_records", 0) < 1:
            infos += c.collect(time.time()).job_info.values()
            time.sleep(0.01)
        assert c.counts.get("model_records") == 1 and infos
        spec = infos[-1].spec
        assert (spec.num_layers, spec.hidden_size, spec.ffn_hidden_size, spec.seq_length, spec.dtype) == \
            (12, 768, 3072, 1024, "bf16")
    finally:
        c.stop()
