"""Hang detection over Flight Recorder dumps of several ranks (see README.md, "Hangs")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from perfd.collectors.nccl.flight_recorder import FlightRecorderDump, FrEntry
from perfd.core.hang_fact import age_words
from perfd.core.model import CollectiveRecord


@dataclass
class HangReport:
    """A collective (or p2p op) stuck past the threshold, and who has not reached it."""

    pg_name: str
    pg_desc: str | None
    pg_id: int | None
    op: str
    seq: int
    is_p2p: bool
    age_s: float
    stuck_ranks: list[int]  # ranks with this op enqueued, not finished, older than the threshold
    missing_ranks: list[int]  # group members whose last seq on the group is lower: never reached it
    unknown_ranks: list[int]  # group members without a dump here (another node, or no dump yet)
    last_seq_by_rank: dict[int, int | None]
    bytes: int | None = None
    dtype: str | None = None
    user_frame: str | None = None
    peer_ranks: list[int] = field(default_factory=list)  # p2p: the global peer rank(s)

    def text(self) -> str:
        what = f"{self.op} #{self.seq} on process group {self.pg_name}"
        if self.pg_desc:
            what += f" ({self.pg_desc})"
        head = f"{what} {age_words(self.age_s)} on rank(s) {_ranks(self.stuck_ranks)}"
        if self.missing_ranks:
            tail = f"; rank(s) {_ranks(self.missing_ranks)} never reached it"
        elif self.is_p2p and self.peer_ranks:
            tail = f"; waiting for peer rank(s) {_ranks(self.peer_ranks)}"
        elif self.unknown_ranks:
            tail = f"; no dump from rank(s) {_ranks(self.unknown_ranks)}"
        else:
            tail = "; every rank reached it (suspect NCCL or the network)"
        where = f" [{self.user_frame}]" if self.user_frame else ""
        return head + tail + where


def _ranks(rs: Iterable[int]) -> str:
    return ",".join(str(r) for r in rs) or "-"


def detect_hangs(dumps_by_rank: Mapping[int, FlightRecorderDump], now_ns: int,
                 threshold_s: float) -> list[HangReport]:
    """Entries enqueued more than ``threshold_s`` ago and not finished, grouped per (group, seq).

    For a collective, every member of the group must enqueue the same ``collective_seq_id``; a
    member whose dump shows a lower last sequence number on that group has not reached it (it is
    the one the others wait for). Members with no dump in ``dumps_by_rank`` are listed as unknown.
    For p2p ops the peer is named; it counts as missing when its dump holds no unfinished op on
    the same group.
    """
    limit = int(threshold_s * 1e9)
    stuck: dict[tuple[str, bool, int], list[tuple[int, FrEntry]]] = {}
    for rank, dump in dumps_by_rank.items():
        for fe in dump.entries:
            r = fe.record
            if not fe.active or r.time_created_ns is None or now_ns - r.time_created_ns < limit:
                continue
            seq = r.p2p_seq_id if r.is_p2p else r.collective_seq_id
            if seq is None or r.pg_name is None:
                continue
            stuck.setdefault((r.pg_name, r.is_p2p, seq), []).append((rank, fe))
    reports: list[HangReport] = []
    for (pg_name, is_p2p, seq), items in sorted(stuck.items()):
        if any(_older_stuck(stuck, pg_name, is_p2p, seq, rank) for rank, _ in items):
            continue  # report only the first stuck op per group and rank: later ones queue behind it
        first = items[0][1].record
        stuck_ranks = sorted({rank for rank, _ in items})
        members = _members(dumps_by_rank, pg_name, first.pg_ranks)
        last: dict[int, int | None] = {}
        missing: list[int] = []
        unknown: list[int] = []
        peers: list[int] = []
        for m in members:
            d = dumps_by_rank.get(m)
            if d is None:
                unknown.append(m)
                continue
            lm = last[m] = d.last_seq(pg_name, p2p=is_p2p)
            if not is_p2p and (lm is None or lm < seq):
                missing.append(m)
        if is_p2p:
            for _, fe in items:
                pr = _global_peer(fe.record)
                if pr is None:
                    continue
                peers.append(pr)
                d = dumps_by_rank.get(pr)
                if d is not None and not any(e.active and e.record.pg_name == pg_name and e.record.is_p2p
                                             for e in d.entries):
                    missing.append(pr)
        ages = [(now_ns - fe.record.time_created_ns) / 1e9 for _, fe in items
                if fe.record.time_created_ns is not None]
        reports.append(HangReport(
            pg_name=pg_name, pg_desc=first.pg_desc, pg_id=first.pg_id, op=first.op, seq=seq,
            is_p2p=is_p2p, age_s=max(ages) if ages else 0.0, stuck_ranks=stuck_ranks,
            missing_ranks=sorted(set(missing) - set(stuck_ranks)), unknown_ranks=sorted(unknown),
            last_seq_by_rank=last, bytes=first.bytes, dtype=first.dtype, user_frame=items[0][1].user_frame,
            peer_ranks=sorted(set(peers)),
        ))
    return reports


def _older_stuck(stuck: Mapping[tuple[str, bool, int], list[tuple[int, FrEntry]]], pg_name: str,
                 is_p2p: bool, seq: int, rank: int) -> bool:
    return any(k[0] == pg_name and k[1] == is_p2p and k[2] < seq and any(r == rank for r, _ in v)
               for k, v in stuck.items())


def _members(dumps: Mapping[int, FlightRecorderDump], pg_name: str, ranks: list[int] | None) -> list[int]:
    if ranks:
        return sorted(ranks)
    # Group membership unknown (older torch, or the default group listed without ranks): the ranks
    # whose dumps mention the group, plus every rank we have when it is the default group.
    found = {r for r, d in dumps.items() if any(e.record.pg_name == pg_name for e in d.entries)}
    for d in dumps.values():
        info = d.pg_config.get(pg_name)
        if info and info.desc == "default_pg":
            found.update(dumps)
    return sorted(found)


def _global_peer(rec: CollectiveRecord) -> int | None:
    if rec.peer is None:
        return None
    if rec.pg_ranks and 0 <= rec.peer < len(rec.pg_ranks):
        return rec.pg_ranks[rec.peer]
    return rec.peer if not rec.pg_ranks else None
