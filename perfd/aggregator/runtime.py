"""The aggregator process's runtime: the garbage collector's thresholds (and the time it takes),
the interpreter's switch interval, and which gRPC core experiments it runs with. Process-wide
settings, made by `perfd aggregator` only — a test or a library user running an Aggregator in its own
process keeps its own.

Garbage collector. Every open agent stream keeps a read pending for about its agent's batch
interval. With Python's default thresholds (700, 10, 10) those objects outlive two young
collections and are promoted: at 2,000 agents ~27k objects a second reached the oldest generation,
so a full collection (~220 ms, the event loop stalled meanwhile) ran every ~5 s and the collector
took 0.095 core in all. Young collections every 20,000 allocations let the pending reads die
young: 0.001–0.013 core (benchmarks/README.md, "Scale"). Cyclic garbage waits a little longer, a few MB
at most.

Switch interval. The aggregator's event loop (gRPC ingest, or the engine root's reads) waits on I/O
and runs short callbacks; beside it, threads run long CPU work (the refresh's analyses, the collective
analysis' worker: ~20 s of CPU at 100,000 ranks). Each time the loop gives the interpreter's lock up
for I/O it waits, to take it back, until the thread holding it is asked to give it up: Python's
switch interval, 5 ms by default. An asyncio loop reading a socket beside one CPU-bound thread read
793 messages a second at 5 ms, 4,225 at 1 ms and 5,112 at 0.5 ms (5,091 with no such thread), the CPU
thread doing 97.5, 100 and 80 rounds a second (``perfd bench switch``, this 2-core VM, 2026-11-27:
benchmarks/results/switch_2core.json). So the loop is served first, and the analyses take what is
left. ``--gil-switch-ms`` sets it. What it changed end to end is within the noise so far: the engine
root of a 100,000-rank job with collective records, saturated at one core either way
(docs/evidence/entries/48-scale-history.md).

gRPC core. By default gRPC 1.85 accepts and serves server connections on its EventEngine thread
pool; with the experiment ``event_engine_listener`` off, on the poller the Python binding drives.
For a grpc.aio server of many long-lived streams the second costs less: a bare server of 1,000
streams of a message a second took 0.102 core against 0.137, lower in 3 of 3 rounds
(benchmarks/grpc_loop_bench.py --grpc-experiments). An operator who sets GRPC_EXPERIMENTS keeps
their own.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

GC_THRESHOLDS = (20_000, 20, 10)
SWITCH_INTERVAL_S = 0.0005
GRPC_EXPERIMENTS = "-event_engine_listener"

_spent = [0.0]  # seconds spent collecting since tune_gc
_full = [0.0, 0.0]  # ... of which in full collections (the oldest generation's), and how many
_started = [0.0]


def _timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        took = time.perf_counter() - _started[0]
        _spent[0] += took
        if info.get("generation") == 2:  # what grows with the heap: every tracked object walked
            _full[0] += took
            _full[1] += 1


def tune_gc() -> None:
    """Set GC_THRESHOLDS, move what start-up made (modules, the rule pack: it lives as long as the
    process) out of the collector's reach, and time every collection from now on. For the
    aggregator process only: a test running an Aggregator in its own process keeps its collector."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if _timer not in gc.callbacks:
        gc.callbacks.append(_timer)


def tune_switch_interval(seconds: float = SWITCH_INTERVAL_S) -> None:
    """The interpreter's switch interval for this process (the aggregator's only: see the module)."""
    sys.setswitchinterval(seconds)


def gc_seconds() -> float | None:
    """Seconds the collector has run since tune_gc; None if it was not called (not timed)."""
    return _spent[0] if _timer in gc.callbacks else None


def gc_full() -> tuple[float, int] | None:
    """Of those, the seconds in full collections and their number; None if not timed."""
    return (_full[0], int(_full[1])) if _timer in gc.callbacks else None


def grpc_experiments() -> str | None:
    """Set GRPC_EXPERIMENTS for this process unless it is set; the value in effect, or None when
    grpc is already imported (its core has read the variable: too late to choose)."""
    if "grpc" in sys.modules:
        return None
    return os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
