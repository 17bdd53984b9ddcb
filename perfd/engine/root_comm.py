"""What a job's root holds of the shards' communication-share summaries (perfd.core.commsummary):
each partition's holder's newest (a summary delivered again, or older, changes nothing; a holder's
newer one replaces its own), merged per job into the answer the job's collective analysis gives
of its shares (perfd.core.commsummary.answer), shown in the root's stats (/api/stats
``engine.comm_answers``: each job's, with its newest ANSWERS_KEPT iterations). Read beside the figure
rows, which the root's analysis still reads: nothing reads these answers yet. Pure: perfd.engine.root
reads the stream.

A partition whose lease moved has two holders' summaries, each of the ranks it held rows of; both are
merged (a rank in both counts twice: ``ranks`` and the ranks' hash say so against the job's). Past
MAX_HOLDERS holders of one partition the one heard from first is let go of (counted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from perfd.core import commsummary as cs
from perfd.core import limits as L
from perfd.engine.root_summaries import ANSWERS_KEPT, MAX_HOLDERS


@dataclasses.dataclass
class CommCounts:
    received: int = 0
    replaced: int = 0  # a holder's newer summary of its partition, in place of the one held
    stale: int = 0  # not newer than the one held (delivered again): dropped
    holders_dropped: int = 0
    refused: int = 0  # of a job the root does not admit


class RootComm:
    def __init__(self, iterations_out: int = L.COMM_ITERATIONS_OUT) -> None:
        self.iterations_out = iterations_out
        self.held: dict[str, dict[tuple[int, int], cs.CommSummary]] = {}  # job -> (partition, epoch) -> it
        self.counts = CommCounts()

    def add(self, summaries: Iterable[cs.CommSummary], admit: Callable[[str], bool]) -> None:
        for s in summaries:
            self.counts.received += 1
            if s.job not in self.held and not admit(s.job):
                self.counts.refused += 1
                continue
            parts = self.held.setdefault(s.job, {})
            key = (s.partition, s.epoch)
            had = parts.get(key)
            if had is not None and had.seq >= s.seq:
                self.counts.stale += 1
                continue
            self.counts.replaced += had is not None
            if had is None:
                holders = [k for k in parts if k[0] == s.partition]  # in the order first heard from
                if len(holders) >= MAX_HOLDERS:
                    del parts[holders[0]]
                    self.counts.holders_dropped += 1
            parts[key] = s

    def answer(self, job: str) -> cs.CommAnswer | None:
        merged = cs.merge(self.held.get(job, {}).values())
        return None if merged is None else cs.answer(merged, self.iterations_out)

    def forget(self, job: str) -> None:
        self.held.pop(job, None)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for job in sorted(self.held):
            a = self.answer(job)
            if a is not None:
                shown = dataclasses.replace(a, iterations=a.iterations[-ANSWERS_KEPT:])
                out[job] = {**dataclasses.asdict(shown), "partitions": len({p for p, _ in self.held[job]})}
        return {"counts": dataclasses.asdict(self.counts), "jobs": out}
