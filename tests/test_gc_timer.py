"""The aggregator's collector timing (perfd.aggregator.runtime): every collection's time counted, and
the full collections' apart (what grows with the heap), in the process that asked for it."""

from __future__ import annotations

import gc
import multiprocessing as mp
from typing import Any


def _child(q: Any) -> None:
    from perfd.aggregator import runtime

    runtime.tune_gc()
    before = runtime.gc_full()
    gc.collect(0)
    young = runtime.gc_full()
    gc.collect(2)
    q.put((before, young, runtime.gc_full(), runtime.gc_seconds()))


def test_full_collections_are_timed_apart_from_the_young_ones() -> None:
    ctx = mp.get_context("spawn")  # its own process: the collector's settings are process-wide
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    before, young, full, total = q.get(timeout=60)
    p.join(30)
    assert before is not None and young is not None and full is not None and total is not None
    assert young[1] == before[1]  # a young collection is not a full one
    assert full[1] == young[1] + 1 and full[0] > young[0]
    assert total >= full[0]

