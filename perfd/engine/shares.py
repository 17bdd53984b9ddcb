"""An agent's store share of a job's collective operations, held and sent at most every
``every_s`` (:class:`HeldShares`): the share the jobs' root merges into its store (perfd.core.collfold:
each rank's newest operations, SENT_RETENTION) where the job's windows were folded below the root
(at the agent, or at the shards), so that the root folds none of its rows.

Why held: a node's agent sends what its collector read, one records message a job a Flight Recorder
dump (collectors/nccl: every 10 s by default, every 0.5 s at the most). Each message costs the root
~0.15-0.4 ms of its one interpreter's CPU whatever it holds (perfd bench root-figures,
docs/evidence/entries/48-scale-history.md),
so 12,500 nodes dumping every 2 s would ask ~2.5 cores of it, where the root also folds the job's
steps and figures; and what it keeps of a rank is its newest few operations (2 a rank at 100,000
ranks), so most of those messages only replace the previous one's rows. Held, a node's dumps are
merged (a keyed union: perfd.core.collfold's join) and sent as one, whatever the dump cadence: the root's
store ends with the same rows as if each dump had been sent (the newest k of a union is the newest k
of the newest k of its parts), up to ``every_s`` later.

How often: every ``every_s`` (SHARE_EVERY_S) for a small job; for a large one, its round is as long as
the root needs to take one round of the whole job's share at SHARE_ROWS_PER_S (:func:`share_round_s`).
A round of a job's share is each rank's newest SENT_RETENTION.k(world) operations, ~250,000 rows
for any job past ~500 ranks (2 a rank at 100,000): each 10 s, the root merged ~25,000 rows a second
for one job (714,624 in 30 s at 100,000 ranks, two thirds of its busy loop:
docs/evidence/entries/48-scale-history.md), ~29 µs each on the 2-core VM (perfd bench collectives).
What reads them is the analysis of whole operations, which runs every ten times what its last took
(limits.ANALYSIS_COST_FACTOR): over ~200,000 rows it takes ~20 s of CPU, so it runs every few
minutes there, and a share every 10 s was replaced several times before it was read. Each agent tells
its job's size from its rows (perfd.core.collfold.world_of, as the round's bound is told), so no agent
asks the root or the others.

What it changes: the analysis of whole operations (who arrives last, the wait asymmetry, the groups,
a hang's settling) sees a rank's operations up to ``every_s`` later; the per-iteration shares do not
wait (their figures were folded below the root and go on as they are made); a hang is told by the
agent's own event at once (collectors/nccl). An agent killed loses the share it held (at most
``every_s`` of it), as it loses the operations its window fold held (perfd.engine.publisher).
A job whose windows only the root folds (a Megatron-LM log's, whose step ends are not on the node)
is not held: every operation its agent read goes to the root, which folds them per window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from perfd.core.collfold import SENT_RETENTION, CollectivePartial, Retention, world_of

# How often at most a node's agent sends a job's held share: the collector's default dump round
# (collectors/nccl FlightRecorderConfig.interval_s), so that a default deployment sends what it
# always did, and a faster one (dumps every iteration, for per-iteration figures) no more.
SHARE_EVERY_S = 10.0
# The rows of one job's store share the root takes a second, all its agents together, past which a job's
# round is longer than ``every_s``: ~0.12 core at ~29 µs a row. At 100,000 ranks (2 a rank) a round
# every 50 s, at 8,000 (31 a rank) every 62 s; a job of 64 ranks keeps its 10 s (32,768 rows a round).
SHARE_ROWS_PER_S = 4_000
# Each send's next one is this fraction of ``every_s`` either way, at random: agents started with
# their job dump together, and their shares would otherwise reach the root in one burst a round.
JITTER = 0.25
# What a held share keeps of each rank until sent: the most a send could carry (SENT_RETENTION's
# per-rank bound; the job-wide one is applied at the send, over the job's world as the rows show it).
HELD_RETENTION = Retention(per_rank=SENT_RETENTION.per_rank)
MAX_HELD_JOBS = 1024  # jobs with a share held at once; past it the oldest is sent at once


@dataclass
class Held:
    part: CollectivePartial
    records: int  # the records it was made of (what the reduction left out is counted at the send)
    due: float  # monotonic: when it may go


@dataclass
class HeldShares:
    """Per job, the share held and when it may go. Not thread-safe: the agent's sender holds its lock."""

    every_s: float = SHARE_EVERY_S
    rng: random.Random = field(default_factory=random.Random)
    _held: dict[str, Held] = field(default_factory=dict)
    _next: dict[str, float] = field(default_factory=dict)  # job -> when its next share may go
    round_s: float | None = None  # the round the last share sent set for its job's next (None: none sent)

    def hold(self, part: CollectivePartial, records: int, now: float) -> list[Held]:
        """Merge ``part`` (of ``records`` records) into its job's held share; returns what must go
        now: a job's first share at once, and the oldest held past MAX_HELD_JOBS."""
        job = part.job
        cur = self._held.get(job)
        if cur is None:
            cur = self._held[job] = Held(CollectivePartial(job), 0, self._next.get(job, now))
        cur.part.absorb(part, HELD_RETENTION)
        cur.records += records
        out = []
        while len(self._held) > MAX_HELD_JOBS:
            out.append(self._pop(next(iter(self._held)), now))
        return out + self.due(now)

    def due(self, now: float) -> list[Held]:
        """The shares whose time came, taken (each job's next one ``every_s`` on, jittered)."""
        return [self._pop(job, now) for job in [j for j, h in self._held.items() if h.due <= now]]

    def take_all(self, now: float) -> list[Held]:
        """Every held share, due or not (a flush: what was submitted goes)."""
        return [self._pop(job, now) for job in list(self._held)]

    def _pop(self, job: str, now: float) -> Held:
        held = self._held.pop(job)
        self.round_s = share_round_s(world_of(held.part), self.every_s)
        self._next.pop(job, None)  # re-put: the oldest first below
        self._next[job] = now + self.round_s * self.rng.uniform(1 - JITTER, 1 + JITTER)
        if len(self._next) > MAX_HELD_JOBS:  # jobs long gone: their next time is past anyway
            del self._next[next(iter(self._next))]
        return held

    @property
    def rows(self) -> int:
        """Operations held now, every job."""
        return sum(len(h.part) for h in self._held.values())


def share_round_s(world: int, every_s: float) -> float:
    """How often the agents of a job of ``world`` ranks send its share: ``every_s``, or as long as the
    root takes to read one round of the whole job's share (each rank's newest SENT_RETENTION.k(world))
    at SHARE_ROWS_PER_S, if longer."""
    return max(every_s, world * (SENT_RETENTION.k(world) or 0) / SHARE_ROWS_PER_S)
