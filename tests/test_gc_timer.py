"""The aggregator's collector timing (perfd.aggregator.runtime): every collection's time counted, and
the full collections' apart (what grows with the heap), in the process that asked for it.

Run in the test's process: the collector's settings are process-wide, so the test sets them as
tune_gc sets them and puts back what it found (thresholds, frozen objects, callbacks), and holds the
automatic collections off meanwhile: the collections counted are the test's own."""

from __future__ import annotations

import gc

from perfd.aggregator import runtime


def test_full_collections_are_timed_apart_from_the_young_ones() -> None:
    thresholds, callbacks, enabled = gc.get_threshold(), list(gc.callbacks), gc.isenabled()
    frozen = gc.get_freeze_count()  # what another freeze left: kept frozen
    gc.disable()
    try:
        runtime.tune_gc()
        before = runtime.gc_full()
        gc.collect(0)
        young = runtime.gc_full()
        gc.collect(2)
        full, total = runtime.gc_full(), runtime.gc_seconds()
    finally:
        gc.callbacks[:] = callbacks
        gc.set_threshold(*thresholds)
        if not frozen:
            gc.unfreeze()
        if enabled:
            gc.enable()
    assert before is not None and young is not None and full is not None and total is not None
    assert young[1] == before[1]  # a young collection is not a full one
    assert full[1] == young[1] + 1 and full[0] > young[0]
    assert total >= full[0]
