"""The aggregator's event loop: uvloop where it can be imported, else asyncio's own.

grpc.aio runs on any asyncio loop; uvloop's costs less per message. The gRPC message path alone
(`python benchmarks/grpc_loop_bench.py`: a bare grpc.aio server, 1,000 streams each sending a 2 KB
message a second, 2-core VM): 0.137 core under uvloop, 0.155 under asyncio's loop, mean of 7 pairs,
uvloop lower in 6 (-11%). That path is about half of the aggregator's CPU at 2,000 agents, so the
aggregator gains ~5%, below the run-to-run spread of `perfd bench scale` on that VM (±0.07 core).
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
