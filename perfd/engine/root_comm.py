"""What a job's root holds of the shards' communication-share summaries (perfd.core.commsummary): each
partition's newest, merged per job into the answer the job's collective analysis gives of its shares
(perfd.core.commsummary.answer), shown in the root's stats (/api/stats ``engine.comm_answers``: each
job's, with its newest ANSWERS_KEPT iterations). Pure: perfd.engine.root reads the stream.

A summary stands for its holder's rows of the partition now (each rank's recent windows, the newest
iterations), not for one iteration as a step summary does: so a partition's summary from a new holder
(its lease moved, its shard restarted: another epoch) replaces the former holder's rather than adding to
it — added, the ranks of both would count twice for as long as the job ran — once it holds a newer
iteration and as many ranks (a new holder's first summary is made of the messages it had at its first
flush: a few nodes'; counted ``partial_holder`` while held back), or once the former's newest iteration is
COMM_RECENT_WINDOWS behind (its ranks gone, or the job smaller). The partition's older iterations are
then its new holder's rows only (fewer, until it has its own): counted in ``holders_replaced``. Within a
holder, a newer summary (its seq) replaces the one held; one delivered again, or older, changes nothing. A
summary of a partition the engine does not have is refused.

The answers shown are made on the root's loop as summaries come, of the newest ANSWERS_KEPT iterations
only, and copied out to the HTTP threads that read them. The job's collective analysis reads the whole
answer (:meth:`RootComm.answer`, a perfd.core.commsummary.CommShares) on its worker thread, where the
aggregator wires it: its shares come from here for a job whose figure rows never reach the root.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from perfd.core import commsummary as cs
from perfd.core import limits as L
from perfd.engine.root_summaries import ANSWERS_KEPT


@dataclasses.dataclass
class CommCounts:
    received: int = 0
    replaced: int = 0  # a holder's newer summary of its partition, in place of the one held
    stale: int = 0  # not newer than the one held (delivered again): dropped
    holders_replaced: int = 0  # a partition's summary from a new holder, in place of its former's
    partial_holder: int = 0  # a new holder's of fewer ranks than its former's, newer: held back
    refused: int = 0  # of a job the root does not take, or of a partition the engine does not have


class RootComm:
    def __init__(self, partitions: int, iterations_out: int = L.COMM_ITERATIONS_OUT) -> None:
        self.partitions, self.iterations_out = partitions, iterations_out
        self.held: dict[str, dict[int, cs.CommSummary]] = {}  # job -> partition -> its newest
        self.counts = CommCounts()
        self._shown: dict[str, dict[str, object]] = {}  # job -> its answer as /api/stats shows it
        # job -> the count of summaries taken (of every job) when its newest came: an analysis made
        # before it is stale; never the same again for a job forgotten and held anew
        self._versions: dict[str, int] = {}
        self._taken = 0

    def add(self, summaries: Iterable[cs.CommSummary], admit: Callable[[str], bool]) -> None:
        touched: set[str] = set()
        for s in summaries:
            self.counts.received += 1
            if not 0 <= s.partition < self.partitions or (s.job not in self.held and not admit(s.job)):
                self.counts.refused += 1
                continue
            parts = self.held.setdefault(s.job, {})
            had = parts.get(s.partition)
            if had is not None and not _newer(s, had):
                self.counts.stale += 1
                continue
            if had is not None and had.epoch != s.epoch and not _whole(s, had):
                self.counts.partial_holder += 1
                continue
            if had is not None:
                if had.epoch == s.epoch:
                    self.counts.replaced += 1
                else:
                    self.counts.holders_replaced += 1
            parts[s.partition] = s
            self._taken += 1
            self._versions[s.job] = self._taken
            touched.add(s.job)
        for job in touched:
            # only the iterations shown merged: the whole merge (16 partitions' hundred iterations of
            # sketches) took 0.47 s of CPU a summary on the 2-core VM, the newest four's 0.015 s, on a
            # root's loop already at a core
            mine = list(self.held[job].values())
            newest = set(sorted({it for s in mine for it in s.iterations})[-ANSWERS_KEPT:])
            merged = cs.merge(dataclasses.replace(s, iterations={it: p for it, p in s.iterations.items()
                                                                  if it in newest}) for s in mine)
            if merged is not None:
                shown = cs.answer(merged, self.iterations_out)
                self._shown[job] = {**dataclasses.asdict(shown), "partitions": len(self.held[job])}

    def version(self, job: str) -> int:
        return self._versions.get(job, 0)

    def answer(self, job: str) -> cs.CommAnswer | None:
        """For any thread: the merge of every partition's summary held, answered. The partitions' map is
        copied in one step (the loop replaces its entries; a summary held is never changed)."""
        merged = cs.merge(list(self.held.get(job, {}).values()))
        return None if merged is None else cs.answer(merged, self.iterations_out)

    def forget(self, job: str) -> None:
        self.held.pop(job, None)
        self._shown.pop(job, None)
        self._versions.pop(job, None)

    def to_json(self) -> dict[str, object]:
        """For any thread: the answers as last made on the loop (a copy of the map; each answer is
        replaced whole, never changed)."""
        return {"counts": dataclasses.asdict(self.counts), "jobs": dict(sorted(dict(self._shown).items()))}


def _whole(s: cs.CommSummary, had: cs.CommSummary) -> bool:
    """Whether a new holder's (newer) summary may stand for the partition in place of the former's: it
    has as many ranks, or the former's is too old to (its newest iteration COMM_RECENT_WINDOWS behind)."""
    return s.ranks >= had.ranks or (max(s.iterations, default=-1) - max(had.iterations, default=-1)
                                    >= L.COMM_RECENT_WINDOWS)


def _newer(s: cs.CommSummary, had: cs.CommSummary) -> bool:
    """Whether ``s`` stands for the partition's rows after ``had``: the same holder's later flush; another
    holder's only once it holds a newer iteration (a former holder's summary delivered again after its
    successor's does not take the partition back)."""
    if s.epoch == had.epoch:
        return s.seq > had.seq
    return max(s.iterations, default=-1) > max(had.iterations, default=-1)
