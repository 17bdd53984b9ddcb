"""Fixtures shared by the step hook's tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfd.hook.step
from tests.hook.sim_clock import SimClock


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bare, non-blocking receiving socket standing in for the agent: (its path, the socket)."""
    path = str(tmp_path / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield path, sock
    sock.close()


@pytest.fixture
def generous_alias_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook reuses the previous end marker as the next begin when step_begin() follows
    step_end() within 2 µs of host time. A loaded CI machine can miss that by chance, which would
    make event counts depend on timing: the tests that count events widen the window to 50 ms (the
    ones that need a real gap sleep well past it, or reset ``_end_returned``)."""
    monkeypatch.setattr(perfd.hook.step, "_ALIAS_GAP_NS", 50_000_000)


@pytest.fixture
def no_data_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """data_ready() records the step's data marker after a host wait of DATA_MARK_MIN_NS (50 µs) even
    without cuda_data_event; a busy CI host can preempt a loop that long between step_begin() and
    data_ready() (a fresh clone's CI: 42 records for 41; a trace that stopped after its loop). The
    tests that count markers, or need compute absent, hold the threshold out of reach."""
    monkeypatch.setattr(perfd.hook.step, "DATA_MARK_MIN_NS", 1 << 62)


@pytest.fixture
def sim_clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    """The hook's host clock, simulated (tests/hook/sim_clock.py): the test's loop advances it where a
    real loop would spend time, and no test waits for time to pass."""
    return SimClock().install(monkeypatch)
