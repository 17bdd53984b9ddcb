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

How often: every ``every_s`` (SHARE_EVERY_S), unless the job's whole share would then reach the root
faster than SHARE_ROWS_PER_S rows a second; then a round of it only as often as the root takes it at
that rate (:func:`share_round_s`). A round of a job's share is each rank's newest operations since the
last, at most SENT_RETENTION.k(world) a rank (~250,000 rows for any job past ~500 ranks, 2 a rank at
100,000). Each 10 s, a 100,000-rank job running 3 operations a rank a second gave the root ~20,000 rows
a second for that job alone (714,624 in 30 s, two thirds of its busy loop:
docs/evidence/entries/48-scale-history.md), ~29 µs each on the 2-core VM (perfd bench collectives),
while what reads them, the analysis of whole operations, runs every ten times what its last took
(limits.ANALYSIS_COST_FACTOR): over ~200,000 rows it takes ~20 s of CPU, so it ran every few minutes
and most shares were replaced before they were read. A longer round saves only where it is long
enough for each rank's operations to pass the k a send keeps (a shorter one sends every operation
however it is cut), so the round is either ``every_s`` or that long: 50 s at 100,000 ranks, 62 s at
4,096 running 3 a second; a job of 1,024 ranks running 3 a second (3,072 rows a second) keeps its
10 s. A job goes long ROUND_HYSTERESIS past the bound and comes back as far under it. Each agent tells
the job's size from its rows (perfd.core.collfold.world_of, as the bound a send keeps is told) and its
ranks' rate from their rows' enqueue times (:func:`ops_rate`), so no agent asks the root or the others.
A job this agent reported a collective hang of (an ``nccl_hang`` event) sends its next share within
``every_s`` and at ``every_s`` for HANG_SOON_S after: the completion that resolves the hang travels in
a share (the collector reports a hang of its own node's ranks, so it is the reporter's share), and the
hang alert waits for it; the root's analysis of whole operations, which resolves it, runs at its own
cadence on top (minutes at 100,000 ranks).

What it changes: the analysis of whole operations (who arrives last, the wait asymmetry, the groups,
a hang's settling) sees a rank's operations up to a round later (a job past the rate: up to ~78 s
with the jitter; a job restarted on the same agent waits out the round its last run set); the
per-iteration shares do not wait (their figures were folded below the root and go on as they are
made); a hang is told by the agent's own event at once (collectors/nccl). An agent killed loses the
share it held (at most a round of it), as it loses the operations its window fold held
(perfd.engine.publisher).
A job whose windows only the root folds (a Megatron-LM log's, whose step ends are not on the node)
is not held: every operation its agent read goes to the root, which folds them per window.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from perfd.core.collfold import SENT_RETENTION, CollectivePartial, Retention, world_of

# How often at most a node's agent sends a job's held share: the collector's default dump round
# (collectors/nccl FlightRecorderConfig.interval_s), so that a default deployment sends what it
# always did, and a faster one (dumps every iteration, for per-iteration figures) no more.
SHARE_EVERY_S = 10.0
# The rows of one job's store share the root takes a second, all its agents together, past which a job's
# round is longer than ``every_s`` (share_round_s): ~0.12 core at ~29 µs a row.
SHARE_ROWS_PER_S = 4_000
# A job goes to its long round once its share would pass SHARE_ROWS_PER_S by this factor, and back to
# ``every_s`` once under it by the same factor: a rate near the bound does not flip its round each send.
ROUND_HYSTERESIS = 1.25
# A job this agent reported a collective hang of sends at ``every_s`` this long after the report: the
# operations that resolve the hang travel in its share, and the hang alert (PerfdCollectiveHang, for 2
# minutes) waits for them. Past it, a job still hung runs few operations: its rate keeps it at every_s.
HANG_SOON_S = 300.0
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
    _hung: dict[str, float] = field(default_factory=dict)  # job -> until when its hang keeps it at every_s
    rounds: dict[str, float] = field(default_factory=dict)  # job -> the round its last share set
    _sent: dict[str, float] = field(default_factory=dict)  # job -> when its last share went

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

    def note_hang(self, job: str, now: float) -> None:
        """This agent reported a collective hang of ``job``: its share goes within ``every_s`` (the
        operations that resolve it travel in it), and at ``every_s`` for HANG_SOON_S after."""
        self._hung.pop(job, None)  # re-put: the oldest first below
        self._hung[job] = now + HANG_SOON_S
        if len(self._hung) > MAX_HELD_JOBS:  # a job that hung and was killed never sends again
            del self._hung[next(iter(self._hung))]
        soon = now + self.every_s
        if self._next.get(job, soon) > soon:
            self._next[job] = soon
        held = self._held.get(job)
        if held is not None and held.due > soon:
            held.due = soon

    def _pop(self, job: str, now: float) -> Held:
        held = self._held.pop(job)
        if now < self._hung.get(job, now):
            round_s = self.every_s
        else:
            self._hung.pop(job, None)
            round_s = share_round_s(world_of(held.part), ops_rate(held.part), self.every_s,
                                    self.rounds.get(job, self.every_s) > self.every_s)
        for times in (self._next, self.rounds, self._sent):  # re-put: the oldest first below
            times.pop(job, None)
        self._next[job] = now + round_s * self.rng.uniform(1 - JITTER, 1 + JITTER)
        self.rounds[job], self._sent[job] = round_s, now
        for times in (self._next, self.rounds, self._sent):
            if len(times) > MAX_HELD_JOBS:  # jobs long gone: their next time is past anyway
                del times[next(iter(times))]
        return held

    def live_round_s(self, now: float) -> float | None:
        """The longest round of the jobs whose last share went within twice their round (None: none)."""
        return max((r for job, r in self.rounds.items() if now - self._sent.get(job, -math.inf) <= 2 * r),
                   default=None)

    @property
    def rows(self) -> int:
        """Operations held now, every job."""
        return sum(len(h.part) for h in self._held.values())


def ops_rate(part: CollectivePartial) -> float | None:
    """The operations a rank of ``part`` runs a second, from its rows' own enqueue times (each rank's
    count over the time its rows span, the ranks pooled): not from when dumps came, which a round may
    catch one or two of, nor from how many rows were held, which a dump of the rank's whole ring
    overstates. None where the rows span no time."""
    n = span = 0
    for rows in part.streams.values():
        times = [t for row in rows.values() if (t := row.time_created_ns) is not None]
        if len(times) >= 2:
            n += len(times) - 1
            span += max(times) - min(times)
    return n / (span / 1e9) if span > 0 else None


def share_round_s(world: int, rate: float | None, every_s: float, was_long: bool = False) -> float:
    """How often the agents of a job of ``world`` ranks, each running ``rate`` collective operations a
    second (None: not known), send its share: ``every_s``, unless the whole job's share would then
    reach the root faster than SHARE_ROWS_PER_S rows a second (ROUND_HYSTERESIS past it, or short of it
    where the job's last round, ``was_long``, was long already); then as long as the root takes to read
    one round of it (each rank's newest SENT_RETENTION.k(world)) at that rate."""
    k = SENT_RETENTION.k(world) or 0
    bound = SHARE_ROWS_PER_S * every_s * (1 / ROUND_HYSTERESIS if was_long else ROUND_HYSTERESIS)
    if rate is None or world * min(k, rate * every_s) <= bound:
        return every_s
    return max(every_s, world * k / SHARE_ROWS_PER_S)
