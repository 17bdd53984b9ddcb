"""Interleavings a test makes, not timing: a thread waits at a gate until the test lets it through by
name, and the test waits until a thread has come to the gate (each wait bounded, for a failure only)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

BOUND_S = 30.0  # a failure's bound only: every wait ends when what it waits for has happened


class Gate:
    """Threads that reach it wait until the test lets each in by name."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.arrived: set[str] = set()
        self._open: set[str] = set()

    def pass_through(self) -> None:
        name = threading.current_thread().name
        with self._cv:
            self.arrived.add(name)
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: name in self._open, BOUND_S):
                raise AssertionError(f"{name} was never let through the gate")

    def wait_arrived(self, name: str) -> None:
        with self._cv:
            assert self._cv.wait_for(lambda: name in self.arrived, BOUND_S), f"{name} never reached the gate"

    def open(self, name: str) -> None:
        with self._cv:
            self._open.add(name)
            self._cv.notify_all()


class GatedLock:
    """A lock whose taker first waits at the gate: which thread takes it first is the test's to say,
    and that a thread came to take it is seen (``Gate.wait_arrived``)."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._gate.pass_through()
        self._lock.acquire()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._lock.release()


def started(name: str, fn: Callable[[], Any], out: dict[str, Any]) -> threading.Thread:
    """``fn`` on a thread named ``name`` (what the gates know it by); its result put in ``out[name]``."""
    def body() -> None:
        out[name] = fn()

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t


def joined(t: threading.Thread) -> None:
    t.join(BOUND_S)
    assert not t.is_alive(), f"{t.name} still running"
