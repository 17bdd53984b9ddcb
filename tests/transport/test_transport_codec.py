"""Codec round trips: absent stays absent, per-rank timers, straggler lines, columnar samples."""

from __future__ import annotations

import math
import struct
from array import array

import pytest

from perfd.core.model import Provenance, RankValue, Sample, StepRecord, StragglerLine, TimerValue
from perfd.transport.codec import (
    Command,
    command_from_pb,
    command_to_pb,
    decode_batch,
    encode_batch,
    encode_hello,
    frame_batch,
    sample_columns,
    sample_count,
)
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.series import Series, SeriesTable


def _roundtrip(*steps: StepRecord) -> list[StepRecord]:
    table = SeriesTable()
    b = encode_batch("a", 1, [], list(steps), [], table)
    wire = pb.Batch.FromString(b.SerializeToString())
    return decode_batch(wire, {}).steps


def test_full_step_record_round_trips_exactly():
    rec = StepRecord(
        job="llama", iteration=120, rank="last", end_time=1_763_700_000.123456, train_iters=1000,
        step_time_ms=631.5, logged_tflops_per_gpu=212.7, consumed_samples=7680, global_batch_size=64,
        learning_rate=2.9e-5, lm_loss=6.0123, loss_scale=1.0, grad_norm=0.0, skipped_iterations=0,
        nan_iterations=0, interval=10,
        fields={"lm loss": "6.012300E+00", "grad norm": "0.000"},
        timers={
            "forward-backward": TimerValue(min_ms=512.25, max_ms=600.5),
            "all-grads-sync": TimerValue(max_ms=3.25),  # `max` timer mode: no min
            "optimizer": TimerValue(min_ms=1.0, max_ms=2.0, per_rank={0: 1.0, 1: 2.0, 7: 1.5}),
        },
        straggler=StragglerLine(time="2025-11-21 10:00:00", line_no=42, quantities={
            "rtt": (RankValue(98.88, 0, "ms"), RankValue(144.58, 1, "ms")),
            "power": (RankValue(350.0, 3, "W"), RankValue(700.0, 0, "W")),
        }),
        memory_mb={0: {"allocated": 1024.5, "max allocated": 2048.0}, 1: {"allocated": 900.0}},
        source=Provenance("megatron", "train.log:1234"),
        disturbed_by_capture=True,
        first_of_run=True,
    )
    (back,) = _roundtrip(rec)
    assert back == rec


def test_hook_counts_travel_as_numbers_and_an_older_agents_text_still_reads():
    rec = StepRecord(job="j", iteration=3, rank=0, fields={"timing": "cuda"}, tokens_per_step=8192.0,
                     flops_per_step=55_765_855_371_264.5, source=Provenance("hook", "rank0:pid7"))
    (back,) = _roundtrip(rec)
    assert back == rec
    # An agent older than the typed fields wrote the counts as text among the raw fields.
    b = pb.Batch(agent_id="a", seq=1)
    m = b.steps.add(job="j", iteration=3, rank=0)
    m.fields.update({"timing": "cuda", "tokens_per_step": "8192", "flops_per_step": "5.576585537e+13"})
    m.source.collector, m.source.detail = "hook", "rank0:pid7"
    (old,) = decode_batch(b, {}).steps
    assert old.tokens_per_step == 8192.0 and old.flops_per_step == 5.576585537e13
    m.fields["flops_per_step"] = "nan"
    (bad,) = decode_batch(b, {}).steps
    assert bad.flops_per_step is None and bad.tokens_per_step == 8192.0


def test_absent_fields_stay_none_never_zero():
    rec = StepRecord(job="j", iteration=7, rank=0)  # rank 0 is a rank, not "unset"
    (back,) = _roundtrip(rec)
    assert back == rec
    assert back.rank == 0
    for name in ("end_time", "train_iters", "step_time_ms", "logged_tflops_per_gpu", "consumed_samples",
                 "global_batch_size", "learning_rate", "lm_loss", "loss_scale", "grad_norm",
                 "skipped_iterations", "nan_iterations", "interval", "tokens_per_step", "flops_per_step"):
        assert getattr(back, name) is None, name
    assert back.straggler is None and back.source is None
    assert back.timers == {} and back.memory_mb == {} and back.fields == {}


def test_zero_values_stay_zero_and_scopes_survive():
    recs = [StepRecord(job="j", iteration=0, rank="all", lm_loss=0.0, step_time_ms=0.0, grad_norm=0.0,
                       timers={"t": TimerValue(min_ms=0.0)}),
            StepRecord(job="j", iteration=1, rank="last", straggler=StragglerLine(time=None))]
    a, b = _roundtrip(*recs)
    assert a.rank == "all" and a.lm_loss == 0.0 and a.step_time_ms == 0.0 and a.grad_norm == 0.0
    assert a.timers["t"].min_ms == 0.0 and a.timers["t"].max_ms is None and a.timers["t"].per_rank == {}
    assert b.rank == "last"
    assert b.straggler == StragglerLine(time=None)  # present though empty: not turned into None


def test_nan_loss_survives_as_nan():
    (back,) = _roundtrip(StepRecord(job="j", iteration=1, lm_loss=float("nan")))
    assert back.lm_loss is not None and math.isnan(back.lm_loss)


def test_unknown_rank_scope_is_a_decode_error():
    b = pb.Batch(agent_id="a", seq=1)
    b.steps.add(job="j", iteration=1, scope="some")
    with pytest.raises(ValueError):
        decode_batch(b, {})


def test_samples_are_columnar_and_series_defined_once():
    table = SeriesTable()
    t0 = 1_763_700_000.0
    s1 = [Sample("gpu_power_watts", 300.0 + i, t0 + i, {"gpu": str(i % 2), "node": "n1"}) for i in range(4)]
    b1 = encode_batch("a", 1, s1, [], [], table)
    assert [d.id for d in b1.series] == [0, 1]
    assert list(sample_columns(b1)[0]) == [0, 1, 0, 1]
    # Label order does not matter; a known series is not redefined in the next batch.
    b2 = encode_batch("a", 2, [Sample("gpu_power_watts", 1.0, t0, {"node": "n1", "gpu": "1"}),
                               Sample("host_cpu_ratio", 0.5, t0)], [], [], table)
    assert [d.id for d in b2.series] == [2]
    assert list(sample_columns(b2)[0]) == [1, 2]

    series: dict[int, Series] = {}
    d1 = decode_batch(pb.Batch.FromString(b1.SerializeToString()), series)
    d2 = decode_batch(pb.Batch.FromString(b2.SerializeToString()), series)
    assert d1.n_samples == 4 and d2.new_series == [2]
    assert list(d1.values) == [300.0, 301.0, 302.0, 303.0]
    assert list(d1.timestamps_ns) == [int((t0 + i) * 1e9) for i in range(4)]
    names = [(series[i].name, series[i].labels) for i in d2.series_ids]
    # Labels arrive in the one canonical form: sorted (name, value) pairs.
    assert names == [("gpu_power_watts", (("gpu", "1"), ("node", "n1"))), ("host_cpu_ratio", ())]
    # No Python object per sample on the receiving side: arrays made with one copy each.
    assert isinstance(d1.values, array) and isinstance(d1.series_ids, array)


def test_samples_travel_as_little_endian_arrays_and_the_older_packed_form_still_decodes():
    """The wire form is fixed: uint32 ids, int64 ns, float64 values, little-endian, in bytes fields.
    A batch an older agent spooled in the packed repeated fields decodes to the same columns; a
    batch with both forms, or a column not a whole number of values, is refused."""
    table = SeriesTable()
    sid = table.id_for("m", {"gpu": "0"})
    b = encode_batch("a", 1, [], [], [], table, columns=([sid, sid], [10, -20], [1.5, 2.5]))
    assert b.series_ids_le == struct.pack("<2I", 0, 0)
    assert b.timestamps_ns_le == struct.pack("<2q", 10, -20)
    assert b.values_le == struct.pack("<2d", 1.5, 2.5)
    assert not b.series_ids and not b.values and sample_count(b) == 2
    old = pb.Batch(agent_id="a", seq=1)  # what an agent before the array form spooled
    old.series.extend(table.definitions())
    old.series_ids.extend([sid, sid])
    old.timestamps_ns.extend([10, -20])
    old.values.extend([1.5, 2.5])
    assert sample_count(old) == 2
    new, was = decode_batch(b, {}), decode_batch(old, {})
    assert [list(c) for c in (new.series_ids, new.timestamps_ns, new.values)] == \
        [list(c) for c in (was.series_ids, was.timestamps_ns, was.values)] == [[0, 0], [10, -20], [1.5, 2.5]]
    both = pb.Batch()
    both.CopyFrom(b)
    both.values.append(1.0)
    with pytest.raises(ValueError, match="both"):
        decode_batch(both, {})
    torn = pb.Batch()
    torn.CopyFrom(b)
    torn.values_le = b.values_le[:-1]
    with pytest.raises(ValueError, match="whole number"):
        decode_batch(torn, {})
    short = pb.Batch()
    short.CopyFrom(b)
    short.timestamps_ns_le = b.timestamps_ns_le[:8]
    with pytest.raises(ValueError, match="differ in length"):
        decode_batch(short, {})


def test_columns_path_matches_sample_path():
    table = SeriesTable()
    sid = table.id_for("m", {"gpu": "0"})
    b = encode_batch("a", 1, [], [], [], table, columns=([sid, sid], [10, 20], [1.5, 2.5]))
    assert [d.name for d in b.series] == ["m"]
    assert [list(c) for c in sample_columns(b)] == [[0, 0], [10, 20], [1.5, 2.5]]
    with pytest.raises(ValueError):
        encode_batch("a", 2, [], [], [], table, columns=([sid], [1, 2], [1.0]))


def test_decode_rejects_columns_of_different_lengths():
    b = pb.Batch(agent_id="a", seq=1, series_ids=[0, 0], timestamps_ns=[1, 2], values=[1.0])
    with pytest.raises(ValueError):
        decode_batch(b, {})


def test_events_and_job_info_round_trip():
    table = SeriesTable()
    ev = {"time": 1_763_700_000.5, "kind": "capture_started", "severity": "info", "text": "nsys on ranks 0-1",
          "labels": {"tool": "nsys"}, "job": "llama", "links": {"capture_id": "c1", "steps": "100-103"}}
    b = encode_batch("a", 1, [], [], [ev, {"time_ns": 5, "kind": "xid"}], table,
                     job_info_json={"llama": '{"framework": "megatron"}'})
    d = decode_batch(pb.Batch.FromString(b.SerializeToString()), {})
    e0, e1 = d.events
    assert e0["time_ns"] == 1_763_700_000_500_000_000 and e0["kind"] == "capture_started"
    assert e0["labels"] == {"tool": "nsys"} and e0["links"]["capture_id"] == "c1" and e0["job"] == "llama"
    assert e1["time_ns"] == 5 and e1["severity"] == "info"
    assert e0["payload"] is None and e1["payload"] is None
    assert d.job_info_json == {"llama": '{"framework": "megatron"}'}


def test_event_payload_survives_the_wire():
    """The NVML collector's process lists travel as an event payload: it must not be dropped."""
    procs = [{"pid": 42, "name": "python", "cmdline": "python train.py", "used_memory_bytes": 1 << 30,
              "rank": 3, "local_rank": 1}]
    ev = {"time": 1.0, "kind": "gpu_processes", "labels": {"gpu": "1"}, "payload": procs}
    b = encode_batch("a", 1, [], [], [ev], SeriesTable())
    (e,) = decode_batch(pb.Batch.FromString(b.SerializeToString()), {}).events
    assert e["payload"] == procs


def test_frame_batch_is_a_serialized_agent_message():
    for n in (0, 1, 127, 128, 5000, 300_000):
        b = pb.Batch(agent_id="a", seq=9, values=[1.0] * n, series_ids=[0] * n, timestamps_ns=[1] * n)
        raw = b.SerializeToString()
        assert frame_batch(raw) == pb.AgentMessage(batch=b).SerializeToString()
        assert pb.AgentMessage.FromString(frame_batch(raw)).batch == b


def test_hello_carries_the_whole_table_and_commands_round_trip():
    table = SeriesTable()
    table.id_for("a", {"x": "1"})
    table.id_for("b")
    h = encode_hello("agent", "node1", "0.1.0", ["job"], {"gpm": "1"}, "epoch1", table)
    assert [(d.id, d.name, dict(d.labels)) for d in h.hello.series] == [(0, "a", {"x": "1"}), (1, "b", {})]
    cmd = Command(kind="capture", job="llama", ranks=(0, 3), args={"tool": "kineto", "iterations": "3"},
                  id="c1")
    assert command_from_pb(pb.Command.FromString(command_to_pb(cmd).SerializeToString())) == cmd


def test_series_table_journal_survives_restart_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "series.jsonl"
    t1 = SeriesTable(path)
    assert t1.id_for("m", {"gpu": "0"}) == 0
    assert t1.id_for("m", {"gpu": "1"}) == 1
    with path.open("a") as f:
        f.write('{"id": 2, "name": "torn')  # the agent died mid-line
    t2 = SeriesTable(path)
    assert t2.journal_errors == 1 and len(t2) == 2
    assert t2.id_for("m", {"gpu": "1"}) == 1  # same id as before the restart
    assert t2.series(0) == Series("m", (("gpu", "0"),))
    t2.id_for("m", {"gpu": "2"})  # appended after the repaired journal, readable next time
    t3 = SeriesTable(path)
    assert t3.journal_errors == 0 and len(t3) == 3 and t3.series(2) == Series("m", (("gpu", "2"),))
