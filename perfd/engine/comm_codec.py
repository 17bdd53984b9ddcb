"""The wire form of a communication-share summary (perfd.core.commsummary): protobuf's CommSummary,
versioned (``VERSION``: a root reads the version it knows, and counts and drops another), in an
EngineBatch's ``comm_summaries`` on a job's summaries subject (perfd.engine.subjects.summaries_subject).
Sketches travel as their buckets' counts (perfd.engine.summary_codec), classes and iterations in
order, so that one summary encodes to the same bytes however it was merged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from perfd.core import limits as L
from perfd.core.commsummary import CommSummary, IterationPart, Top
from perfd.core.limits import RANK_RATIO_TOP_K
from perfd.core.sketch import Sketch
from perfd.engine.summary_codec import sketch_from_pb, sketch_to_pb
from perfd.transport.gen import perfd_pb2 as pb

VERSION: Final = 1  # CommSummary.version this code writes and reads
# What one summary may hold (a shard's hold far less): its iterations (a shard keeps the analysis's
# recent windows' or listed iterations, whichever more), group classes a sketch set, and sketch buckets
# in all (a share's values span ~700 buckets, a window's length ~1,200). Past them it is refused: a
# message of 1 MiB read whole could hold a million buckets.
MAX_ITERATIONS: Final = max(L.COMM_RECENT_WINDOWS, L.COMM_ITERATIONS_OUT)
MAX_CLASSES: Final = 32
MAX_BUCKETS: Final = 1 << 18


def _classes_to_pb(by: dict[str, Sketch], out: RepeatedCompositeFieldContainer[pb.ClassSketch]) -> None:
    for name, sk in sorted(by.items()):
        sketch_to_pb(sk, out.add(name=name).sketch)


def _classes(ms: Sequence[pb.ClassSketch]) -> dict[str, Sketch]:
    out = {m.name: sketch_from_pb(m.sketch) for m in ms}
    if len(out) != len(ms):
        raise ValueError("a summary names a group class twice")
    return out


def _top(ranks: Sequence[int], values: Sequence[float]) -> Top:
    if len(ranks) != len(values) or len(ranks) > RANK_RATIO_TOP_K:
        raise ValueError("a summary's top ranks and shares differ in number, or are too many")
    return list(zip(ranks, values, strict=True))


def to_pb(s: CommSummary, m: pb.CommSummary) -> None:
    m.version, m.job, m.partition, m.epoch, m.seq = VERSION, s.job, s.partition, s.epoch, s.seq
    m.ranks, m.ranks_hash, m.windows = s.ranks, s.rank_hash, s.windows
    sketch_to_pb(s.share, m.share)
    sketch_to_pb(s.weighted, m.weighted)
    _classes_to_pb(s.by, m.by)
    m.top_rank.extend(r for r, _ in s.top)
    m.top_value.extend(v for _, v in s.top)
    for it, p in sorted(s.iterations.items()):
        im = m.iterations.add(iteration=it, ranks=p.ranks, ranks_hash=p.rank_hash,
                              n_iterations=p.n_iterations)
        sketch_to_pb(p.share, im.share)
        sketch_to_pb(p.window_ms, im.window_ms)
        _classes_to_pb(p.by, im.by)
        if p.excluded is not None:
            im.has_excluded, im.excluded_rank, im.excluded = True, p.excluded[0], p.excluded[1]
        im.top_rank.extend(r for r, _ in p.top)
        im.top_value.extend(v for _, v in p.top)


def from_pb(m: pb.CommSummary) -> CommSummary:
    """ValueError for a summary of another version, malformed, or past what a summary holds (the caller
    counts and drops it)."""
    if m.version != VERSION:
        raise ValueError(f"a communication summary of version {m.version}; this root reads {VERSION}")
    classes = (m.by, *(i.by for i in m.iterations))
    if len(m.iterations) > MAX_ITERATIONS or any(len(c) > MAX_CLASSES for c in classes):
        raise ValueError("a communication summary of more iterations or group classes than a shard sends")
    sketches = [m.share, m.weighted, *(c.sketch for c in m.by)]
    for im in m.iterations:
        sketches += [im.share, im.window_ms, *(c.sketch for c in im.by)]
    if sum(len(sk.counts) for sk in sketches) > MAX_BUCKETS:
        raise ValueError("a communication summary of more sketch buckets than a shard sends")
    s = CommSummary(m.job, m.partition, m.epoch, m.seq, m.ranks, m.ranks_hash, sketch_from_pb(m.share),
                    sketch_from_pb(m.weighted), _classes(m.by), m.windows, _top(m.top_rank, m.top_value))
    for im in m.iterations:
        if im.iteration in s.iterations:
            raise ValueError(f"a communication summary holds iteration {im.iteration} twice")
        s.iterations[im.iteration] = IterationPart(
            im.ranks, im.ranks_hash, sketch_from_pb(im.share), sketch_from_pb(im.window_ms), _classes(im.by),
            im.n_iterations, (im.excluded_rank, im.excluded) if im.has_excluded else None,
            _top(im.top_rank, im.top_value))
    return s

