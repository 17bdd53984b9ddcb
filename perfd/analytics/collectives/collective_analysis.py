"""Communication analytics from collective records (Flight Recorder, NCCL Inspector). Pure.

**Total communication share** (docs/design.md §2: union of collective/p2p time ÷ iteration time), per
rank, per iteration and per parallel group. Each Flight Recorder record with a duration (the job
set ``TORCH_NCCL_ENABLE_TIMING=1``) becomes an interval, mapped to a rank's iteration window by its
enqueue time (:mod:`perfd.analytics.collectives.collective_windows` says how). The share of a window is the
length of the union of the intervals enqueued in it ÷ the window length; only windows the records
cover count. Without step records with end times, one number per rank: the union ÷ the span the
records cover (``observation_window``). The method is always in the output.

**Bus bandwidth** of large ops (≥ 64 MiB, where it is meaningful) per group, against the link the
group crosses: :mod:`perfd.analytics.collectives.bandwidth` (ops it cannot credit are counted in
``bandwidth_rejected`` and never exported).

**Wait asymmetry**: for the same (group, sequence number) on every member, the rank with the
shortest duration arrived last: the others waited for it. Per rank: how often it was last.

**Hangs**: :mod:`perfd.analytics.collectives.collective_hangs`. The settings: :class:`CollectiveConfig`
(:mod:`perfd.analytics.collectives.collective_config`).

**Phases**: :func:`analyze_collectives` is :func:`finish` of
:func:`perfd.core.collfold.reduce`; on the engine path the nodes' agents reduce, the
root's store merges (a join), and :func:`finish` runs on the merged partial.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from perfd.analytics.collectives.bandwidth import GroupBandwidth, group_bandwidth
from perfd.analytics.collectives.collective_config import FR, CollectiveConfig
from perfd.analytics.collectives.collective_facts import (
    BandwidthFacts,
    CollectiveFinding,
    CollectiveRecommendation,
    DpShareFacts,
    HangFacts,
    LastRankFacts,
    ShareAbsent,
    ShareAbsentFacts,
    TotalShareFacts,
    TpNodesFacts,
)
from perfd.analytics.collectives.collective_hangs import HangView, merge_hangs
from perfd.analytics.collectives.collective_windows import (
    Windows,
    rank_timeline,
    step_windows,
    union_ns,
)
from perfd.analytics.collectives.groups import classify_group
from perfd.analytics.collectives.rank_shares import WindowShare, rank_shares
from perfd.analytics.collectives.rank_shares import median as _median
from perfd.analytics.collectives.winfold import FoldView
from perfd.analytics.finding_types import SEVERITY_ORDER, Finding, Recommendation, Severity
from perfd.core.collfold import CollectivePartial, reduce, world_size_from
from perfd.core.commsummary import CommAnswer
from perfd.core.hang_fact import HangEvent
from perfd.core.model import CollectiveRecord, ParallelLayout, StepRecord

DP_SHARE_HIGH = 0.2  # docs/design.md §2 playbook: DP all-reduce > 20% of the step


@dataclass
class IterationComm:
    iteration: int
    n_iterations: int
    window_ms: float | None  # median over ranks
    share: float | None  # median over ranks
    share_by_rank: dict[int, float]
    by_group: dict[str, float]  # group class -> median over ranks
    excluded: str | None = None
    ranks: int = 0  # the ranks with a window of the iteration (share_by_rank may hold only the top)

    def to_json(self) -> dict[str, object]:
        return {"iteration": self.iteration, "n_iterations": self.n_iterations, "window_ms": self.window_ms,
                "share": self.share, "ranks": self.ranks,
                "share_by_rank": {str(r): v for r, v in sorted(self.share_by_rank.items())},
                "by_group": self.by_group, "excluded": self.excluded}


@dataclass
class RankWait:
    rank: int
    ops: int = 0  # collectives with every member's duration known
    decisive: int = 0  # of those, with a clear spread between ranks
    last: int = 0  # decisive ops where this rank had the shortest duration (arrived last)
    expected_last: float = 0.0  # Σ 1/group size over its decisive ops: "last" by chance
    wait_imposed_ms: float = 0.0  # Σ (median duration of the others − its own) when last

    @property
    def last_share(self) -> float | None:
        return self.last / self.decisive if self.decisive else None

    def flagged(self, min_ops: int) -> bool:
        share = self.last_share
        if share is None or self.decisive < min_ops:
            return False
        e = self.expected_last / self.decisive
        return share >= min(0.9, max(2 * e, e + 0.3))

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "ops": self.ops, "decisive": self.decisive, "last": self.last,
                "last_share": self.last_share,
                "expected_last_share": self.expected_last / self.decisive if self.decisive else None,
                "mean_wait_imposed_ms": self.wait_imposed_ms / self.last if self.last else None}


# One process group as the analysis lists it: its name, description and ranks as the records give
# them, its class (tp, dp, ... : perfd.analytics.collectives.groups.classify_group) and how that was
# decided, and its records and ops counted.
GroupInfo = TypedDict("GroupInfo", {"name": str | None, "desc": str | None, "ranks": list[int] | None,
                                    "class": str, "how": str, "records": int, "ops": dict[str, int]})


@dataclass
class CollectiveAnalysis:
    job: str
    n_records: int
    sources: dict[str, int]
    timing: bool  # some Flight Recorder record carries a duration
    method: str  # "step_windows" | "observation_window" | "none"
    # the latest complete windows of each rank the summary is over (the method's detail, worded where
    # served: perfd.report.collective_text.method_text)
    windows_kept: int
    groups: list[GroupInfo]
    iterations: list[IterationComm]
    comm_total_share: float | None
    comm_share_by_rank: dict[int, float]
    comm_share_by_group: dict[str, float]
    weighted_share: float | None
    n_windows: int
    bandwidth: list[GroupBandwidth]
    waits: list[RankWait]
    hangs: list[HangView]
    findings: list[Finding] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    absent: ShareAbsent | None = None  # why no total share (its JSON's absent_reason, worded where served)
    # large ops left out of the bandwidth, by reason: "single_rank_group", "not_credible"
    bandwidth_rejected: dict[str, int] = field(default_factory=dict)
    # the ranks the shares are over where they came from the shards' summaries of them (finish's
    # ``shares``): the medians then within the sketch's error, and the per-rank shares (the job's and
    # each iteration's) only the highest RANK_RATIO_TOP_K; None where every rank's figures were read here
    summarised_ranks: int | None = None

    @property
    def active_hangs(self) -> int:
        return sum(1 for h in self.hangs if h.active)

    def to_json(self) -> dict[str, Any]:
        """The analysis as JSON but its findings and recommendations, kinds and numbers that are worded
        where the JSON is served (perfd.report.collective_text.collectives_json adds them)."""
        return {
            "job": self.job, "records": self.n_records, "sources": self.sources, "timing": self.timing,
            "method": {"name": self.method, "windows_kept": self.windows_kept,
                       "summarised_ranks": self.summarised_ranks},
            "summary": {"comm_total_share": self.comm_total_share,
                        "comm_share_by_rank": {str(r): v for r, v in sorted(self.comm_share_by_rank.items())},
                        "comm_share_by_group": self.comm_share_by_group,
                        "weighted_share": self.weighted_share, "windows": self.n_windows,
                        "absent_reason": self.absent.value if self.absent is not None else None,
                        "active_hangs": self.active_hangs},
            "groups": self.groups,
            "iterations": [it.to_json() for it in self.iterations],
            "bandwidth": [b.to_json() for b in self.bandwidth],
            "bandwidth_rejected": dict(self.bandwidth_rejected),
            "waits": [w.to_json() for w in self.waits],
            "hangs": [h.to_json() for h in self.hangs],
        }


def analyze_collectives(job: str, records: Sequence[CollectiveRecord], steps: Sequence[StepRecord] = (),
                        *, layout: ParallelLayout | None = None, rank_nodes: Mapping[int, str] | None = None,
                        gpu_name: str | None = None, hang_events: Sequence[HangEvent] = (),
                        config: CollectiveConfig | None = None) -> CollectiveAnalysis:
    """Everything above for one job: ``finish(reduce(job, records), ...)``. ``rank_nodes``: rank ->
    node name (where known). An operation two records show (two dumps) counts once, as the
    aggregator's store keeps it (perfd.core.collfold.op_key)."""
    return finish(reduce(job, records), steps, layout=layout, rank_nodes=rank_nodes, gpu_name=gpu_name,
                  hang_events=hang_events, config=config)


def finish(partial: CollectivePartial, steps: Sequence[StepRecord] = (), *,
           layout: ParallelLayout | None = None, rank_nodes: Mapping[int, str] | None = None,
           gpu_name: str | None = None, hang_events: Sequence[HangEvent] = (),
           config: CollectiveConfig | None = None, fold: FoldView | None = None,
           windows: Windows | None = None, shares: CommAnswer | None = None) -> CollectiveAnalysis:
    """The analysis of a partial (perfd.core.collfold: one node's, or all nodes'
    merged) with the job's step records, layout and placement: its operations are read in the
    partial's order (rank by rank, each in enqueue order: CollectivePartial.ordered), so partials that
    hold the same operations give the same analysis whatever order they were merged in. ``fold``: the
    per-window figures folded from every operation merged (perfd.analytics.collectives.winfold), which
    the step-window shares are read from instead of the partial's rows (it may hold 2 a rank).
    ``windows``: ``step_windows(steps)`` where the caller has them (the store's StepWindowMemo, made
    again only where the records changed): made here from every record, they were a fifth of the
    engine root's analysis of a 10,000-rank job (the figures made elsewhere, 40 iterations).
    ``shares``: the merge of the shards' summaries of every rank's figures (perfd.core.commsummary), the
    shares read from it in place of ``fold`` and the records: what the engine's root has where its shards
    summarise (its figure rows never reach it)."""
    cfg = config or CollectiveConfig()
    job = partial.job
    records = partial.records()
    nodes = dict(rank_nodes or {})
    sources: dict[str, int] = {}
    for r in records:
        sources[r.source] = sources.get(r.source, 0) + 1
    lists = _RankLists(records)
    world = (layout.world_size if layout else None) or world_size_from(
        lists.distinct(), (r.rank for r in records))
    cls_cache: dict[tuple[int | None, str | None], tuple[str, str]] = {}
    cls: dict[int, str] = {}
    groups: dict[tuple[str, int | None], GroupInfo] = {}
    for r in records:
        ranks = lists.of(r)
        key = (id(ranks) if ranks else None, r.pg_desc)
        c = cls_cache.get(key)
        if c is None:
            c = cls_cache[key] = classify_group(r.pg_ranks, layout, world, r.pg_desc, cfg.order)
        cls[id(r)] = c[0]
        g = groups.setdefault((r.pg_name or r.comm_id or "?", key[0]), {
            "name": r.pg_name or r.comm_id, "desc": r.pg_desc, "ranks": list(ranks) if ranks else None,
            "class": c[0], "how": c[1], "records": 0, "ops": {}})
        g["records"] += 1
        g["ops"][r.op] = g["ops"].get(r.op, 0) + 1
    timed = [r for r in records if r.source == FR and r.duration_ms is not None
             and r.time_created_ns is not None and r.rank is not None]
    out = CollectiveAnalysis(job=job, n_records=len(records), sources=sources, timing=bool(timed),
                             method="none", windows_kept=cfg.recent_windows,
                             groups=list(groups.values())[:64], iterations=[], comm_total_share=None,
                             comm_share_by_rank={}, comm_share_by_group={}, weighted_share=None, n_windows=0,
                             bandwidth=[], waits=[], hangs=[])
    if shares is not None:
        _answered(out, shares, cfg)
    else:
        _shares(out, timed, cls, step_windows(steps) if windows is None else windows, cfg, fold, layout)
    out.bandwidth = group_bandwidth(records, cls, nodes, gpu_name, cfg, out.bandwidth_rejected)
    out.waits = _waits(timed)
    out.hangs = merge_hangs(hang_events, partial.progress)
    out.findings, out.recommendations = _findings(out, groups, nodes, cfg)
    return out


class _RankLists:
    """Each distinct list of group ranks once, as one tuple object: groups are told apart by that
    object's identity, not by hashing and comparing their ranks record after record (a job's world
    group lists every rank: 100,000 at the scale the engine is for). Records that share a list (a
    partial's records share one a group) cost one lookup each."""

    def __init__(self, records: Sequence[CollectiveRecord]) -> None:
        self._by_value: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._by_list: dict[int, tuple[list[int], tuple[int, ...]]] = {}  # id(list) -> (list, its tuple)
        for r in records:
            self.of(r)

    def of(self, r: CollectiveRecord) -> tuple[int, ...] | None:
        if not r.pg_ranks:
            return None
        hit = self._by_list.get(id(r.pg_ranks))
        if hit is None or hit[0] is not r.pg_ranks:
            t = tuple(r.pg_ranks)
            hit = self._by_list[id(r.pg_ranks)] = (r.pg_ranks, self._by_value.setdefault(t, t))
        return hit[1]

    def distinct(self) -> list[tuple[int, ...]]:
        return list(self._by_value.values())


def _shares(out: CollectiveAnalysis, timed: Sequence[CollectiveRecord], cls: Mapping[int, str],
            by_step: Windows, cfg: CollectiveConfig, fold: FoldView | None = None,
            layout: ParallelLayout | None = None) -> None:
    if not timed and not (fold is not None and (fold.counts.folded or fold.counts.received)):
        out.absent = ShareAbsent.NO_TIMING if out.sources.get(FR) else ShareAbsent.NO_RECORDS
        return
    by_rank: dict[int, list[CollectiveRecord]] = {}
    for r in timed:
        by_rank.setdefault(r.rank or 0, []).append(r)
    rank_windows, job_windows = by_step
    folded = None if fold is None else fold.figures(lambda r: rank_windows.get(r) or job_windows, layout,
                                                      cfg.order)
    per_it: dict[int, dict[int, WindowShare]] = {}
    rank_share: dict[int, float] = {}
    rank_weighted: dict[int, float] = {}
    rank_group: dict[int, dict[str, float]] = {}
    observed: dict[int, tuple[float, dict[str, float]]] = {}
    for rank in list(by_rank) if folded is None else sorted(set(by_rank) | set(folded)):
        windows = rank_windows.get(rank) or job_windows
        if windows:
            if folded is not None:
                figures = folded.get(rank, [])
            else:
                tl = rank_timeline(by_rank[rank], cls)
                figures = [(w, *tl.window(w)) for w in windows if tl.complete(w)]
            rs = rank_shares(figures, cfg.recent_windows)
            for ws in rs.windows:
                per_it.setdefault(ws.iteration, {})[rank] = ws
            if rs.recent is not None:
                rank_share[rank], rank_weighted[rank] = rs.recent.share, rs.recent.weighted
                rank_group[rank] = rs.recent.by_group
                out.n_windows = max(out.n_windows, rs.recent.windows)
            continue
        if rank not in by_rank:
            continue  # its operations folded, none held: no window to read them in, no span either
        tl = rank_timeline(by_rank[rank], cls)
        span_ns = max(e for _, e, _ in tl.ivs) - tl.created[0]
        if span_ns > 0:
            comm_ns = union_ns((s, e) for s, e, _ in tl.ivs)
            by_c: dict[str, list[tuple[int, int]]] = {}
            for s, e, c in tl.ivs:
                by_c.setdefault(c, []).append((s, e))
            observed[rank] = (comm_ns / span_ns, {c: union_ns(v) / span_ns for c, v in by_c.items()})
    if rank_share:
        out.method = "step_windows"
        out.comm_share_by_rank = rank_share
        out.comm_total_share = _median(list(rank_share.values()))
        out.weighted_share = _median(list(rank_weighted.values()))
        classes = sorted({c for g in rank_group.values() for c in g})
        out.comm_share_by_group = {c: _median([g.get(c, 0.0) for g in rank_group.values()]) or 0.0
                                   for c in classes}
    elif observed:
        out.method = "observation_window"
        out.comm_share_by_rank = {r: v[0] for r, v in observed.items()}
        out.comm_total_share = _median([v[0] for v in observed.values()])
        classes = sorted({c for v in observed.values() for c in v[1]})
        out.comm_share_by_group = {c: _median([v[1].get(c, 0.0) for v in observed.values()]) or 0.0
                                   for c in classes}
    else:
        out.absent = ShareAbsent.NO_WINDOW
    for it in sorted(per_it)[-cfg.max_iterations_out:]:
        rows = per_it[it]
        classes = sorted({c for v in rows.values() for c in v.by})
        out.iterations.append(IterationComm(
            iteration=it, n_iterations=max(v.n_iterations for v in rows.values()),
            window_ms=_median([v.ms for v in rows.values()]), share=_median([v.share for v in rows.values()]),
            share_by_rank={r: v.share for r, v in rows.items()},
            by_group={c: _median([v.by.get(c, 0.0) for v in rows.values()]) or 0.0 for c in classes},
            excluded=next((v.excluded for v in rows.values() if v.excluded), None), ranks=len(rows)))


def _answered(out: CollectiveAnalysis, a: CommAnswer, cfg: CollectiveConfig) -> None:
    """``_shares``' output from the summaries' answer: the same fields, the per-rank ones the top."""
    out.summarised_ranks = a.ranks
    if a.ranks and a.share is not None:
        out.method = "step_windows"
        out.comm_share_by_rank = dict(a.top)
        out.comm_total_share, out.weighted_share = a.share, a.weighted
        out.comm_share_by_group = dict(a.by_group)
        out.n_windows = a.windows
    else:
        out.absent = ShareAbsent.NO_WINDOW
    for it in a.iterations[-cfg.max_iterations_out:] if cfg.max_iterations_out > 0 else ():
        out.iterations.append(IterationComm(
            iteration=it.iteration, n_iterations=it.n_iterations, window_ms=it.window_ms, share=it.share,
            share_by_rank=dict(it.top), by_group=dict(it.by_group), excluded=it.excluded, ranks=it.ranks))


def _waits(timed: Sequence[CollectiveRecord]) -> list[RankWait]:
    ops: dict[tuple[str, int], dict[int, CollectiveRecord]] = {}
    for r in timed:
        if r.is_p2p or r.collective_seq_id is None or r.pg_name is None or r.rank is None:
            continue
        ops.setdefault((r.pg_name, r.collective_seq_id), {})[r.rank] = r
    waits: dict[int, RankWait] = {}
    for members in ops.values():
        if len(members) < 2:
            continue
        size = next(iter(members.values())).group_size
        if size is not None and len(members) < size:
            continue  # a member's record is missing: the shortest present may not be the last
        durs = {rank: r.duration_ms or 0.0 for rank, r in members.items()}
        lo_rank = min(durs, key=lambda k: durs[k])
        lo, hi = durs[lo_rank], max(durs.values())
        decisive = hi - lo >= max(0.05, 0.1 * lo)
        for rank in durs:
            w = waits.setdefault(rank, RankWait(rank))
            w.ops += 1
            if decisive:
                w.decisive += 1
                w.expected_last += 1.0 / len(durs)
        if decisive:
            w = waits[lo_rank]
            w.last += 1
            others = [d for k, d in durs.items() if k != lo_rank]
            w.wait_imposed_ms += float(statistics.median(others)) - lo
    return [waits[r] for r in sorted(waits)]


def _findings(a: CollectiveAnalysis, groups: Mapping[tuple[str, int | None], GroupInfo],
              nodes: Mapping[int, str], cfg: CollectiveConfig) -> tuple[list[Finding], list[Recommendation]]:
    """The findings and recommendations, as kinds and their numbers (perfd.report.collective_text words
    them where they are served: their titles, observations, the windows they are over and their sources)."""
    f: list[Finding] = []
    r: list[Recommendation] = []
    for h in a.hangs:
        fid = f"collective-hang-{h.process_group}-{h.seq}"
        hang = HangFacts(hang=h)
        f.append(CollectiveFinding(
            fid, Severity.CRITICAL if h.active else Severity.INFO, "", "", h.to_json(), facts=hang))
        if h.active:
            r.append(CollectiveRecommendation("", fid, 0, "", "", 1.0, facts=hang))
    if a.comm_total_share is not None:
        by_share = sorted(a.comm_share_by_group.items(), key=lambda x: -x[1])
        f.append(CollectiveFinding(
            "comm-total-share", Severity.INFO, "", "",
            {"comm_total_share": a.comm_total_share, "by_group": a.comm_share_by_group,
             "by_rank": {str(k): v for k, v in a.comm_share_by_rank.items()},
             "windows": a.n_windows, "method": a.method},
            facts=TotalShareFacts(share=a.comm_total_share, by_group=tuple(by_share), method=a.method,
                                  of_step=a.method == "step_windows", windows=a.n_windows)))
        dp = a.comm_share_by_group.get("dp")
        if dp is not None and dp > DP_SHARE_HIGH:
            said = DpShareFacts(share=dp, threshold=DP_SHARE_HIGH)
            f.append(CollectiveFinding("comm-dp-high", Severity.WARNING, "", "", {"dp_share": dp},
                                       facts=said))
            r.append(CollectiveRecommendation("", "comm-dp-high", 0, "", "", dp, facts=said))
    elif a.absent is not None:
        f.append(CollectiveFinding("comm-total-absent", Severity.INFO, "", "", {"records": a.n_records},
                                   facts=ShareAbsentFacts(reason=a.absent)))
    for b in a.bandwidth:
        ratio = b.ratio
        if ratio is None or ratio >= cfg.low_bandwidth_fraction:
            continue
        fid = f"collective-bandwidth-{b.group}-{b.scope}"
        low = BandwidthFacts(bandwidth=b, ratio=ratio, min_mib=cfg.min_bandwidth_bytes >> 20)
        f.append(CollectiveFinding(fid, Severity.WARNING, "", "", b.to_json(), facts=low))
        r.append(CollectiveRecommendation("", fid, 0, "", "", 0.5 * (1 - ratio), facts=low))
    for g in groups.values():
        if g["class"] != "tp" or not g["ranks"]:
            continue
        hosts = {nodes[x] for x in g["ranks"] if x in nodes}
        if len(hosts) > 1:
            tp = TpNodesFacts(group=g["name"], ranks=tuple(g["ranks"]), nodes=len(hosts))
            f.append(CollectiveFinding("tp-spans-nodes", Severity.WARNING, "", "", {"group": g}, facts=tp))
            r.append(CollectiveRecommendation("", "tp-spans-nodes", 0, "", "", 0.8, facts=tp))
            break
    flagged = [w for w in a.waits if w.flagged(cfg.straggler_min_ops)]
    for w in flagged:
        fid = f"collective-last-rank-{w.rank}"
        last = LastRankFacts(rank=w.rank, last=w.last, decisive=w.decisive, last_share=w.last_share,
                             by_chance=w.expected_last / w.decisive)
        f.append(CollectiveFinding(fid, Severity.WARNING, "", "", w.to_json(), facts=last))
        r.append(CollectiveRecommendation("", fid, 0, "", "", 0.3, facts=last))
    f.sort(key=lambda x: SEVERITY_ORDER.get(x.severity, 3))
    r.sort(key=lambda x: -(x.impact if x.impact is not None else -1.0))
    for i, rec in enumerate(r, start=1):
        rec.priority, rec.id = i, f"C{i}"
    return f, r
