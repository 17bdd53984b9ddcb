"""Real Flight Recorder dumps and Inspector lines recorded on 2 GPUs by tests/gpu/make_nccl_fixtures.py.

Data: ``tests/data/nccl_fixtures/`` next to this file (or ``$PERFD_NCCL_FIXTURES``); skipped until
recorded. Assertions are structural (what any recording of that script must show), not exact values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.nccl.flight_recorder import FlightRecorderTracker, load_dump_bytes, parse_dump
from perfd.collectors.nccl.hangs import detect_hangs
from perfd.collectors.nccl.inspector import check_busbw, parse_line

DATA = Path(os.environ.get("PERFD_NCCL_FIXTURES", Path(__file__).parent / "data" / "nccl_fixtures"))
pytestmark = pytest.mark.skipif(
    not (DATA / "manifest.json").exists(),
    reason=f"no recorded NCCL fixtures in {DATA} (run tests/gpu/make_nccl_fixtures.py)")


def _runs() -> dict[str, dict[str, Any]]:
    manifest = json.loads((DATA / "manifest.json").read_text())
    return {r["mode"]: r for r in manifest["runs"]}


def _dumps(mode: str) -> list[list[Any]]:
    """Dump rounds in order; each a list of parsed dumps (one per rank)."""
    rounds = []
    for rnd in _runs()[mode]["dumps"]:
        n = rnd["dump"]
        files = {r: DATA / mode / f"dump{n:02d}_rank{r}" for r in rnd["ranks"]}
        rounds.append([parse_dump(load_dump_bytes(f.read_bytes()), r, "j", path=f"{mode}/{f.name}")
                       for r, f in files.items()])
    return rounds


def test_every_recorded_dump_loads_restricted_and_parses_cleanly() -> None:
    for mode in _runs():
        for rnd in _dumps(mode):
            for d in rnd:
                assert d.version, d.path  # the first round may come before any collective
                assert d.issues == {}, (d.path, d.issues)
                assert all(e.record.bytes is not None for e in d.entries if e.record.op != "barrier"), d.path
                assert len(d.entries) <= _runs()[mode]["ring_entries"]


def test_normal_run_ops_groups_and_absent_durations() -> None:
    rounds = _dumps("normal")
    assert len(rounds) >= 2
    recs = [e.record for rnd in rounds for d in rnd for e in d.entries]
    ops = {r.op for r in recs}
    assert {"all_reduce", "all_gather", "reduce_scatter", "broadcast"} <= ops, ops
    assert {"send", "recv"} & ops, ops
    assert all(r.duration_ms is None for r in recs)  # timing off: absent, never 0
    assert {r.pg_desc for r in recs} >= {"default_pg"}
    assert all(r.pg_ranks == [0, 1] for r in recs if r.pg_desc == "default_pg")
    # the script's all_gather_into_tensor is bf16 (DDP's start-up also all-gathers Long shapes)
    assert "BFloat16" in {r.dtype for r in recs if r.op == "all_gather"}
    assert all(r.op in {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "barrier"}
               for r in recs), {r.raw_op for r in recs}


def test_timing_run_has_durations_and_bandwidth() -> None:
    recs = [e.record for rnd in _dumps("timing") for d in rnd for e in d.entries]
    done = [r for r in recs if r.state == "completed" and r.duration_ms is not None]
    assert done, "no completed entry with duration_ms under TORCH_NCCL_ENABLE_TIMING=1"
    assert all(r.duration_ms is not None and r.duration_ms >= 0 for r in done)
    assert any(r.busbw_gbs for r in done if r.op == "all_reduce")


@pytest.mark.parametrize("mode", ["normal", "timing"])
def test_successive_dumps_give_each_op_once(mode: str) -> None:
    tracker = FlightRecorderTracker("j")
    out = []
    for rnd in _dumps(mode):
        for d in rnd:
            out += tracker.update(d)
    out += tracker.flush()
    keys = [(r.rank, r.pg_id, r.is_p2p, r.p2p_seq_id if r.is_p2p else r.collective_seq_id) for r in out]
    assert len(keys) == len(set(keys)) and keys
    assert tracker.counts.get("rank_restarted", 0) == 0


def test_hang_names_rank_1() -> None:
    run = _runs()["hang"]
    (rnd,) = _dumps("hang")[:1]
    dumps = {d.rank: d for d in rnd}
    assert set(dumps) == {0, 1}
    now = run["dumps"][0]["trigger_time_ns"]
    hangs = detect_hangs(dumps, now, threshold_s=2.0)
    assert len(hangs) == 1, [h.text() for h in hangs]
    h = hangs[0]
    assert h.op == "all_reduce" and h.stuck_ranks == [0] and h.missing_ranks == [1], h.text()
    assert h.last_seq_by_rank[1] == h.seq - 1 and h.age_s >= 2.0
    assert h.user_frame is not None and "make_nccl_fixtures.py" in h.user_frame


def test_recorded_inspector_lines() -> None:
    files = [f for mode in _runs() for f in (DATA / mode / "inspector").glob("*.log")]
    if not files:
        pytest.skip("recorded without the NCCL Inspector plugin")
    n = 0
    for f in files:
        for line in f.read_text().splitlines():
            r = parse_line(line, "j")
            n += 1
            if r.busbw_gbs and r.bytes and r.duration_ms and r.group_size:
                ok = check_busbw(r.op, r.bytes, r.duration_ms * 1000, r.group_size, r.busbw_gbs)
                assert ok is not False, line
    assert n > 0


def test_recorded_inspector_lines_are_kernel_timed_collectives_of_both_ranks() -> None:
    """Recorded with the plugin built from NCCL v2.28.9-1 (manifest: plugin_by_mode)."""
    files = sorted((DATA / "batch_p2p" / "inspector").glob("*.log"))
    if not files:
        pytest.skip("batch_p2p recorded without the NCCL Inspector plugin")
    recs = [parse_line(line, "j") for f in files for line in f.read_text().splitlines()]
    assert {r.group_rank for r in recs} == {0, 1}
    assert {r.op for r in recs} >= {"all_reduce", "broadcast"}
    assert all(r.source == "nccl_inspector" and (r.duration_ms or -1) >= 0 for r in recs)
    assert all(r.bytes and r.group_size == 2 for r in recs)


def _tracked(mode: str) -> tuple[FlightRecorderTracker, list[Any], list[Any]]:
    t = FlightRecorderTracker("j")
    recs: list[Any] = []
    last: list[Any] = []
    for rnd in _dumps(mode):
        for d in rnd:
            recs.extend(t.update(d))
        last = rnd
    return t, recs, last


def test_recorded_batch_isend_irecv_is_one_timed_record_per_batch() -> None:
    """ProcessGroupNCCL records a batch's ops without events and one 'nccl:coalesced' entry (as a
    collective, with the batch's p2p sequence number) with its timing: read as one record each."""
    if "batch_p2p" not in _runs():
        pytest.skip("recorded before the batch_p2p mode existed")
    t, recs, last = _tracked("batch_p2p")
    assert t.counts.get("batches_merged", 0) > 0
    assert "duplicate_seq_in_dump" not in t.counts  # (a 50-entry ring: entries are lost between dumps)
    batches = [r for r in recs if r.op == "send_recv"]
    assert batches and all(r.is_p2p and r.peer in (0, 1) and r.state == "completed" for r in batches)
    # A duration for each, except where the tiny ring dropped the entry before its duration came.
    assert sum(r.duration_ms is None for r in batches) <= t.counts.get("pending_left_ring", 0)
    assert sum(r.duration_ms is not None for r in batches) >= len(batches) - 1
    assert all(r.bytes == 2 * 4 * 1024 * 2 for r in batches)  # a 4x1024 bf16 send and recv
    for rank in (0, 1):
        seqs = [r.p2p_seq_id for r in batches if r.rank == rank]
        assert len(seqs) == len(set(seqs))
    now = max(d.entries[-1].record.time_created_ns or 0 for d in last) + 600 * 10**9
    assert detect_hangs({d.rank: d for d in last}, now, threshold_s=60.0) == []


def test_recorded_only_active_dumps_are_named_and_hold_no_false_hang() -> None:
    """TORCH_INCLUDE_ONLY_ACTIVE=1: dumps hold in-flight work only — and the event-less members of
    every finished batch, whose heads were left out as completed."""
    if "only_active" not in _runs():
        pytest.skip("recorded before the only_active mode existed")
    t, recs, last = _tracked("only_active")
    assert t.counts.get("only_active_dump", 0) > 0 and t.counts.get("batch_members_only_active", 0) > 0
    assert "entries_lost_between_dumps" not in t.counts
    assert recs == []
    assert detect_hangs({d.rank: d for d in last}, 2**62, threshold_s=60.0) == []


PP2 = Path(__file__).parent / "data" / "megatron_pp2_fr"


def test_recorded_megatron_pp2_pipeline_p2p_has_a_duration_for_every_batch() -> None:
    """Megatron-LM PP=2: before batches were folded, 1,768 sends against 117 recvs, no durations on
    the pipeline group and 23 p2p "hangs" on a healthy job."""
    dumps = {r: parse_dump(load_dump_bytes((PP2 / f"fr_dump_{r}").read_bytes()), r, "j") for r in (0, 1)}
    for d in dumps.values():
        assert d.issues == {} and d.notes["batches_merged"] > 30
    t = FlightRecorderTracker("j")
    recs = [r for d in dumps.values() for r in t.update(d)]
    p2p = [r for r in recs if r.is_p2p]
    assert p2p and all(r.duration_ms is not None and r.op in ("send", "recv", "send_recv") for r in p2p)
    assert "duplicate_seq_in_dump" not in t.counts
    pipe = {r: {x.p2p_seq_id for x in p2p if x.rank == r} for r in (0, 1)}
    common = pipe[0] & pipe[1]
    assert len(common) > 30  # both stages hold the same pipeline batches
    now = max(fe.record.time_created_ns or 0 for d in dumps.values() for fe in d.entries) + 600 * 10**9
    assert detect_hangs(dumps, now, threshold_s=60.0) == []
