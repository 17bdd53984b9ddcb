"""Per-window communication figures (perfd.core.winfigures.WindowFigures) on the wire: columns of a
``WindowFigures`` message (perfd.proto), a row per (iteration, rank), and how a shard's figures are
cut into messages the engine takes (a shard of a 100,000-rank job hands on ~25,000 rows an
iteration: ~1.5 MB, over nats-server's 1 MiB message). Pure.
"""

from __future__ import annotations

from collections.abc import Iterator

from perfd.core.winfigures import ABSENT, RankWindow, WindowFigures
from perfd.transport.gen import perfd_pb2 as pb

# Rows a message carries at most: ~60-100 bytes a row (ten varint columns, a few classes), so
# ~400 KB, well under the engine's 1 MiB with the batch's other room.
MAX_ROWS = 4096


def to_pb(figs: WindowFigures, m: pb.WindowFigures) -> None:
    m.job = figs.job
    names: dict[str, int] = {}
    classes: dict[str, list[int]] = {}
    n = 0
    for (it, _), w in sorted(figs.rows.items()):
        m.iteration.append(it)
        m.rank.append(w.rank)
        m.start_ns.append(w.start_ns)
        m.end_ns.append(w.end_ns)
        m.n_iterations.append(w.n_iterations)
        m.comm_ns.append(w.comm_ns)
        m.basis.append(w.basis)
        m.settled.append(w.settled)
        if w.excluded is None:
            m.excluded.append(0)
        else:
            if w.excluded not in names:
                names[w.excluded] = len(names) + 1
                m.excluded_names.append(w.excluded)
            m.excluded.append(names[w.excluded])
        for c, u in w.by:
            col = classes.get(c)
            if col is None:
                col = classes[c] = [ABSENT] * n
            col.append(u)
        n += 1
        for col in classes.values():
            if len(col) < n:
                col.append(ABSENT)
    for c in sorted(classes):
        m.by.add(name=c, union_ns=classes[c])


def check(m: pb.WindowFigures) -> int:
    """Its rows; ValueError for columns of unequal length or an index out of range (what a shard
    handing an agent's figures on as they came checks of them, and :func:`from_pb` first)."""
    n = len(m.iteration)
    cols = (m.rank, m.start_ns, m.end_ns, m.n_iterations, m.comm_ns, m.basis, m.settled, m.excluded)
    if any(len(c) != n for c in cols) or any(len(b.union_ns) != n for b in m.by):
        raise ValueError("window figures' columns are not of one length")
    if m.excluded and max(m.excluded) > len(m.excluded_names):
        x = next(x for x in m.excluded if x > len(m.excluded_names))
        raise ValueError(f"window figures name excluded {x} of {len(m.excluded_names)}")
    return n


def from_pb(m: pb.WindowFigures) -> WindowFigures:
    """ValueError for columns of unequal length or an index out of range (the caller counts it).
    Column at a time (each read whole, the rows made by zip): the root decodes every shard's rows of
    a 100,000-rank job, and a read of one element of a column at a time cost it more than the rest
    of its work on them (perfd bench root-figures)."""
    n = check(m)
    names = list(m.excluded_names)
    excluded = list(m.excluded)
    named: list[str | None] = [None, *names]
    # Each row's (class, union) pairs in the columns' order, those of a class absent from it left out
    by_cols = [(b.name, list(b.union_ns)) for b in m.by]
    bys: list[tuple[tuple[str, int], ...]] = (
        list(zip(*[[(c, u) for u in col] for c, col in by_cols], strict=True)) if by_cols else [()] * n)
    if any(ABSENT in col for _, col in by_cols):
        bys = [b if all(u != ABSENT for _, u in b) else tuple(p for p in b if p[1] != ABSENT) for b in bys]
    its = list(m.iteration)
    ranks = list(m.rank)
    windows = list(map(RankWindow._make, zip(ranks, m.start_ns, m.end_ns, m.n_iterations,
                                             [named[x] for x in excluded], m.comm_ns, bys, m.settled,
                                             m.basis, strict=True)))
    out = WindowFigures(m.job)
    rows = dict(zip(zip(its, ranks, strict=True), windows, strict=True))
    if len(rows) == n:  # every (iteration, rank) once: the join of the rows is the rows
        out.rows = rows
    else:
        for it, w in zip(its, windows, strict=True):
            out.add(it, w)
    return out


def chunks(figs: WindowFigures, rows: int = MAX_ROWS) -> Iterator[WindowFigures]:
    """``figs`` in pieces of at most ``rows`` rows (a join: the pieces merge to ``figs``)."""
    items = sorted(figs.rows.items())
    for k in range(0, len(items), rows):
        yield WindowFigures(figs.job, dict(items[k:k + rows]))


def grouped(raw: list[pb.WindowFigures]) -> Iterator[list[pb.WindowFigures]]:
    """Agents' figures as they came, in groups of at most MAX_ROWS rows (a message each; each came in
    pieces of at most that many: perfd.engine.publisher)."""
    batch: list[pb.WindowFigures] = []
    rows = 0
    for f in raw:
        if batch and rows + len(f.iteration) > MAX_ROWS:
            yield batch
            batch, rows = [], 0
        batch.append(f)
        rows += len(f.iteration)
    if batch:
        yield batch
