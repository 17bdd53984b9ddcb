"""The job-wide hang report, merged from every agent's ``nccl_hang`` events (pure).

Each agent runs :func:`perfd.collectors.nccl.hangs.detect_hangs` over the Flight Recorder dumps of the
ranks on its node (an op enqueued, not finished, older than the agent's ``hang_threshold_s``) and
sends an ``nccl_hang`` event naming the stuck ranks, the ranks that never reached the op
(``ranks_not_joined``) and the group members it has no dump of (other nodes: ``unknown_ranks``),
read once where it arrives (perfd.core.hang_fact.HangEvent). Here the events of all agents are merged per
(process group, op kind, sequence number), and the collective records the aggregator holds settle
what one node could not see:

- a member without a dump on the reporting node, whose own records show it enqueued the op
  (sequence number ≥ the stuck one), joined it; one whose records stop below it, and that no agent
  reports stuck, did not join (``inferred_not_joined``);
- a hang is resolved once every stuck rank has a record at or past the op that completed (the
  records arrive only for finished ops, so the first one past the hang ends it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perfd.core.collfold import Progress
from perfd.core.hang_fact import HangEvent


@dataclass
class HangView:
    process_group: str
    op: str
    seq: int
    is_p2p: bool
    stuck_ranks: list[int]
    ranks_not_joined: list[int]  # as the agents reported them, plus the inferred ones
    inferred_not_joined: list[int]  # of those, the ones only the aggregator's records show
    ranks_unknown: list[int]  # no dump on any reporting node and no records here
    first_reported: float  # epoch s, the first event (agent clock)
    last_reported: float
    age_at_first_report_s: float | None  # how long the op had been stuck when first reported
    resolved: bool  # every stuck rank completed the op or a later one (worded: collective_text)
    agents: list[str]
    user_frame: str | None
    texts: list[str]

    @property
    def active(self) -> bool:
        return not self.resolved

    def to_json(self) -> dict[str, object]:
        return {
            "process_group": self.process_group, "op": self.op, "seq": self.seq, "is_p2p": self.is_p2p,
            "stuck_ranks": self.stuck_ranks, "ranks_not_joined": self.ranks_not_joined,
            "inferred_not_joined": self.inferred_not_joined, "ranks_unknown": self.ranks_unknown,
            "first_reported": self.first_reported, "last_reported": self.last_reported,
            "age_at_first_report_s": self.age_at_first_report_s, "active": self.active,
            "resolved": self.resolved, "agents": self.agents,  # "resolution" between, where served
            # "text", between these two where served: perfd.report.collective_text.hang_text
            "user_frame": self.user_frame, "agent_texts": self.texts[:8],
        }


def merge_hangs(events: Iterable[HangEvent], progress: Progress) -> list[HangView]:
    """One view per (process group, p2p, seq) over the hang events of every agent, oldest first.
    Only ranks some agent could not see (``unknown_ranks``) are settled from the records: a member
    an agent saw and did not flag has enqueued the op (its stuck entry may just be younger than that
    agent's threshold)."""
    groups: dict[tuple[str, bool, int], list[HangEvent]] = {}
    for ev in events:
        groups.setdefault((ev.fact.process_group, ev.is_p2p, ev.fact.seq), []).append(ev)
    views: list[HangView] = []
    for (pg, p2p, seq), evs in groups.items():
        views.append(_view(pg, p2p, seq, evs, progress))
    views.sort(key=lambda v: v.first_reported)
    return views


def _view(pg: str, p2p: bool, seq: int, evs: Sequence[HangEvent], progress: Progress) -> HangView:
    stuck: set[int] = set()
    not_joined: set[int] = set()
    unknown: set[int] = set()
    agents: set[str] = set()
    texts: list[str] = []
    frame = None
    first = last = None
    age_first: float | None = None
    op = "?"
    for ev in sorted(evs, key=lambda e: e.time):
        fact = ev.fact
        op = fact.op if fact.op is not None else op
        stuck.update(fact.stuck_ranks)
        not_joined.update(fact.ranks_not_joined)
        unknown.update(fact.unknown_ranks)
        if ev.agent:
            agents.add(ev.agent)
        if ev.text and ev.text not in texts:
            texts.append(ev.text)
        frame = frame or fact.user_frame
        if first is None:
            first = ev.time
            age_first = fact.age_s
        last = ev.time
    # A rank that one node reports stuck was not "without dump" or "not joined" elsewhere.
    not_joined -= stuck
    candidates = unknown - stuck - not_joined
    inferred: set[int] = set()
    still_unknown: set[int] = set()
    for r in sorted(candidates):
        enq = progress.enqueued.get((r, pg, p2p))
        if enq is None:
            still_unknown.add(r)
        elif enq < seq:
            inferred.add(r)
    resolved = bool(stuck) and all(progress.completed.get((r, pg, p2p), -1) >= seq for r in stuck)
    return HangView(
        process_group=pg, op=op, seq=seq, is_p2p=p2p, stuck_ranks=sorted(stuck),
        ranks_not_joined=sorted(not_joined | inferred), inferred_not_joined=sorted(inferred),
        ranks_unknown=sorted(still_unknown), first_reported=first or 0.0, last_reported=last or 0.0,
        age_at_first_report_s=age_first, resolved=resolved, agents=sorted(agents),
        user_frame=frame, texts=texts)
