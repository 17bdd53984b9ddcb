"""The wire form of a step summary (perfd.engine.stepsummary): protobuf's StepSummary, versioned
(``VERSION``: a root reads the version it knows and counts and drops another), in an EngineBatch's
``step_summaries`` on a job's summaries subject (perfd.engine.subjects.summaries_subject). Sums travel as
the canonical partials of their exact value and sketches as their buckets' counts, so that one summary
encodes to the same bytes however it was merged."""

from __future__ import annotations

from typing import Final

from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.sketch import MAX_KEY, MIN_KEY, SKETCH_ACCURACY, Sketch
from perfd.engine.stepsummary import (
    ExactSum,
    Extreme,
    StageSummary,
    StepSummary,
    TimerSummary,
)
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb

VERSION: Final = 1  # StepSummary.version this code writes and reads

def _sum_to_pb(x: ExactSum, m: pb.ExactSum) -> None:
    m.partials.extend(x.canonical())


def sketch_to_pb(sk: Sketch, m: pb.Sketch) -> None:
    m.relative_accuracy = SKETCH_ACCURACY
    m.zeros = sk.zeros
    if sk.bins:
        lo, hi = min(sk.bins), max(sk.bins)
        m.min_key = lo
        m.counts.extend(sk.bins.get(k, 0) for k in range(lo, hi + 1))


def sketch_from_pb(m: pb.Sketch) -> Sketch:
    """ValueError for another accuracy, or buckets past the mapping's keys (a value no float has: a
    garbage key read back as a value raised OverflowError wherever the sketch was read)."""
    if m.relative_accuracy != SKETCH_ACCURACY:
        raise ValueError(f"a sketch of relative accuracy {m.relative_accuracy}, not {SKETCH_ACCURACY}")
    if m.counts and not (MIN_KEY <= m.min_key and m.min_key + len(m.counts) - 1 <= MAX_KEY):
        raise ValueError(f"a sketch's buckets {m.min_key}..{m.min_key + len(m.counts) - 1} are past its keys")
    sk = Sketch()
    sk.zeros = m.zeros
    sk.bins = {m.min_key + i: c for i, c in enumerate(m.counts) if c}
    return sk


def to_pb(s: StepSummary, m: pb.StepSummary) -> None:
    m.version, m.job, m.iteration, m.partition = VERSION, s.job, s.iteration, s.partition
    m.epoch, m.seq, m.ranks_in, m.ranks_expected = s.epoch, s.seq, s.ranks_in, s.ranks_expected
    m.ranks_hash = s.ranks_hash
    if s.slowest is not None:
        step_to_pb(s.slowest, m.slowest)
    if s.end_time is not None:
        m.end_time, m.has_end = s.end_time, True
    m.armed, m.new_run, m.stage_unknown = s.armed, s.new_run, s.stage_unknown
    for name, t in sorted(s.timers.items()):
        tm = m.timers.add(name=name, count=t.count, min=t.min, max=t.max, max_rank=t.max_rank)
        _sum_to_pb(t.sum, tm.sum)
        sketch_to_pb(t.sketch, tm.sketch)
    for st, g in sorted(s.stages.items()):
        gm = m.stages.add(stage=st, count=g.count)
        _sum_to_pb(g.sum, gm.sum)
        gm.top_rank.extend(r for r, _ in g.top)
        gm.top_value.extend(v for _, v in g.top)
        sketch_to_pb(g.sketch, gm.sketch)
    for name, e in sorted(s.extremes.items()):
        m.extremes.add(name=name, count=e.count, max=e.max, max_rank=e.max_rank, min=e.min,
                       min_rank=e.min_rank, unknown=e.unknown)


def from_pb(m: pb.StepSummary) -> StepSummary:
    """ValueError for a summary of another version, or malformed (the caller counts and drops it)."""
    if m.version != VERSION:
        raise ValueError(f"a step summary of version {m.version}; this root reads {VERSION}")
    slowest = step_from_pb(m.slowest) if m.HasField("slowest") else None
    if slowest is not None and (slowest.job != m.job or slowest.iteration != m.iteration):
        raise ValueError("a summary's slowest record is of another job or iteration")
    s = StepSummary(m.job, m.iteration, m.partition, m.epoch, m.seq, m.ranks_in, m.ranks_expected, slowest,
                    m.end_time if m.has_end else None, m.armed, m.new_run, stage_unknown=m.stage_unknown,
                    ranks_hash=m.ranks_hash)
    for tm in m.timers:
        s.timers[tm.name] = TimerSummary(tm.count, ExactSum(tm.sum.partials), tm.min, tm.max, tm.max_rank,
                                         sketch_from_pb(tm.sketch))
    for gm in m.stages:
        if len(gm.top_rank) != len(gm.top_value) or len(gm.top_rank) > RANK_RATIO_TOP_K:
            raise ValueError("a stage's slowest ranks and values differ in number, or are too many")
        s.stages[gm.stage] = StageSummary(gm.count, ExactSum(gm.sum.partials),
                                          list(zip(gm.top_rank, gm.top_value, strict=True)),
                                          sketch_from_pb(gm.sketch))
    for em in m.extremes:
        s.extremes[em.name] = Extreme(em.count, em.max, em.max_rank, em.min, em.min_rank, em.unknown)
    return s


def encode(s: StepSummary) -> bytes:
    m = pb.StepSummary()
    to_pb(s, m)
    return m.SerializeToString(deterministic=True)


def decode(data: bytes) -> StepSummary:
    m = pb.StepSummary()
    m.ParseFromString(data)
    return from_pb(m)
