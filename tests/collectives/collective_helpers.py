"""Shared builders for the collective tests: synthetic records and the recorded H200 dumps."""

from __future__ import annotations

from pathlib import Path

from perfd.core.model import CollectiveRecord, RankScope, StepRecord

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "perfd" / "collectors" / "nccl" / "tests" / "data" / "nccl_fixtures"
MS = 1_000_000  # ns
T0 = 1_795_000_000_000_000_000


def fr(rank: int, seq: int, created_ms: float, dur_ms: float | None, *, pg: int = 0,
       ranks: list[int] | None = None, op: str = "all_reduce", nbytes: int = 4 << 20, job: str = "j",
       desc: str | None = "default_pg", p2p: bool = False, peer: int | None = None,
       busbw: float | None = None, state: str = "completed") -> CollectiveRecord:
    ranks = [0, 1] if ranks is None else ranks
    return CollectiveRecord(
        job=job, source="flight_recorder", op=op, rank=rank, pg_id=pg, pg_name=str(pg), pg_desc=desc,
        pg_ranks=ranks, group_rank=ranks.index(rank) if rank in ranks else None, group_size=len(ranks),
        collective_seq_id=None if p2p else seq, p2p_seq_id=seq if p2p else None, is_p2p=p2p, peer=peer,
        bytes=nbytes, dtype="Float", state=state, time_created_ns=T0 + round(created_ms * MS),
        duration_ms=dur_ms, busbw_gbs=busbw)


def step(rank: RankScope, it: int, end_ms: float, job: str = "j", step_time_ms: float | None = None,
         warmup: bool = False) -> StepRecord:
    return StepRecord(job=job, iteration=it, rank=rank, end_time=(T0 + end_ms * MS) / 1e9,
                      step_time_ms=step_time_ms, fields={"warmup": "true"} if warmup else {})


def load_fixture_records(mode: str = "timing", job: str = "j") -> list[CollectiveRecord]:
    """Every record of a recorded run, as the agent's tracker emits them from its dumps."""
    from perfd.collectors.nccl.flight_recorder import FlightRecorderTracker, load_dump_bytes, parse_dump

    tr = FlightRecorderTracker(job)
    out: list[CollectiveRecord] = []
    d = FIXTURES / mode
    for i in range(10):
        for rank in (0, 1):
            p = d / f"dump{i:02d}_rank{rank}"
            if p.exists():
                out += tr.update(parse_dump(load_dump_bytes(p.read_bytes()), rank, job, str(p)))
    return out + tr.flush()
