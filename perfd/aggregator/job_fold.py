"""A job's step records as the analysis reads them: the job described from its records (a job only the
step hook reports), capture-disturbed iterations marked, per-rank records folded into one per
iteration. Pure functions over the records the job store holds (perfd/aggregator/jobs.py), with the
caches that keep an unchanged iteration the same object for the incremental analysis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from perfd.core.model import HOOK_FRAMEWORK, JobInfo, StepRecord
from perfd.core.stepfold import ALL_RANKS, fold_ranks


def job_info_of(info: JobInfo | None, records: Sequence[StepRecord],
                reported: Collection[int] = ()) -> JobInfo:
    """The job as its sources state it, completed from its per-rank step records: a job no log
    describes (the step hook alone) is a PyTorch job, and where no source stated the world size it
    is the number of ranks that report (each rank runs the hook; a rank that never reported would
    make it low, and its absence shows in the per-rank records). Never guessed beyond that: TP, PP
    and DP stay unknown unless stated. ``reported``: ranks whose records reached the store already
    folded (perfd.engine: a job's root holds one fold per iteration, and the ranks in it)."""
    ranks = {r.rank for r in records if isinstance(r.rank, int)} | set(reported)
    if info is None:
        if not ranks:
            return JobInfo()
        info = JobInfo(framework=HOOK_FRAMEWORK)
    if info.layout.world_size is not None or not ranks:
        return info
    return dataclasses.replace(info, layout=dataclasses.replace(info.layout, world_size=len(ranks)))


def mark_disturbed(records: list[StepRecord], windows: Sequence[tuple[float, float]],
                   cache: dict[int, tuple[StepRecord, StepRecord]] | None = None) -> list[StepRecord]:
    """Records whose iteration overlaps a capture window, marked ``disturbed_by_capture`` (a
    capture slows the iterations it starts and stops in; docs/design.md §3). ``cache`` (iteration ->
    (record, its marked copy)) hands back the same copy for the same record, so that an
    incremental analysis sees an unchanged iteration as unchanged."""
    if not windows:
        return records
    out = []
    for r in records:
        end = r.end_time
        start = end - r.step_time_ms / 1e3 if end is not None and r.step_time_ms is not None else end
        hit = end is not None and start is not None and any(s <= end and start <= e for s, e in windows)
        if not hit or r.disturbed_by_capture:
            out.append(r)
            continue
        kept = cache.get(r.iteration) if cache is not None else None
        marked = (kept[1] if kept is not None and kept[0] is r
                  else dataclasses.replace(r, disturbed_by_capture=True))
        if cache is not None:
            cache[r.iteration] = (r, marked)
        out.append(marked)
    if cache is not None and len(cache) > len(records):
        present = {r.iteration for r in records}
        for i in [i for i in cache if i not in present]:
            del cache[i]
    return out


_FoldCache = dict[int, tuple[tuple[StepRecord, ...], StepRecord]]


def job_level_steps(records: list[StepRecord], cache: _FoldCache | None = None) -> list[StepRecord]:
    """One record per iteration for :func:`analyze_run`. A job whose log reports it (Megatron-LM's
    ``last``) is read from the log's records; the ranks' own records (the step hook) then serve the
    collectives' windows and the stalls, not the iterations. Without a log, the ranks' records are
    folded into one ``"all"`` record per iteration (the slowest rank's step: the iteration ends when it
    does; timers merged per rank), with any fold of them the engine's root made (an ``"all"`` record:
    perfd.engine, already one, read as it is). ``cache`` (iteration -> (its records, the fold)) hands
    back the same fold while an iteration's records are the same objects: folding is done once per
    change, and an incremental analysis sees an unchanged iteration as unchanged."""
    logged = [r for r in records if not isinstance(r.rank, int) and r.rank != ALL_RANKS]
    if logged or not records:
        # The engine's folds of the ranks' records too are left out here, as one aggregator leaves the
        # ranks' own: two records an iteration (the log's and the fold's) were two rows of it.
        return logged
    by_it: dict[int, list[StepRecord]] = {}
    for r in records:
        by_it.setdefault(r.iteration, []).append(r)
    out = []
    for it, rs in by_it.items():
        if len(rs) == 1 and rs[0].rank == ALL_RANKS:  # the engine's fold, whole: not copied again
            out.append(rs[0])
            continue
        kept = cache.get(it) if cache is not None else None
        if (kept is not None and len(kept[0]) == len(rs)
                and all(a is b for a, b in zip(kept[0], rs, strict=True))):
            out.append(kept[1])
            continue
        folded = fold_ranks(rs, keep_ends=False)  # the collectives read the ranks' own records
        if cache is not None:
            cache[it] = (tuple(rs), folded)
        out.append(folded)
    if cache is not None and len(cache) > len(by_it):
        for i in [i for i in cache if i not in by_it]:
            del cache[i]
    return out
