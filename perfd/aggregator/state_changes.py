"""The state's change count: what a job's snapshot (perfd.aggregator.snapshot) is built at.

Every write path of the aggregator's state is a method marked :func:`writes`: the ingest side's
(perfd.aggregator.state_ingest: what the transport, the engine's root and the durable replay call),
the analysis pass's writes of a job's incidents (perfd.aggregator.job_analyses) and the stall watch's
tick (perfd.aggregator.stalls). Each moves the count once it returns (or raised half-way). A snapshot
built at one count is built anew when asked for at another, so nothing a reader gets is staler than
the state; nothing else moves the count, so a snapshot is rebuilt only after a write.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar


class Changes:
    """A counter moved by every write of the state (ingest, the analysis pass, the stall watch all run
    in threads of their own: moved under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def bump(self) -> None:
        with self._lock:
            self._count += 1


class Writer(Protocol):
    @property
    def changes(self) -> Changes: ...


W = TypeVar("W", bound=Writer)
P = ParamSpec("P")
R = TypeVar("R")

_WRITES: set[Callable[..., object]] = set()


def writes(method: Callable[Concatenate[W, P], R]) -> Callable[Concatenate[W, P], R]:
    """Mark a method of a part that writes what a job's snapshot shows: the part's ``changes`` move
    once it returns, or raised (a write may have been half done)."""

    @functools.wraps(method)
    def write(self: W, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        finally:
            self.changes.bump()

    _WRITES.add(write)
    return write


def is_write(method: object) -> bool:
    """Whether ``method`` (a function of a class) is marked :func:`writes`."""
    return method in _WRITES
