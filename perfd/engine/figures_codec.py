"""Per-window communication figures (perfd.winfigures.WindowFigures) on the wire: columns of a
``WindowFigures`` message (perfd.proto), a row per (iteration, rank), and how a shard's figures are
cut into messages the engine takes (a shard of a 100,000-rank job hands on ~25,000 rows an
iteration: ~1.5 MB, over nats-server's 1 MiB message). Pure.
"""

from __future__ import annotations

from collections.abc import Iterator

from perfd.transport.gen import perfd_pb2 as pb
from perfd.winfigures import ABSENT, RankWindow, WindowFigures

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


def from_pb(m: pb.WindowFigures) -> WindowFigures:
    """ValueError for columns of unequal length or an index out of range (the caller counts it)."""
    n = len(m.iteration)
    cols = (m.rank, m.start_ns, m.end_ns, m.n_iterations, m.comm_ns, m.basis, m.settled, m.excluded)
    if any(len(c) != n for c in cols) or any(len(b.union_ns) != n for b in m.by):
        raise ValueError("window figures' columns are not of one length")
    names = list(m.excluded_names)
    out = WindowFigures(m.job)
    by = [(b.name, b.union_ns) for b in m.by]
    for i in range(n):
        x = m.excluded[i]
        if x > len(names):
            raise ValueError(f"window figures name excluded {x} of {len(names)}")
        out.add(m.iteration[i], RankWindow(
            m.rank[i], m.start_ns[i], m.end_ns[i], m.n_iterations[i], names[x - 1] if x else None,
            m.comm_ns[i],
            tuple((c, col[i]) for c, col in by if col[i] != ABSENT), m.settled[i], m.basis[i]))
    return out


def chunks(figs: WindowFigures, rows: int = MAX_ROWS) -> Iterator[WindowFigures]:
    """``figs`` in pieces of at most ``rows`` rows (a join: the pieces merge to ``figs``)."""
    items = sorted(figs.rows.items())
    for k in range(0, len(items), rows):
        yield WindowFigures(figs.job, dict(items[k:k + rows]))
