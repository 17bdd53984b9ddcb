"""The aggregator's event loop: uvloop where it can be imported, else asyncio's own.

grpc.aio runs on any asyncio loop; uvloop cuts the per-message cost of the gRPC ingest. At 2,000
agent streams on 2 cores (`perfd bench scale --agents 2000`, benchmarks/README.md "Scale") the
aggregator took 0.63 core under uvloop and 0.71 under asyncio's loop, one run each in the same
session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

EVENT_LOOPS = ("auto", "uvloop", "asyncio")  # --event-loop; the first is the default

Runner = Callable[[Coroutine[Any, Any, None]], None]


def event_loop_runner(kind: str) -> tuple[str, Runner]:
    """(name, run function) of the event loop ``kind``: auto takes uvloop when it imports. Raises
    ValueError for an unknown kind, or for uvloop when it cannot be imported."""
    if kind not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {kind!r} (one of {', '.join(EVENT_LOOPS)})")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise ValueError("--event-loop uvloop: uvloop is not installed") from None
        else:
            return "uvloop", uvloop.run
    return "asyncio", asyncio.run
