"""A shard's window fold of its nodes' collective operations, and when it may acknowledge the node
messages that fed it.

The fold itself is the analytics' (perfd.analytics.collectives.shardfold.ShardCollectives): the
engine imports nothing of the analytics (tests/test_layering.py), so ``perfd shard`` (perfd.app.commands,
which sees every layer) hands it to the shard as a :class:`CollectiveFold`, as the aggregator hands
the root its sink. Without one a shard folds step partials only, as before; node messages' operations
are then left unread (an agent sends them only to shards of this version or later).

Why a message's acknowledgement waits for its windows (:class:`Holds`). A node message's operations
and step ends feed windows that settle later (once the rank's operations reach a window past them);
until then they wait in the fold, in this process only. Acknowledged at once, a shard killed with
them waiting would lose them: the root would keep the provisional figures it was handed (made from
the operations there were) and the next holder, never given them again, could not settle those
windows. So a message is acknowledged once, for every rank it names that the fold holds operations
of, a settled window starts at or after its latest time for that rank (its newest operation's
enqueue time, its step end): the windows it fed are settled and their figures published before the
acknowledgement, and the messages the engine delivers again after a kill start before the first
unsettled window, with the operations of the window before it (what a timeline's context needs: each
group's previous operation). The next holder folds them again: a window settled twice gives the same
row under the same (iteration, rank) key, which the root's join merges once; nothing is doubled.
Held the hold (EngineConfig.hold_s, under the ack wait: 7 s of 10) from its delivery (under the
engine's ack wait, which runs from there, so not delivered twice meanwhile, however long the fold took
to reach it: a fetch whose fold runs past the hold restarts the ack wait of the messages it has yet to
fold, perfd.engine.shard), then, its windows unsettled, HOLD_EXTENSIONS holds more, its ack wait
restarted each time (nats' in-progress ack): a job that stopped has windows that never settle, and
past that its messages are acknowledged with their windows' provisional figures handed on (counted
``released_unsettled``: what a kill then would lose).

The other half of it is the order: a shard taking a partition whose consumer has messages delivered
and not acknowledged (its holder was killed) starts fetching only after the ack wait, when the engine
delivers those again before anything newer; fetched first, the newer operations would settle windows
past the older ones, which the fold would then refuse as late. A shard that gives a partition up on
purpose (more shards, a stop) hands its held messages back instead (nak: the engine delivers them at
once, before newer ones) and marks the partition handed, so its next holder fetches at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from perfd.core.collfold import CollectivePartial
from perfd.core.jobinfo_json import job_info_from_json
from perfd.core.model import ParallelLayout, StepRecord
from perfd.core.winfigures import WindowFigures
from perfd.engine.nats_api import Msg
from perfd.engine.partial import Decoded

# A message is acknowledged within the hold (Holds.hold_s: EngineConfig.hold_s, 7 s by default) of its
# delivery even if its windows have not settled (under the engine's ack wait, 10 s from the delivery:
# a hold past it would have it delivered again to no purpose). Counted from the fold instead, a fetch
# folded slower than the ack wait less the hold had its last messages delivered twice.
#
# Times a hold whose windows have not settled by its end starts again (nats' in-progress ack restarts
# its ack wait) before it is released unsettled. A message's windows settle once its rank's
# operations of three iterations later are folded (the window after its step end starts at it, and
# settles once the operations pass the end of the one after: winfold.SETTLE_WINDOWS): 6 s at one
# iteration every 2 s, folded as they come, which left the hold (7 s) a second, and a shard behind none
# (perfd bench engine --nodes 1000 --shards 1 --collectives on a loaded 2-core machine, the shard
# getting ~0.4 core: 78% released unsettled with no extension, 30-48% with one). Once more: up to
# 14 s, ~5,500 messages out at a time on a partition of a 100,000-rank job (shard.MAX_ACK_PENDING_HELD
# is 8,192: past it the engine stops delivering, and nothing settles).
HOLD_EXTENSIONS = 1


class CollectiveFold(Protocol):
    """What a shard needs of the window fold (ShardCollectives has it)."""

    @property
    def jobs_forgotten(self) -> int: ...  # jobs let go past those it holds (the least recently touched)

    def add_steps(self, records: Iterable[StepRecord]) -> None: ...
    def set_layout(self, job: str, layout: ParallelLayout | None) -> None: ...
    def add(self, part: CollectivePartial) -> None: ...
    def take(self) -> list[WindowFigures]: ...
    def fold_counts(self) -> dict[str, int]: ...  # its window folds' counters (FoldCounts), summed
    def settled_from(self, job: str, rank: int) -> int | None: ...


class JobLayouts:
    """Each job's layout, as its info gives it, handed to ``fold`` when it changes; ``bad``: infos that
    did not read. A shard's holds and a folding agent (perfd.engine.publisher) feed their folds
    through it."""

    def __init__(self, fold: CollectiveFold) -> None:
        self.fold = fold
        self.bad = 0
        self._layouts: dict[str, ParallelLayout | None] = {}
        self._info_read: dict[str, str] = {}  # job -> the info its layout was last read from

    def read(self, job_info_json: Mapping[str, str]) -> None:
        for job, text in job_info_json.items():
            if self._info_read.get(job) == text:
                continue  # every node message of a hook job carries its info: read once, not each time
            try:
                layout = job_info_from_json(text).layout
            except ValueError:
                self.bad += 1
                continue
            self._info_read[job] = text
            if self._layouts.get(job) != layout:
                self._layouts[job] = layout
                self.fold.set_layout(job, layout)


@dataclass
class _Held:
    msg: Msg
    partition: int
    since: float  # its delivery (time.monotonic(); no later than the engine's): the hold runs from it
    needs: list[tuple[str, int, int]]  # (job, rank, latest time of it in the message, ns)
    extended: int = 0  # times its hold started again (extend)


@dataclass
class WindowStats:
    collective_messages: int = 0  # node messages with operations folded here
    operations: int = 0
    figure_rows: int = 0  # (iteration, rank) rows published
    figure_messages: int = 0
    held: int = 0  # node messages whose acknowledgement waits for their windows now
    released_unsettled: int = 0  # acknowledged after its holds with a window still open
    extended: int = 0  # holds started again (their ack wait: an in-progress ack each)
    bad_job_info: int = 0
    jobs_forgotten: int = 0  # the fold's: jobs let go past its bound
    # The fold's counters (perfd.analytics.collectives.fold_counts): operations late, windows uncovered,
    # retracted, evicted... what says why a rank's figures of a window are absent at the root
    fold: dict[str, int] = field(default_factory=dict)


class Holds:
    """The fold, the node messages waiting on it, and the figures taken and not yet published;
    ``hold_s``: how long a message is held from its delivery (the shard's EngineConfig.hold_s)."""

    def __init__(self, fold: CollectiveFold, hold_s: float) -> None:
        self.fold, self.hold_s = fold, hold_s
        self.stats = WindowStats()
        self._held: list[_Held] = []
        self._jobs: set[str] = set()  # jobs whose operations come here: their steps are folded too
        self._layouts = JobLayouts(fold)
        self._unsent: dict[str, WindowFigures] = {}

    def fold_in(self, d: Decoded, m: Msg, partition: int, delivered: float) -> bool:
        """Fold a node message's operations, step ends and layout in; True: its acknowledgement waits
        (:meth:`release`). ``delivered``: no later than the engine delivered ``m``."""
        self._layouts.read(d.job_info_json)
        self.stats.bad_job_info = self._layouts.bad
        latest: dict[tuple[str, int], int] = {}
        for part in d.collectives:
            self._jobs.add(part.job)
            self.stats.collective_messages += 1
            self.stats.operations += len(part)
            for rows in part.streams.values():  # (part.ops would build one dict of them a message)
                for row in rows.values():
                    if row.rank is not None and row.time_created_ns is not None:
                        key = (part.job, row.rank)
                        latest[key] = max(latest.get(key, 0), row.time_created_ns)
            self.fold.add(part)
        folds = []
        for p in d.partials:
            if p.job not in self._jobs:
                continue
            fold = p.fold
            if fold is None:
                continue
            folds.append(fold)
            for rank, end in fold.rank_end_times.items():
                key = (p.job, rank)
                latest[key] = max(latest.get(key, 0), round(end * 1e9))
        if folds:
            self.fold.add_steps(folds)
        if not latest:
            return False
        self._held.append(_Held(m, partition, delivered, [(j, r, t) for (j, r), t in latest.items()]))
        return True

    def take(self) -> list[WindowFigures]:
        """Figures made since the last take, with those a failed publish gave back (:meth:`give_back`)."""
        for figs in self.fold.take():
            held = self._unsent.get(figs.job)
            if held is None:
                self._unsent[figs.job] = figs
            else:
                held.absorb(figs)
        out, self._unsent = list(self._unsent.values()), {}
        for figs in out:
            self.stats.figure_rows += len(figs)
        self.stats.jobs_forgotten = self.fold.jobs_forgotten
        self.stats.fold = self.fold.fold_counts()
        return out

    def give_back(self, figs: Sequence[WindowFigures]) -> None:
        """Figures a publish did not get out: taken again at the next flush (a join: none doubled)."""
        for f in figs:
            self.stats.figure_rows -= len(f)
            held = self._unsent.get(f.job)
            if held is None:
                self._unsent[f.job] = f
            else:
                held.absorb(f)

    def extend(self, now: float) -> list[Msg]:
        """The held messages that waited ``hold_s``, their windows unsettled, with an extension left
        (HOLD_EXTENSIONS): their holds start again ``now`` (the caller restarts their ack wait, after
        ``now``). Before :meth:`release`, which would release them unsettled."""
        out = []
        for h in self._held:
            if h.extended < HOLD_EXTENSIONS and now - h.since >= self.hold_s and not self._settled(h):
                h.since, h.extended = now, h.extended + 1
                out.append(h.msg)
        self.stats.extended += len(out)
        return out

    def release(self, now: float) -> list[Msg]:
        """The held messages whose windows have settled (their figures taken: acknowledge them once
        those are published), or that waited ``hold_s`` (unless :meth:`extend` started it again)."""
        out, keep = [], []
        for h in self._held:
            if self._settled(h):
                out.append(h.msg)
            elif now - h.since >= self.hold_s:
                self.stats.released_unsettled += 1
                out.append(h.msg)
            else:
                keep.append(h)
        self._held = keep
        self.stats.held = len(keep)
        return out

    def hold_again(self, msgs: Sequence[Msg], now: float) -> None:
        """Messages :meth:`release` gave that could not be acknowledged with their figures (the
        publish failed): acknowledged at the next flush that publishes."""
        self._held.extend(_Held(m, -1, now - self.hold_s, []) for m in msgs)
        self.stats.held = len(self._held)

    def drop(self, partition: int) -> list[Msg]:
        """A partition given up: its held messages leave this shard (unacknowledged, the engine
        delivers them again to the next holder; or the caller acknowledges them)."""
        gone = [h.msg for h in self._held if h.partition == partition]
        self._held = [h for h in self._held if h.partition != partition]
        self.stats.held = len(self._held)
        return gone

    def _settled(self, h: _Held) -> bool:
        for job, rank, t in h.needs:
            s = self.fold.settled_from(job, rank)
            if s is not None and s < t:
                return False
        return True
