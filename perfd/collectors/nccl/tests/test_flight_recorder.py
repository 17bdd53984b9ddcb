"""Restricted unpickling, entry parsing, dedupe across dumps and hang detection (synthetic dumps)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.nccl.flight_recorder import (
    DumpError,
    FlightRecorderTracker,
    canonical_op,
    load_dump_bytes,
    parse_dump,
    parse_ranks,
)
from perfd.collectors.nccl.hangs import detect_hangs
from perfd.collectors.nccl.tests.synth import T0, dump, entry, pickled

# ---------------------------------------------------------------------------- unpickler


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_containers_load_at_every_protocol(protocol: int) -> None:
    obj = {"version": "2.10", "entries": [{"a": (1, "x"), "s": {1, 2}, "f": frozenset({3}),
                                           "n": None, "b": True, "x": 1.5, "big": 2**70}]}
    assert load_dump_bytes(pickle.dumps(obj, protocol=protocol)) == obj


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_os_system_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps({"version": "2.10", "entries": [_Evil(marker)]}, protocol=2)
    assert b"system" in data  # the pickle really references os.system (posix.system)
    with pytest.raises(DumpError) as info:
        load_dump_bytes(data)
    assert info.value.reason == "refused_global"
    assert "system" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("global_ref", [
    b"cbuiltins\neval\n", b"c__builtin__\neval\n", b"cbuiltins\ngetattr\n", b"csubprocess\nPopen\n",
    b"ccopyreg\n_reconstructor\n", b"ctorch.jit._pickle\nbuild_intlist\n", b"cposix\nsystem\n",
])
def test_every_other_global_is_refused(global_ref: bytes) -> None:
    data = b"\x80\x02" + global_ref + b"X\x02\x00\x00\x00hi\x85R."  # GLOBAL, arg tuple, REDUCE
    with pytest.raises(DumpError) as info:
        load_dump_bytes(data)
    assert info.value.reason == "refused_global"


def test_persistent_ids_are_refused() -> None:
    with pytest.raises(DumpError) as info:
        load_dump_bytes(b"\x80\x02X\x01\x00\x00\x00aQ.")  # BINPERSID
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("cut", [1, 10, 100, -1])
def test_truncated_dump_is_reported_as_truncated(cut: int) -> None:
    data = pickled(dump([entry(i) for i in range(5)]))
    with pytest.raises(DumpError) as info:
        load_dump_bytes(data[:cut])
    assert info.value.reason in ("truncated", "malformed")  # retried by DumpReader either way


def test_non_dict_and_empty_and_oversized() -> None:
    with pytest.raises(DumpError, match="not_a_dict"):
        load_dump_bytes(pickle.dumps([1, 2]))
    with pytest.raises(DumpError, match="truncated"):
        load_dump_bytes(b"")


# ---------------------------------------------------------------------------- parsing


def test_bytes_dtype_ranks_and_absent_duration() -> None:
    d = parse_dump(dump([
        entry(1, sizes=[[1000]], dtypes=["Float"]),
        entry(2, sizes=[[4, 8], [16]], dtypes=["BFloat16", "BFloat16"]),
        entry(3, op="nccl:_allgather_base", sizes=[[10]], out_sizes=[[20]], dtypes=["Float8_e4m3fn"]),
        entry(4, sizes=[[3]], dtypes=["Long"]),
        entry(5, sizes=[[3]], dtypes=["Float", "Half"]),  # mismatch: counted, bytes unknown
        entry(6, sizes=[[3]], dtypes=["NewType"]),
    ]), rank=1, job="j")
    recs = [e.record for e in d.entries]
    assert [r.bytes for r in recs] == [4000, 96, 20, 24, None, None]
    assert recs[1].dtype == "BFloat16" and recs[2].op == "all_gather"
    assert d.issues == {"sizes_dtypes_mismatch": 2, "unknown_dtype": 2}
    r = recs[0]
    assert r.duration_ms is None and r.algbw_gbs is None  # timing off: absent, not 0
    assert r.pg_ranks == [0, 1] and r.group_rank == 1 and r.group_size == 2 and r.rank == 1
    assert r.pg_name == "0" and r.pg_desc == "default_pg" and r.source == "flight_recorder"
    assert r.collective_seq_id == 1 and r.state == "completed" and r.time_created_ns == T0 + 1_000_000
    assert d.entries[0].user_frame == "/job/train.py:42 in train_step"


def test_duration_gives_bandwidth() -> None:
    # 256 MiB fp32 all-reduce in 0.93 ms on 2 ranks: ~289 GB/s algbw, factor 2(n-1)/n = 1.
    d = parse_dump(dump([entry(1, sizes=[[64 * 1024 * 1024]], duration_ms=0.93)]), rank=0, job="j")
    r = d.entries[0].record
    assert r.duration_ms == 0.93
    assert r.algbw_gbs == pytest.approx(268435456 / 0.93e-3 / 1e9)
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs)


def test_p2p_names_and_peers() -> None:
    assert canonical_op("nccl:send 0->1") == ("send", 0, 1)
    assert canonical_op("nccl:recv 1<-0") == ("recv", 1, 0)
    assert canonical_op("nccl:reduce_scatter_tensor_coalesced") == ("reduce_scatter", None, None)
    assert canonical_op("gloo:all_reduce") == ("all_reduce", None, None)
    assert canonical_op("nccl:something_new") == ("something_new", None, None)
    for name, op in (("nccl:_all_gather_base", "all_gather"), ("nccl:_allgather_base", "all_gather"),
                     ("nccl:all_gather_into_tensor_coalesced", "all_gather"),
                     ("nccl:allreduce_coalesced", "all_reduce"),
                     ("nccl:_reduce_scatter_base", "reduce_scatter"),
                     ("nccl:alltoall_base", "all_to_all"), ("nccl:all_reduce_barrier", "barrier"),
                     ("nccl:reduce", "reduce"), ("nccl:coalesced", "coalesced")):
        assert canonical_op(name)[0] == op, name
    d = parse_dump(dump([entry(7, op="nccl:send 1->0", is_p2p=True, p2p_seq=3)]), rank=1, job="j")
    r = d.entries[0].record
    assert r.is_p2p and r.op == "send" and r.peer == 0 and r.p2p_seq_id == 3


def test_ranks_text_forms() -> None:
    assert parse_ranks("[0, 1, 2]") == [0, 1, 2]
    assert parse_ranks("[]") is None
    assert parse_ranks([3, 4]) == [3, 4]
    assert parse_ranks("[0, x]") is None
    assert parse_ranks(None) is None


def test_bad_entries_are_counted_not_fatal() -> None:
    raw = dump([entry(1), "junk", {"pg_id": 0}, entry(2)])  # type: ignore[list-item]
    raw["pg_config"]["9"] = "bad"
    d = parse_dump(raw, rank=0, job="j")
    assert [e.record.collective_seq_id for e in d.entries] == [1, 2]
    assert d.issues == {"entry_not_a_dict": 1, "entry_missing_pg_or_name": 1, "bad_pg_config": 1}
    assert parse_dump({"version": 1}, rank=0, job="j").issues == {"no_entries_list": 1}


# ---------------------------------------------------------------------------- dedupe


def _p(entries: list[dict[str, Any]], rank: int = 0) -> Any:
    return parse_dump(dump(entries), rank=rank, job="j")


def test_dedupe_across_dumps_and_state_updates() -> None:
    t = FlightRecorderTracker("j")
    first = t.update(_p([entry(1), entry(2), entry(3, state="started", retired=False, duration_ms=None)]))
    assert [r.collective_seq_id for r in first] == [1, 2]
    # Next dump: 1-2 again (already emitted), 3 now completed with timing, 4 scheduled.
    second = t.update(_p([entry(1), entry(2), entry(3, state="completed", retired=False, duration_ms=1.5),
                          entry(4, state="scheduled", retired=False)]))
    assert [(r.collective_seq_id, r.state, r.duration_ms) for r in second] == [(3, "completed", 1.5)]
    assert t.counts["state_updates"] == 1
    third = t.update(_p([entry(2), entry(3), entry(4)]))
    assert [r.collective_seq_id for r in third] == [4]
    assert t.counts["records"] == 4


def test_timing_off_completed_is_emitted_on_second_sighting_or_when_retired() -> None:
    t = FlightRecorderTracker("j")
    assert t.update(_p([entry(1, retired=False)])) == []  # completed, no duration: wait one dump
    assert [r.collective_seq_id for r in t.update(_p([entry(1, retired=False)]))] == [1]
    assert [r.collective_seq_id for r in t.update(_p([entry(2, retired=True)]))] == [2]


def test_collective_and_p2p_keys_are_separate() -> None:
    t = FlightRecorderTracker("j")
    out = t.update(_p([entry(5), entry(5, op="nccl:send 0->1", is_p2p=True, p2p_seq=5),
                       entry(5, pg_id=1, pg_name="1")]))
    assert len(out) == 3


def test_ring_gap_and_restart_and_pending_that_left_the_ring() -> None:
    t = FlightRecorderTracker("j")
    t.update(_p([entry(1), entry(2), entry(3, state="scheduled", retired=False)]))
    out = t.update(_p([entry(10), entry(11)]))  # 4..9 never seen; 3 left the ring unfinished
    assert t.counts["entries_lost_between_dumps"] == 6
    assert t.counts["pending_left_ring"] == 1
    assert sorted(r.collective_seq_id or 0 for r in out) == [3, 10, 11]
    out = t.update(_p([entry(1), entry(2)]))  # a new process: sequence numbers restarted
    assert t.counts["rank_restarted"] == 1
    assert [r.collective_seq_id for r in out] == [1, 2]


def test_flush_emits_completed_pending() -> None:
    t = FlightRecorderTracker("j")
    t.update(_p([entry(1, retired=False), entry(2, state="scheduled", retired=False)]))
    assert [r.collective_seq_id for r in t.flush()] == [1]


# ---------------------------------------------------------------------------- hangs

NOW = T0 + 10**12  # ~1000 s after the entries were created


def _hang_dumps() -> dict[int, Any]:
    # Rank 0 enqueued all_reduce #8 long ago and waits; rank 1 is still at #7 (it sleeps before #8).
    r0 = [entry(i) for i in range(1, 8)] + [entry(8, state="scheduled", retired=False, created_ns=T0)]
    r1 = [entry(i) for i in range(1, 8)]
    return {0: parse_dump(dump(r0), 0, "j"), 1: parse_dump(dump(r1), 1, "j")}


def test_hang_names_the_rank_that_did_not_join() -> None:
    hangs = detect_hangs(_hang_dumps(), NOW, threshold_s=60)
    assert len(hangs) == 1
    h = hangs[0]
    assert (h.op, h.seq, h.pg_name, h.stuck_ranks, h.missing_ranks) == ("all_reduce", 8, "0", [0], [1])
    assert h.last_seq_by_rank == {0: 8, 1: 7}
    assert h.age_s == pytest.approx(1000, rel=1e-6)
    assert "rank(s) 1 never reached it" in h.text() and "/job/train.py:42" in h.text()


def test_no_hang_below_threshold_or_when_finished() -> None:
    assert detect_hangs(_hang_dumps(), T0 + 10**9, threshold_s=60) == []
    done = {0: parse_dump(dump([entry(8, created_ns=T0)]), 0, "j")}
    assert detect_hangs(done, NOW, threshold_s=60) == []


def test_every_rank_reached_it_and_unknown_members() -> None:
    r = [entry(i) for i in range(1, 4)] + [entry(4, state="started", retired=False, created_ns=T0)]
    dumps = {0: parse_dump(dump(r, ranks="[0, 1, 2, 3]"), 0, "j"),
             1: parse_dump(dump(r, ranks="[0, 1, 2, 3]"), 1, "j")}
    (h,) = detect_hangs(dumps, NOW, threshold_s=60)
    assert h.stuck_ranks == [0, 1] and h.missing_ranks == [] and h.unknown_ranks == [2, 3]
    assert "no dump from rank(s) 2,3" in h.text()
    (h,) = detect_hangs({0: dumps[0]}, NOW, threshold_s=60)
    assert h.unknown_ranks == [1, 2, 3]


def test_pg_status_counts_when_the_ring_wrapped() -> None:
    # Rank 1's ring holds nothing of group "0" any more, but pg_status says it enqueued #9.
    r0 = [entry(9, state="scheduled", retired=False, created_ns=T0)]
    r1_entries = [entry(50, pg_id=1, pg_name="1")]
    cfg = {"1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}}
    d1 = parse_dump(dump(r1_entries, extra_pgs=cfg, pg_status={"0": {"last_enqueued_collective": 9}}), 1, "j")
    (h,) = detect_hangs({0: parse_dump(dump(r0), 0, "j"), 1: d1}, NOW, threshold_s=60)
    # last_seq needs an entry of the group to learn its uid; without one, rank 1 looks missing.
    assert h.missing_ranks == [1]
    d1 = parse_dump(dump([entry(3), *r1_entries], pg_status={"0": {"last_enqueued_collective": 9}}), 1, "j")
    (h,) = detect_hangs({0: parse_dump(dump(r0), 0, "j"), 1: d1}, NOW, threshold_s=60)
    assert h.missing_ranks == [] and h.last_seq_by_rank[1] == 9


def test_only_the_first_stuck_op_per_group_is_reported() -> None:
    r0 = [entry(8, state="scheduled", retired=False, created_ns=T0),
          entry(9, state="scheduled", retired=False, created_ns=T0 + 1)]
    (h,) = detect_hangs({0: parse_dump(dump(r0), 0, "j")}, NOW, threshold_s=60)
    assert h.seq == 8


def test_p2p_hang_names_the_peer() -> None:
    send = entry(3, op="nccl:send 0->1", is_p2p=True, p2p_seq=1, state="scheduled", retired=False,
                 created_ns=T0)
    r1 = [entry(2)]  # rank 1 never posted the matching recv
    (h,) = detect_hangs({0: parse_dump(dump([send]), 0, "j"), 1: parse_dump(dump(r1), 1, "j")},
                        NOW, threshold_s=60)
    assert h.is_p2p and h.op == "send" and h.peer_ranks == [1] and h.missing_ranks == [1]
    recv = entry(3, op="nccl:recv 1<-0", is_p2p=True, p2p_seq=1, state="scheduled", retired=False,
                 created_ns=T0)
    hangs = detect_hangs({0: parse_dump(dump([send]), 0, "j"), 1: parse_dump(dump([recv]), 1, "j")},
                         NOW, threshold_s=60)
    assert all(h.missing_ranks == [] for h in hangs) and "waiting for peer" in hangs[0].text()


def test_an_only_active_dump_is_named_and_its_gaps_are_not_counted_lost() -> None:
    """TORCH_INCLUDE_ONLY_ACTIVE=1 (Megatron-LM's default once a dump path is set): every dump holds
    only in-flight collectives, so the sequence jumps between dumps are collectives left out, not a
    wrapped ring."""
    t = FlightRecorderTracker("j")
    t.update(_p([entry(100, state="started", retired=False)]))
    t.update(_p([entry(250, state="scheduled", retired=False), entry(251, state="started", retired=False)]))
    assert t.counts["only_active_dump"] == 2
    assert t.counts["entries_left_out_by_only_active"] == 149
    assert "entries_lost_between_dumps" not in t.counts
    assert t.progress == 151  # sequence numbers advanced: what the dump pacing reads


def test_the_dump_interval_follows_the_collective_rate(tmp_path: Path) -> None:
    from perfd.collectors.nccl import NcclCollector

    c = NcclCollector({"job": "j", "flight_recorder": {"pipe_prefix": str(tmp_path / "frp_"),
                                                       "dump_prefix": str(tmp_path / "d_"),
                                                       "interval_s": 10, "buffer_entries": 2000}})
    c.tracker = FlightRecorderTracker("j")
    fr = c.config.flight_recorder
    assert fr is not None and fr.buffer_entries == 2000
    c._pace = (100.0, 0)
    assert c._dump_interval(101.0, fr) == 10.0  # nothing seen yet: the configured interval
    c.tracker.latest = {0: _p([]), 1: _p([], rank=1)}
    c.tracker.progress = 2 * 1000  # 1,000 collectives per rank in one second
    assert c._dump_interval(102.0, fr) == 0.5 * 2000 / 1000  # half the ring between dumps
    c.tracker.progress += 2 * 100_000
    assert c._dump_interval(103.0, fr) == 0.5  # never more often than MIN_DUMP_INTERVAL_S
    c.tracker.progress += 2 * 50
    assert c._dump_interval(104.0, fr) == 10.0  # slow again: back to the configured interval


def _batch(p2p_seq: int, rid: int, *, state: str = "completed", retired: bool = True,
           duration_ms: float | None = 2.5) -> list[dict[str, Any]]:
    """A batch_isend_irecv of rank 0 with rank 1 as ProcessGroupNCCL records it: one entry per op
    with no CUDA events (left 'scheduled', never retired), then the 'nccl:coalesced' entry that
    carries the batch's state and duration; all with the batch's p2p sequence number."""
    send = entry(7, op="nccl:send 0->1", is_p2p=True, p2p_seq=p2p_seq, state="scheduled", retired=False,
                 sizes=[[4, 1024]], dtypes=["BFloat16"], record_id=rid)
    recv = entry(7, op="nccl:recv 0<-1", is_p2p=True, p2p_seq=p2p_seq, state="scheduled", retired=False,
                 sizes=[[4, 1024]], dtypes=["BFloat16"], record_id=rid + 1)
    head = entry(7, op="nccl:coalesced", is_p2p=True, p2p_seq=p2p_seq, state=state, retired=retired,
                 sizes=[], dtypes=[], duration_ms=duration_ms, record_id=rid + 2)
    return [send, recv, head]


def test_a_batched_p2p_is_one_record_with_the_batch_timing() -> None:
    d = parse_dump(dump(_batch(5, 10) + _batch(6, 13)), 0, "j")
    assert d.notes["batches_merged"] == 2 and d.issues == {}
    a, b = (fe.record for fe in d.entries)
    assert (a.op, a.p2p_seq_id, a.peer, a.bytes, a.duration_ms, a.state) == \
        ("send_recv", 5, 1, 2 * 4 * 1024 * 2, 2.5, "completed")
    assert a.raw_op == "nccl:coalesced[nccl:send 0->1, nccl:recv 0<-1]" and b.p2p_seq_id == 6
    t = FlightRecorderTracker("j")
    recs = t.update(d)
    assert [r.p2p_seq_id for r in recs] == [5, 6] and all(r.duration_ms == 2.5 for r in recs)
    assert "duplicate_seq_in_dump" not in t.counts


def test_a_completed_batch_is_not_a_hang_but_a_stuck_one_is() -> None:
    done = parse_dump(dump(_batch(5, 10)), 0, "j")
    assert detect_hangs({0: done, 1: parse_dump(dump([entry(2)]), 1, "j")}, NOW, threshold_s=60) == []
    stuck = parse_dump(dump(_batch(5, 10, state="started", retired=False, duration_ms=None)), 0, "j")
    (h,) = detect_hangs({0: stuck, 1: parse_dump(dump([entry(2)]), 1, "j")}, NOW, threshold_s=60)
    assert h.is_p2p and h.op == "send_recv" and h.stuck_ranks == [0]


def test_batch_members_without_their_head_wait_for_the_next_dump() -> None:
    members = _batch(5, 10)[:2]  # the dump was taken while the batch was being recorded
    d = parse_dump(dump([entry(3), *members]), 0, "j")
    assert [fe.record.op for fe in d.entries] == ["all_reduce"] and d.issues["batch_head_missing"] == 1
    # The same members in a dump of in-flight work only: their head completed and was left out.
    d = parse_dump(dump(members), 0, "j")
    assert d.entries == [] and d.notes["batch_members_only_active"] == 1 and d.issues == {}


def test_a_head_under_the_other_sequence_kind_is_matched_by_position() -> None:
    send, recv, head = _batch(5, 10)
    head.update(is_p2p=False, collective_seq_id=3)  # older torch: the coalesced work as a collective
    d = parse_dump(dump([entry(3), send, recv, head]), 0, "j")
    ops = [fe.record.op for fe in d.entries]
    assert ops == ["all_reduce", "send_recv"] and d.entries[1].record.duration_ms == 2.5
