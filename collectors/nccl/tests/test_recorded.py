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

from collectors.nccl.flight_recorder import FlightRecorderTracker, load_dump_bytes, parse_dump
from collectors.nccl.hangs import detect_hangs
from collectors.nccl.inspector import check_busbw, parse_line

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
    files = [f for mode in ("normal", "timing") for f in (DATA / mode / "inspector").glob("*.log")]
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
