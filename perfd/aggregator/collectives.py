"""The aggregator's collective records: bounded per-job retention, dedupe, analysis, /metrics rows.

Ingest (gRPC event loop) and readers (HTTP thread) share one lock of this store's own; the analysis
(:func:`perfd.analytics.collectives.collective_analysis.analyze_collectives`) runs outside it, rate-limited,
and only
when records, hang events or the job's step records changed.

Dedupe: a batch re-delivered after a reconnect, or an op that two dumps both show, replaces the
record it repeats: Flight Recorder records are keyed by (rank, process group, sequence number,
p2p), Inspector records by (host, pid, communicator, rank in it, sequence number, p2p).
Retention: the newest ``max_records_per_job`` records per job (oldest dropped first, counted); a
job's hang events, kept whole for the analysis, the newest ``max_hang_events`` within
perfd.core.limits.MAX_WHOLE_EVENT_BYTES_PER_JOB (oldest dropped first, counted in ``hang_events_dropped``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.collectives.collective_analysis import CollectiveAnalysis, finish
from perfd.analytics.collectives.collective_config import FR, CollectiveConfig
from perfd.analytics.collectives.fold_counts import FoldCounts
from perfd.analytics.collectives.step_window_memo import StepWindowMemo
from perfd.analytics.collectives.winfold import WindowFold
from perfd.core import limits as L
from perfd.core.collfold import (
    REDUCED_RETENTION,
    CollectivePartial,
    OpKey,
    OpRow,
    Retention,
    merge,
    op_key,
    reduce,
    sort_key,
)
from perfd.core.commsummary import CommShares
from perfd.core.hang_fact import HangEvent
from perfd.core.model import CollectiveRecord, ParallelLayout, StepRecord
from perfd.core.typed import obj
from perfd.core.winfigures import WindowFigures

Row = tuple[Mapping[str, str], str, float]
# What the window fold is told of a job (the aggregator's jobs store has it): a key that changes with
# its step records and layout, and a call that gives them.
FoldInputs = tuple[object, Callable[[], tuple[Sequence[StepRecord], ParallelLayout | None]]]
# A job's analysis that took COSTLY_ANALYSIS_S or more is made again no sooner than
# limits.ANALYSIS_COST_FACTOR times what it took (unless forced). Below it, min_recompute_s alone.
COSTLY_ANALYSIS_S = 1.0
# Before a job's first analysis says what it costs: the operations held from which it is taken to be
# costly (8,000 ranks' 248,000 took 0.8-8.8 s of CPU, ``perfd bench root-refresh --collectives``).
COSTLY_ROWS = 100_000
log = logging.getLogger(__name__)


# An operation's identity, the analysis's own: a store and a partial dedupe alike.
record_key = op_key


@dataclass
class JobCollectives:
    records: dict[OpKey, CollectiveRecord] = field(default_factory=dict)  # oldest first
    # What came reduced (the engine path: each node's agent reduced its ranks' records), merged
    partial: CollectivePartial | None = None
    # Its rows, counted as they are merged (new, less what the retention let go): ``len(partial)``
    # walks every rank, 76 ms at 100,000 ranks, and the refresh asks it (costly) every tick
    partial_rows: int = 0
    # Its per-window figures, folded from every operation merged into ``partial`` (which keeps 2 a
    # rank at 100,000 ranks: the step-window shares are read from here)
    fold: WindowFold | None = None
    # The step windows ``fold`` reads, made again only for the iterations whose records changed, outside
    # the store's lock (under their own: the root's loop and the analysis' worker both set them):
    # made whole under it at every new iteration, they held every reader of the store — the refresh
    # that publishes the per-iteration answer among them — for 1-3 s at 8,000 ranks
    windows: StepWindowMemo = field(default_factory=StepWindowMemo)
    windows_lock: threading.Lock = field(default_factory=threading.Lock)
    rank_agent: dict[int, str] = field(default_factory=dict)  # rank -> agent whose dumps hold it
    # As they arrived, read once (None: an event the hang merge cannot read, held and counted all the same)
    hang_events: list[HangEvent | None] = field(default_factory=list)
    hang_sizes: list[int] = field(default_factory=list)  # each hang event's bytes, as hang_events
    version: int = 0
    dropped: int = 0
    analysis: CollectiveAnalysis | None = None
    analysis_key: tuple[object, ...] | None = None
    analysis_time: float = 0.0
    analysis_cost: float = 0.0  # seconds the last one took
    # Analyses run outside the lock, several at once: numbered as they read, one kept only if none that
    # read later was kept first (an older one ending last put back what the newer had replaced)
    analyses_begun: int = 0
    analysis_seq: int = 0  # the number of the one held


class CollectiveStore:
    def __init__(self, max_records_per_job: int = 20_000, max_hang_events: int = 500,
                 min_recompute_s: float = L.ANALYSIS_MIN_EVERY_S, config: CollectiveConfig | None = None,
                 max_hang_bytes: int = L.MAX_WHOLE_EVENT_BYTES_PER_JOB,
                 reduced_retention: Retention = REDUCED_RETENTION,
                 job_config: Mapping[str, CollectiveConfig] | None = None,
                 fold_inputs: Callable[[str], FoldInputs] | None = None) -> None:
        self._lock = threading.Lock()
        self.jobs: dict[str, JobCollectives] = {}
        self.max_records = max_records_per_job
        self.max_hang_events = max_hang_events
        self.max_hang_bytes = max_hang_bytes
        self.hang_events_dropped = 0
        self._unlogged: dict[str, int] = {}  # what -> drops not yet in a log line (_drop_line)
        self._logged_at: dict[str, float] = {}
        self.min_recompute_s = min_recompute_s
        self.config = config or CollectiveConfig()
        # per-job overrides (links, thresholds)
        self.job_config: dict[str, CollectiveConfig] = dict(job_config or {})
        self.reduced_retention = reduced_retention
        self.ingested = 0
        self.dropped = 0
        self.merged_again = 0  # reduced operations already held (a redelivery, two dumps) or past the bound
        self.analysis_errors = 0
        # job -> its step records' key and a call for them and its layout (the job store's, wired by
        # perfd.aggregator.state): the window fold settles windows as operations come, not only when an
        # analysis runs
        self.fold_inputs = fold_inputs
        # Where the shards summarise their ranks' figures (the engine root's, wired by the aggregator):
        # a job's shares are read from the summaries' answer unless its fold holds figures of an
        # iteration as new as theirs (old rows, or a stray dump the root folded, do not count)
        self.shares: CommShares | None = None
        self.shares_answered = 0  # analyses whose shares came from the summaries
        # analyses of a job with summaries and figure rows of its newest iterations (shards set apart:
        # some summarise, some forward): its shares read from the rows, without the summarised ranks
        self.shares_mixed = 0

    def ingest(self, agent_id: str, recs: Sequence[CollectiveRecord]) -> None:
        with self._lock:
            self.ingested += len(recs)
            touched: dict[str, JobCollectives] = {}
            for r in recs:
                jc = touched.get(r.job) or self.jobs.setdefault(r.job, JobCollectives())
                touched[r.job] = jc
                key = record_key(r)
                jc.records.pop(key, None)  # re-insert: a re-delivered record counts as new
                jc.records[key] = r
                if r.rank is not None and r.source == "flight_recorder":
                    jc.rank_agent[r.rank] = agent_id
            dropped = 0
            for jc in touched.values():
                jc.version += 1
                excess = len(jc.records) - self.max_records
                if excess > 0:
                    for key in list(itertools.islice(jc.records, excess)):
                        del jc.records[key]
                    jc.dropped += excess
                    self.dropped += excess
                    dropped += excess
            line = self._drop_line("records", dropped) if dropped else 0
        if line:
            log.info("collectives: %d collective record(s) left their jobs' retention (%d a job, the oldest "
                     "first) since the last line", line, self.max_records)

    def ingest_partial(self, agent_id: str, part: CollectivePartial, folded: bool = False) -> None:
        """Merge a node's reduced collective records in (a join: one read twice merges once). Every
        rank's newest operations are kept (``reduced_retention``), where of records as sent the job's
        newest ``max_records_per_job`` are: at 100,000 ranks 0.2 a rank, most ranks unseen. What went
        in (new, or a further state) is folded per step window (perfd.analytics.collectives.winfold)
        before the retention lets it go; ``folded``: not (a shard's fold had them all, and hands its
        figures on: :meth:`ingest_figures`)."""
        # The fold reads the job's step windows only for the operations it takes: made again at
        # each change of the steps, a 100,000-rank job's newest iteration's took ~0.9 s of CPU, at
        # every folded partial too (the analysis makes them before it reads the fold)
        if self.fold_inputs is not None and not folded:
            self._set_windows(part.job, *self.fold_inputs(part.job))
        with self._lock:
            jc = self.jobs.setdefault(part.job, JobCollectives())
            if jc.partial is None:
                jc.partial = CollectivePartial(part.job)
            held = jc.partial.streams
            new = sum(1 for stream, rows in part.streams.items() for key in rows
                      if key not in held.get(stream, ()))
            taken: list[OpRow] = []
            # past the retention, the oldest of their ranks
            dropped = jc.partial.absorb(part, self.reduced_retention, taken)
            jc.partial_rows += new - dropped
            self.ingested += len(part)
            self.merged_again += len(part) - new  # in already: a redelivery, or two dumps of an op
            jc.dropped += dropped
            self.dropped += dropped
            fold = self._fold(part.job, jc)
            # the ranks it touched (the others settle when their next operations come, or at the analysis)
            if not folded:
                fold.advance(fold.add(taken))
            for row in part.ops.values():
                if row.rank is not None and row.source == FR:
                    jc.rank_agent[row.rank] = agent_id  # the partial's rows are its agent's ranks' (one node)
            jc.version += 1
            line = self._drop_line("records", dropped) if dropped else 0
        if line:
            log.info("collectives: %d collective operation(s) left their jobs' retention (%s) since the last "
                     "line", line, self.reduced_retention)

    def ingest_figures(self, figs: WindowFigures) -> None:
        """Merge per-window figures a shard's fold made of its ranks' operations (a join: one read
        twice merges once); the analysis reads them as its own fold's."""
        with self._lock:
            jc = self.jobs.setdefault(figs.job, JobCollectives())
            if self._fold(figs.job, jc).add_figures(figs):
                jc.version += 1

    def _fold(self, job: str, jc: JobCollectives) -> WindowFold:
        if jc.fold is None:
            jc.fold = WindowFold(self.job_config.get(job, self.config))
        return jc.fold

    def _set_windows(self, job: str, key: object,
                     get: Callable[[], tuple[Sequence[StepRecord], ParallelLayout | None]]) -> None:
        """The job's window fold given its step windows and layout, when they changed since it last
        had them (``key``): the records read (the jobs store has its own lock) and the windows made
        outside the store's lock, only those of the iterations whose records changed (StepWindowMemo)."""
        with self._lock:
            jc = self.jobs.setdefault(job, JobCollectives())
        with jc.windows_lock:
            with self._lock:
                if jc.fold is not None and jc.fold.steps_key == key:
                    return
            steps, layout = get()
            changed = jc.windows.update(steps)
            with self._lock:
                fold = self._fold(job, jc)
                # the memo's ranks that changed since the fold's last windows (every rank: its first)
                fold.set_windows(key, jc.windows.rank_windows, jc.windows.job_windows, layout,
                                 None if fold.steps_key is None else changed, jc.windows.iterations)

    def fold_counts(self) -> dict[str, int]:
        """The window folds' counters over every job, and the operations waiting (for /api/stats)."""
        with self._lock:
            folds = [jc.fold for jc in self.jobs.values() if jc.fold is not None]
            total = FoldCounts.summed(f.counts for f in folds)
            pending = sum(f.pending for f in folds)
        return {**total.to_json(), "pending": pending}

    def add_hang_event(self, agent_id: str, ev: Mapping[str, object]) -> None:
        job = str(ev.get("job") or obj(ev.get("labels")).get("job") or "")
        # What it holds: its text and payload (the wire's cap bounds one; this bounds the job's).
        size = len(str(ev.get("text") or "")) + len(json.dumps(ev.get("payload"), default=str)) + 256
        with self._lock:
            jc = self.jobs.setdefault(job, JobCollectives())
            jc.hang_events.append(HangEvent.from_event(ev, agent_id))
            jc.hang_sizes.append(size)
            drop = max(0, len(jc.hang_events) - self.max_hang_events)
            held = sum(jc.hang_sizes[drop:])
            while drop < len(jc.hang_events) - 1 and held > self.max_hang_bytes:
                held -= jc.hang_sizes[drop]
                drop += 1
            if drop:
                del jc.hang_events[:drop]
                del jc.hang_sizes[:drop]
                self.hang_events_dropped += drop
            jc.version += 1
            line = self._drop_line("hang", drop)
        if line:
            log.warning("collectives: %d hang event(s) dropped since the last line (latest of job %s), the "
                        "oldest first: a job keeps at most %d of them and %d bytes", line, job[:80],
                        self.max_hang_events, self.max_hang_bytes)

    def _drop_line(self, what: str, n: int) -> int:
        """Count ``n`` dropped ``what`` (lock held); the count to log now, or 0: every drop is a log
        line with its count, one a minute at most per kind."""
        self._unlogged[what] = self._unlogged.get(what, 0) + n
        now = time.monotonic()
        if not self._unlogged[what] or now - self._logged_at.get(what, -1e18) < L.REFUSAL_LOG_INTERVAL_S:
            return 0
        self._logged_at[what] = now
        out, self._unlogged[what] = self._unlogged[what], 0
        return out

    def hang_stats(self) -> dict[str, int]:
        """Hang events held (whole) and dropped: the most bytes one job holds, for /api/stats."""
        with self._lock:
            held = [sum(jc.hang_sizes) for jc in self.jobs.values()]
            return {"hang_events_held": sum(len(jc.hang_events) for jc in self.jobs.values()),
                    "hang_event_bytes_max_job": max(held, default=0),
                    "hang_events_dropped": self.hang_events_dropped}

    def has_job(self, job: str) -> bool:
        with self._lock:
            return job in self.jobs

    def analysis(self, job: str, steps_key: tuple[object, ...], inputs: Callable[[], tuple[
            list[StepRecord], ParallelLayout | None, dict[int, str], str | None]],
            force: bool = False, cached: bool = False) -> CollectiveAnalysis | None:
        """The job's analysis; ``inputs()`` (called only when recomputing) gives its step records,
        layout, rank -> node placement (from the NVML process lists) and GPU name. ``cached``: the
        last analysis whatever its age, if there is one (the JSON API; the refresher renews it)."""
        with self._lock:
            jc = self.jobs.get(job)
            if jc is None:
                return None
            shares_version = self.shares.version(job) if self.shares is not None else 0
            key = (jc.version, shares_version, *steps_key)
            fresh = jc.analysis is not None and (
                cached or jc.analysis_key == key
                or (not force and time.time() - jc.analysis_time < self._recompute_after(jc)))
            if fresh:
                return jc.analysis
            records = list(jc.records.values())
            partial = None if jc.partial is None else merge(jc.partial, reduce(job, records))
            hangs = [h for h in jc.hang_events if h is not None]
            agent_nodes = dict(jc.rank_agent)
            cfg = self.job_config.get(job, self.config)
            jc.analyses_begun += 1
            seq = jc.analyses_begun
        # What it costs, from here: its inputs, the fold's windows and view as well as the analysis (the
        # first at 100,000 ranks spent as long making the windows as analysing), so that its cadence
        # (limits.ANALYSIS_COST_FACTOR) bounds the whole of it
        began = time.monotonic()
        steps, layout, placed, gpu = inputs()
        nodes = {**agent_nodes, **placed}  # NVML placement wins; else the agent that read the dump
        view = windows = None
        answer = self.shares.answer(job) if self.shares is not None and shares_version else None
        if answer is not None:
            with self._lock:  # figure rows as new as the summaries' newest: both sources current
                rows_newest = jc.fold.newest_figures() if jc.fold is not None else None
            newest = answer.iterations[-1].iteration if answer.iterations else None
            if rows_newest is not None and (newest is None or rows_newest >= newest):
                answer = None
                with self._lock:
                    self.shares_mixed += 1
                    line = self._drop_line("mixed", 1)
                if line:
                    log.warning("collectives: %d analysis(es) of a job with shards' summaries and figure "
                                "rows of its newest iterations both (latest: job %s): its shares read from "
                                "the rows, without the summarised partitions' ranks (shards set apart: "
                                "some with --comm-summaries, some without; or agents that do not fold)",
                                line, job[:80])
        if answer is not None:
            with self._lock:
                self.shares_answered += 1
        elif partial is not None:
            self._set_windows(job, (steps_key, layout), lambda: (steps, layout))
            with jc.windows_lock:  # the memo's windows of these steps (a copy: an ingest may update it)
                windows = (dict(jc.windows.rank_windows), list(jc.windows.job_windows))
            with self._lock:
                fold = self._fold(job, jc)
                fold.advance()
                view = fold.view()
        try:
            result = finish(partial if partial is not None else reduce(job, records), steps, layout=layout,
                            rank_nodes=nodes, gpu_name=gpu, hang_events=hangs, config=cfg, fold=view,
                            windows=windows, shares=answer)
        except Exception:
            with self._lock:
                self.analysis_errors += 1
            raise
        with self._lock:
            jc.analysis_cost = time.monotonic() - began  # before the analysis: costly reads it unlocked
            if seq < jc.analysis_seq and jc.analysis is not None:
                return jc.analysis  # one that read later records ended first: it stays
            jc.analysis, jc.analysis_key, jc.analysis_time = result, key, time.time()
            jc.analysis_seq = seq
        return result

    # held and costly read a job's last analysis and its cost without the store's lock: the refresh
    # asks both before it publishes a job's new per-iteration answer, and the lock is held by the
    # root's loop for as long as it merges a node's operations (each dict read and attribute read is
    # whole under the interpreter's lock; the analysis' cost is written before the analysis).
    def held(self, job: str) -> CollectiveAnalysis | None:
        """The job's last analysis, whatever its age; None before its first (never computed here)."""
        jc = self.jobs.get(job)
        return jc.analysis if jc is not None else None

    def costly(self, job: str) -> bool:
        """Whether the job's analysis is one to make off every reader's path: its last took
        COSTLY_ANALYSIS_S or more, or, before its first, it holds COSTLY_ROWS operations or more."""
        jc = self.jobs.get(job)
        if jc is None:
            return False
        if jc.analysis is not None:
            return jc.analysis_cost >= COSTLY_ANALYSIS_S
        with self._lock:  # before its first analysis only: the rows are counted as they are merged
            return len(jc.records) + jc.partial_rows >= COSTLY_ROWS

    def _recompute_after(self, jc: JobCollectives) -> float:
        if jc.analysis_cost < COSTLY_ANALYSIS_S:
            return self.min_recompute_s
        return max(self.min_recompute_s, L.ANALYSIS_COST_FACTOR * jc.analysis_cost)

    def job_names(self) -> list[str]:
        with self._lock:
            return sorted(self.jobs)

    def last_per_rank(self, job: str) -> tuple[int, dict[int, dict[str, Any]]]:
        """(the job's records version, rank -> its newest collective: op, group, sequence number,
        state, whether it is still pending). What a stall shows of each rank's collectives."""
        with self._lock:
            jc = self.jobs.get(job)
            if jc is None:
                return 0, {}
            newest: dict[int, CollectiveRecord | OpRow] = {}
            # What came reduced, read as rows (not made records: a 100k-rank job holds 200,000), then
            # the records as sent (oldest first); the newest per rank by enqueue time, the later on a tie
            seen: list[CollectiveRecord | OpRow] = [
                row for held in (jc.partial.streams.values() if jc.partial else ())
                for _, row in sorted(held.items(), key=lambda kv: sort_key(kv[0]))]
            seen.extend(jc.records.values())
            for r in seen:
                if r.rank is not None:
                    old = newest.get(r.rank)
                    if old is None or (r.time_created_ns or 0) >= (old.time_created_ns or 0):
                        newest[r.rank] = r
            version = jc.version
        return version, {rank: {"op": r.op, "pg": _pg_of(r), "seq": r.p2p_seq_id if r.is_p2p
                                else r.collective_seq_id, "state": r.state, "source": r.source,
                                "pending": r.state not in (None, "completed"), "bytes": r.bytes}
                         for rank, r in newest.items()}

    def forget(self, job: str) -> None:
        with self._lock:
            self.jobs.pop(job, None)
            self.job_config.pop(job, None)


def _pg_of(r: CollectiveRecord | OpRow) -> str | None:
    if isinstance(r, OpRow):
        return r.group.pg_desc or r.group.pg_name
    return r.pg_desc or r.pg_name


def metric_rows(job: str, a: CollectiveAnalysis, per_rank: bool = True) -> list[Row]:
    """/metrics rows (catalog names) for one job's collective analysis; absent values are left out."""
    lab = {"job_name": job}
    rows: list[Row] = []
    if a.comm_total_share is not None:
        rows.append((lab, "perfd_job_comm_total_ratio", a.comm_total_share))
    for group, v in sorted(a.comm_share_by_group.items()):
        rows.append(({**lab, "group": group}, "perfd_job_comm_total_group_ratio", v))
    for b in a.bandwidth:
        gl = {**lab, "group": b.group, "scope": b.scope}
        rows.append((gl, "perfd_job_collective_busbw_bytes_per_second", b.median_busbw_gbs * 1e9))
        if b.ratio is not None:
            rows.append((gl, "perfd_job_collective_busbw_link_ratio", b.ratio))
    if a.n_records or a.hangs:
        rows.append((lab, "perfd_job_collective_hang_active", float(a.active_hangs)))
    if per_rank:
        for w in a.waits:
            if w.last_share is not None:
                rows.append(({**lab, "rank": str(w.rank)}, "perfd_job_collective_last_arrival_ratio",
                             w.last_share))
    return rows


def collective_configs(inter_link: str | None = None, inter: Sequence[str] = (),
                       intra: Sequence[str] = ()) -> tuple[CollectiveConfig, dict[str, CollectiveConfig]]:
    """(default, per job) from command-line values ``[JOB=]GBS`` (bus bandwidth in GB/s that the
    inter-node network / the intra-node link reaches per GPU). Raises ValueError with the bad value."""
    from perfd.analytics.collectives.groups import LINKS

    base = CollectiveConfig()
    if inter_link is not None:
        if inter_link not in LINKS:
            raise ValueError(f"unknown link {inter_link!r}; known: {', '.join(sorted(LINKS))}")
        base.inter_node_link = inter_link
    per_job: dict[str, dict[str, float]] = {}
    for field_name, values in (("inter_node_busbw_gbs", inter), ("intra_node_busbw_gbs", intra)):
        for v in values:
            job, sep, num = v.rpartition("=")
            try:
                gbs = float(num)
            except ValueError:
                raise ValueError(f"{v!r}: expected [JOB=]GBS, e.g. 25 or llama=50") from None
            if gbs <= 0:
                raise ValueError(f"{v!r}: bandwidth must be > 0")
            if sep:
                per_job.setdefault(job, {})[field_name] = gbs
            else:
                setattr(base, field_name, gbs)
    out: dict[str, CollectiveConfig] = {}
    for job, kw in per_job.items():
        cfg = out[job] = dataclasses.replace(base)
        for key, gbs_value in kw.items():
            setattr(cfg, key, gbs_value)
    return base, out
