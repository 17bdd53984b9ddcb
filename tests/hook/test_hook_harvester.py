"""The step path / harvester split (CPU only, a scripted fake GPU stream): what the training thread
calls per step, one query settling many steps, records identical to the inline path for a known
event timeline, the bounded deque, the harvester thread's life (close, garbage, atexit, fork)."""

from __future__ import annotations

import gc
import os
import random
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perfd.hook.harvest
import perfd.hook.loader
import perfd.hook.step
from perfd.hook import StepHook, wire

# Event counts below must not depend on timing (tests/hook/conftest.py); a real gap is made by
# resetting ``_end_returned``.
pytestmark = pytest.mark.usefixtures("generous_alias_gap")


def drain(sock: socket.socket) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return out
        recs, problem = wire.split_records(data)
        assert problem is None
        out += recs


def steps_in(recs: list[tuple[int, bytes]]) -> list[wire.StepMsg]:
    return [wire.unpack_step(d) for k, d in recs if k in wire.STEP_KINDS]


def wait_until(cond: Any, timeout_s: float = 10.0) -> None:
    """For what the harvester thread does asynchronously: behaviour, not timing."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Gpu:
    """A fake CUDA stream. ``work(ns)`` enqueues that much GPU time; a marker records the stream
    time at which the GPU will reach it; ``run(k)`` lets the GPU get through the k-th record
    (``auto``: every record is complete at once). Calls are counted by kind and thread."""

    def __init__(self, auto: bool = False) -> None:
        self.auto = auto
        self.clock = 0
        self.recorded = 0
        self.completed = 0
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def marker(self) -> Ev:
        return Ev(self)

    def work(self, ns: int) -> None:
        self.clock += ns

    def run(self, k: int | None = None) -> None:
        self.completed = self.recorded if k is None else k

    def call(self, kind: str) -> None:
        where = "main" if threading.current_thread() is threading.main_thread() else "other"
        with self._lock:
            self.calls[(kind, where)] += 1

    def count(self, kind: str, where: str | None = None) -> int:
        with self._lock:  # the harvester thread may be counting meanwhile
            calls = list(self.calls.items())
        return sum(n for (k, w), n in calls if k == kind and where in (None, w))

    def done(self, seq: int) -> bool:
        return self.auto or seq <= self.completed


class Ev:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.seq = 0
        self.t = 0

    def record(self) -> None:
        g = self.gpu
        g.call("record")
        g.recorded += 1
        self.seq, self.t = g.recorded, g.clock

    def query(self) -> bool:
        self.gpu.call("query")
        return self.gpu.done(self.seq)

    def elapsed_ns(self, end: Ev) -> int | None:
        self.gpu.call("elapsed")
        assert self.gpu.done(self.seq) and self.gpu.done(end.seq), "elapsed before completion: would fail"
        return end.t - self.t


class Clock:
    """``time`` for perfd.hook.step and perfd.hook.harvest (one clock for both): 100 ns per
    perf_counter_ns call, so host times are exact."""

    def __init__(self) -> None:
        self.t = 1_000_000
        self.monotonic = time.monotonic
        self.sleep = time.sleep
        self.thread_time_ns = time.thread_time_ns

    def perf_counter_ns(self) -> int:
        self.t += 100
        return self.t

    def time_ns(self) -> int:
        return 1_700_000_000_000_000_000 + self.t


def nearest_rank(values: list[int], p: int) -> int:
    s = sorted(values)
    return s[max(1, -(-p * len(s) // 100)) - 1]


# --------------------------------------------------------------------------- the step path


def timeline(hook: StepHook, gpu: Gpu) -> None:
    """Step k: 100 ns of GPU input copy, data ready, then k µs of GPU compute."""
    for k in range(1, 7):
        with hook.step():
            gpu.work(100)
            hook.data_ready()
            gpu.work(1000 * k)
        if k == 3:
            gpu.run()  # the GPU catches up mid-way
    gpu.run()
    hook.close()


@pytest.mark.parametrize("data_event", [True, False])
def test_records_for_a_known_timeline_match_the_inline_path(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch, data_event: bool) -> None:
    path, sock = agent
    clock = Clock()
    monkeypatch.setattr(perfd.hook.step, "time", clock)
    monkeypatch.setattr(perfd.hook.harvest, "time", clock)
    runs: dict[str, list[wire.StepMsg]] = {}
    for mode, kw in (("inline", {"harvest_interval_s": 0, "flush_interval_s": 0}),
                     ("thread", {"harvest_interval_s": 3600})):  # the thread sleeps: harvest at close
        gpu = Gpu()
        hook = StepHook(path, warmup_steps=2, cuda=True, rank=4, marker_factory=gpu.marker,
                        tokens_per_step=8192, flops_per_step=2e12, cuda_data_event=data_event,
                        **kw)  # type: ignore[arg-type]
        assert hook.counters()["harvester"] == mode
        timeline(hook, gpu)
        assert hook.internal_errors == 0 and hook.harvest_drops == 0
        runs[mode] = steps_in(drain(sock))
    inline, thread = runs["inline"], runs["thread"]
    window: list[int] = []
    for k, m in enumerate(thread, start=1):
        assert (m.step, m.rank, m.pid, m.step_ns, m.data_wait_ns) == (k, 4, os.getpid(), 100 + 1000 * k, 100)
        assert m.compute_ns == (1000 * k if data_event else None)
        assert m.flags == (wire.FLAG_CUDA | wire.FLAG_HAS_DATA | wire.FLAG_DATA_READY
                           | (wire.FLAG_WARMUP if k <= 2 else 0))
        # Back to back: each step begins at the previous end (one event), its period is its time,
        # and nothing passed outside it (the host's 100 ns between the two calls are in the step).
        assert (m.period_ns, m.outside_ns) == ((None, None) if k == 1 else (m.step_ns, 0))
        if k > 2:
            window.append(m.step_ns)
        assert m.window_n == len(window)
        assert (m.p50_ns, m.p90_ns, m.p99_ns) == (
            tuple(nearest_rank(window, p) for p in (50, 90, 99)) if window else (None, None, None))
        assert (m.tokens_per_step, m.flops_per_step, m.send_drops, m.harvest_drops) == (8192, 2e12, 0, 0)
    # The inline path (harvest in step_end) gives the same records; only the wall-clock end time
    # differs, by the clock reads the inline harvest makes in between.
    assert [m.end_time_ns for m in thread] == sorted(m.end_time_ns for m in thread)
    for m in inline + thread:
        m.end_time_ns = 0
    assert inline == thread and len(thread) == 6


@pytest.mark.usefixtures("no_data_marker")  # a loop whose host never waits for its batch
def test_the_step_path_records_one_event_per_step_and_never_queries(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu()
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)
    assert hook.counters()["harvester"] == "thread"
    for _ in range(40):
        with hook.step():
            hook.data_ready()  # the data event is off by default: a host stamp only
            gpu.work(1000)
    # One boundary event per step (the first step's begin is the only extra one); nothing was
    # queried, measured, encoded or sent on the training thread.
    assert gpu.count("record") == 41 and gpu.count("query") == 0 and gpu.count("elapsed") == 0
    assert hook.steps_reported == 0 and hook.counters()["pending"] == 40 and hook.sender.datagrams == 0
    # The GPU is 11 steps behind: a galloping search from the newest, a few queries, not 40.
    gpu.run(29 + 1)  # through step 29's end (record 1 is step 1's begin)
    assert hook.harvest() == 29
    assert 2 <= gpu.count("query") <= 12
    # It caught up: one query on the newest settles all the rest.
    gpu.run()
    before = gpu.count("query")
    assert hook.harvest() == 11 and gpu.count("query") == before + 1
    assert gpu.count("elapsed") == 40  # one per step: begin to end
    hook.close()
    got = steps_in(drain(sock))
    assert [m.step for m in got] == list(range(1, 41)) and all(m.step_ns == 1000 for m in got)
    assert all(m.compute_ns is None and m.data_wait_ns is not None for m in got)
    assert gpu.count("query", "other") == 0  # the thread never woke: harvest() and close() did it


def test_a_gap_between_steps_records_a_begin_and_a_data_event_when_asked(
        agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600, cuda_data_event=True)
    with hook.step():
        hook.data_ready()
    hook._end_returned = 0  # host work between steps: it could launch GPU work, so a begin of its own
    gpu.work(500)
    with hook.step():
        hook.data_ready()
        gpu.work(700)
    assert gpu.count("record") == 3 + 3
    hook.close()
    assert [(m.step_ns, m.compute_ns) for m in steps_in(drain(sock))] == [(0, 0), (700, 700)]


def test_the_period_spans_the_time_between_steps_and_the_fetch_in_it_is_the_data_wait(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's loop on a GPU: the batch is fetched between two steps while the GPU, done with
    the last step, idles. The step's time is from the previous end event to its own (the idle time
    included: the job's throughput), the time inside the step is its own begin to end, the data wait
    is the host's fetch, and what else passed between the steps is outside."""
    path, sock = agent
    clock = Clock()
    for mod in (perfd.hook.step, perfd.hook.harvest, perfd.hook.loader):
        monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(perfd.hook.step, "_ALIAS_GAP_NS", 2_000)  # a fetch is a real gap
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)

    def fetches() -> Iterator[int]:
        for k in range(3):
            clock.t += 5_000  # the host waits 5 µs for the batch; the GPU idles as long
            gpu.clock += 5_000
            yield k

    batches = iter(hook.loader(fetches()))
    for _ in range(3):
        next(batches)
        clock.t += 300  # the loop's own host work between the steps: outside any step...
        gpu.clock += 300  # ...while the GPU idles
        with hook.step():
            gpu.work(1_000)
    hook.close()
    got = steps_in(drain(sock))
    assert [m.step_ns for m in got] == [1_000] * 3  # begin event (after the fetch) -> end event
    assert got[0].period_ns is None and [m.period_ns for m in got[1:]] == [6_300, 6_300]
    for m in got[1:]:
        assert m.flags & wire.FLAG_FETCH and not m.flags & wire.FLAG_DATA_READY
        assert m.data_wait_ns is not None and 5_000 <= m.data_wait_ns <= 5_000 + 300  # a few clock reads
        # the 300 ns, bounded by the GPU's clock between the steps (which the fake's clock reads, 100 ns
        # each on the host, do not advance): less one read at most
        assert m.outside_ns is not None and 300 - 100 <= m.outside_ns <= 300 + 1_000
    assert gpu.count("record") == 3 * 2  # a begin of its own per step: the fetch could launch GPU work


def test_a_fetch_the_gpu_runs_through_is_no_data_wait(agent: tuple[str, socket.socket],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An asynchronous loop whose GPU is behind: the host fetches the next batch while the GPU still
    runs the work already queued, so the GPU never waits for it. The step's period is the GPU's time
    per step, and the fetch it ran through is not a data wait (only a fetch longer than the GPU's
    queued work would be, by what it outlasted)."""
    path, sock = agent
    clock = Clock()
    for mod in (perfd.hook.step, perfd.hook.harvest, perfd.hook.loader):
        monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(perfd.hook.step, "_ALIAS_GAP_NS", 2_000)
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)
    lag = [0, 0, 3_000]  # the GPU's queued work outlasts the first two fetches, not the third (3 µs)

    def fetches() -> Iterator[int]:
        for k in range(3):
            clock.t += 5_000  # 5 µs on the host; the GPU runs through its queue meanwhile...
            gpu.clock += lag[k]  # ...and idles only past its end
            yield k

    batches = iter(hook.loader(fetches()))
    for _ in range(3):
        next(batches)
        with hook.step():
            gpu.work(20_000)
    hook.close()
    got = steps_in(drain(sock))
    assert [m.period_ns for m in got] == [None, 20_000, 23_000]
    assert [m.data_wait_ns for m in got[1:]] == [0, 3_000]


@pytest.mark.parametrize("gpu_behind", [True, False])
def test_a_wait_for_the_batch_the_gpu_ran_through_is_no_data_wait(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch, gpu_behind: bool) -> None:
    """The host waits 100 µs for its batch inside each step (step_begin() -> data_ready()). An
    asynchronous loop ahead of its GPU: the GPU still runs the work queued before meanwhile, so it never
    waits (the H200: 20 ms waited inside 52 ms steps read 38% data wait, the steps as long as with no
    wait). A loop the GPU keeps up with (it synchronises after each step): the GPU idles as long, a data
    wait. data_ready() records its marker only after such a wait, its compute not reported."""
    path, sock = agent
    clock = Clock()
    for mod in (perfd.hook.step, perfd.hook.harvest):
        monkeypatch.setattr(mod, "time", clock)
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)
    for _ in range(4):
        with hook.step():
            clock.t += 100_000  # the host waits for the batch...
            if not gpu_behind:
                gpu.clock += 100_000  # ...and the GPU, done with the last step, idles as long
            hook.data_ready()
            gpu.work(1_000_000)
        if not gpu_behind:
            clock.t += 1_000_000  # the loop's sync: the host waits for the step's GPU work
    hook.close()
    got = steps_in(drain(sock))[1:]
    assert len(got) == 3 and all(m.compute_ns is None for m in got)  # the marker bounds, not reports
    for m in got:
        if gpu_behind:
            assert m.data_wait_ns == 0 and m.step_ns == 1_000_000, m
        else:
            assert m.data_wait_ns == 100_000 and m.step_ns == 1_100_000, m
    assert gpu.count("record") == 1 + 4 * 2  # the first begin, then each step's marker and end


@pytest.mark.parametrize("gpu_behind", [True, False])
def test_a_fetch_at_the_steps_start_the_gpu_ran_through_is_no_data_wait(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch, gpu_behind: bool) -> None:
    """``with hook.step(): batch = next(it)`` through ``hook.loader``, no data_ready(): the fetch (100
    µs) marks the GPU's clock at its end, and of it the GPU waited only what it idled (none when it ran
    the work queued before meanwhile)."""
    path, sock = agent
    clock = Clock()
    for mod in (perfd.hook.step, perfd.hook.harvest, perfd.hook.loader):
        monkeypatch.setattr(mod, "time", clock)
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)

    def batches() -> Iterator[int]:
        for k in range(4):
            clock.t += 100_000
            if not gpu_behind:
                gpu.clock += 100_000  # the GPU, done with the last step, idles as long
            yield k

    it = iter(hook.loader(batches()))
    for _ in range(4):
        with hook.step():
            next(it)
            gpu.work(1_000_000)
    hook.close()
    got = steps_in(drain(sock))[1:]
    assert len(got) == 3 and all(m.compute_ns is None for m in got)
    for m in got:
        assert m.flags & wire.FLAG_FETCH and not m.flags & wire.FLAG_DATA_READY
        assert m.data_wait_ns == (0 if gpu_behind else 100_000), m
    assert gpu.count("record") == 1 + 4 * 2  # the first begin, then each step's marker and end
    assert perfd.hook.loader.CLOCK.after is None and hook._fetch.after is None  # let go at close()


def test_a_loop_that_synchronises_after_the_step_waits_inside_it_not_outside(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual loop on a GPU: step_end() returns as soon as the step's work is queued, then the loop
    synchronises (``loss.item()``, a device sync) and waits for the GPU to finish that step. The wait
    is between the two calls on the host but inside the step on its own clock: not outside it. Only
    what the host does once the GPU is done (here 400 ns of its own work, the GPU idle) is outside.
    (An H200 loop read 46% of its step outside before, with its data wait and compute summing to
    the step already.)"""
    path, sock = agent
    clock = Clock()
    for mod in (perfd.hook.step, perfd.hook.harvest):
        monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(perfd.hook.step, "_ALIAS_GAP_NS", 2_000)  # the sync is a real gap
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)
    for _ in range(3):
        with hook.step():
            clock.t += 1_000  # the host waits 1 µs for its batch, the GPU idle meanwhile
            gpu.clock += 1_000
            hook.data_ready()
            gpu.work(30_000)  # queued: the host returns from step_end() at once
        clock.t += 30_000  # the sync: the host waits until the GPU has run the step
        clock.t += 400  # the loop's own work after it (logging), the GPU idle
        gpu.clock += 400
    hook.close()
    got = steps_in(drain(sock))
    for m in got[1:]:
        assert m.step_ns == 31_000 and m.period_ns == 31_400
        assert m.data_wait_ns is not None and 1_000 <= m.data_wait_ns <= 1_000 + 500  # a few clock reads
        assert m.outside_ns is not None and 300 <= m.outside_ns <= 400, m.outside_ns
    # On host timing the same loop's gap is all the host's: there the wait is outside the step (its
    # host-timed step ended when step_end() returned), as before.
def test_a_full_deque_drops_the_oldest_or_this_step_and_never_waits(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu()
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, pool_size=4,
                    harvest_interval_s=3600)
    for _ in range(10):  # the GPU never catches up meanwhile
        with hook.step():
            gpu.work(1000)
    assert hook.harvest_drops == 6 and hook.counters()["pending"] == 4
    # The harvester is in a pass (holds the lock): the step path does not wait for it, so the
    # step that has no room is the one dropped.
    assert hook._lock.acquire(timeout=5)
    try:
        with hook.step():
            gpu.work(1000)
    finally:
        hook._lock.release()
    assert hook.harvest_drops == 7 and hook.counters()["pending"] == 4
    assert gpu.count("query") == 0 and hook.internal_errors == 0
    gpu.run()
    hook.close()
    got = steps_in(drain(sock))
    assert [m.step for m in got] == [7, 8, 9, 10] and all(m.step_ns == 1000 for m in got)
    assert got[-1].harvest_drops == 7


def test_an_elapsed_time_not_ready_yet_is_asked_again_later(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu(auto=True)
    ready = False

    class TwoStreams(Ev):
        """The end event reports complete, the begin (on another stream) not yet."""

        def elapsed_ns(self, end: Ev) -> int | None:
            return super().elapsed_ns(end) if ready else None

    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=lambda: TwoStreams(gpu),
                    harvest_interval_s=3600)
    for _ in range(3):
        with hook.step():
            gpu.work(1000)
    assert hook.harvest() == 0 and hook.counters()["pending"] == 3 and hook.internal_errors == 0
    ready = True
    assert hook.harvest() == 3
    hook.close()
    assert [m.step_ns for m in steps_in(drain(sock))] == [1000, 1000, 1000]


def test_the_event_pool_is_never_leaked_whatever_the_call_order() -> None:
    rng = random.Random(11)
    gpu = Gpu()
    hook = StepHook("/nonexistent/perfd.sock", warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    pool_size=5, cuda_data_event=True, harvest_interval_s=3600)
    ops = ["begin", "data", "end", "end", "with", "abandon", "harvest", "run", "run_some", "gap"]
    for _ in range(3000):
        op = rng.choice(ops)
        if op == "begin":
            hook.step_begin()
        elif op == "data":
            hook.data_ready()
        elif op == "end":
            hook.step_end()
        elif op == "with":
            with hook.step():
                gpu.work(rng.randrange(1, 100))
        elif op == "abandon":
            hook.abandon_step()
        elif op == "harvest":
            hook.harvest()
        elif op == "run":
            gpu.run()
        elif op == "run_some":
            gpu.run(max(gpu.completed, gpu.recorded - rng.randrange(0, 4)))
        else:
            hook._end_returned = 0  # as if time passed since the last end
        gpu.work(rng.randrange(0, 50))
        # Every slot (a step's events) is exactly one of: free, pending, held by the harvester,
        # or the open step's; and a step that begins at its predecessor's end event refers to a
        # slot that is not free. (The harvester thread wakes when the deque is half full: look
        # under its lock.)
        with hook._lock:
            free = [id(x) for x in hook._free]
            used = [id(x) for x in hook._pending] + [id(x) for x in (hook._held, hook._cur) if x is not None]
            prevs = {id(x.prev) for x in [*hook._pending, hook._cur] if x is not None and x.prev is not None}
        assert len(free) + len(used) == len(set(free) | set(used)) == len(hook._slots)
        assert not prevs & set(free)
    assert hook.internal_errors == 0 and hook.steps_reported > 100
    hook.close()


# --------------------------------------------------------------------------- the harvester thread


def test_the_harvester_thread_reports_and_stops_at_close(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu(auto=True)
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=0.01)
    for _ in range(30):
        with hook.step():
            gpu.work(1000)
    t = hook._thread
    assert t is not None and t.is_alive() and t.daemon and t.name == "perfd-hook-harvest"
    wait_until(lambda: hook.steps_reported == 30)
    # Queries and elapsed times on the harvester thread only; records on the training thread only.
    assert gpu.count("query", "main") == 0 and gpu.count("elapsed", "main") == 0
    assert gpu.count("query", "other") >= 1 and gpu.count("elapsed", "other") == 30
    assert gpu.count("record", "other") == 0 and hook.harvest_passes >= 1
    hook.close()
    assert not t.is_alive() and hook._thread is None
    assert [m.step for m in steps_in(drain(sock))] == list(range(1, 31))
    hook.close()  # idempotent


def test_close_lets_the_harvester_finish_on_its_own_thread(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = Gpu()  # nothing completes until run()
    hook = StepHook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=3600)
    for _ in range(5):
        with hook.step():
            gpu.work(1000)
    t = hook._thread
    assert t is not None
    threading.Timer(0.05, gpu.run).start()  # the GPU finishes while close() waits
    hook.close(timeout_s=30)
    assert not t.is_alive() and hook.counters()["pending"] == 0
    assert [m.step for m in steps_in(drain(sock))] == [1, 2, 3, 4, 5]
    # The last harvest ran on the harvester thread (which has the CUDA context current), not on
    # the thread that called close() (at exit: the main thread, maybe without it).
    assert gpu.count("query", "main") == 0 and gpu.count("elapsed", "other") == 5
    # A GPU that never gets there: close() gives up after its timeout, the thread ends all the same.
    gpu = Gpu()
    hook = StepHook(path, cuda=True, rank=0, marker_factory=gpu.marker, harvest_interval_s=3600)
    with hook.step():
        pass
    t = hook._thread
    hook.close(timeout_s=0.02)
    assert t is not None and not t.is_alive() and hook.counters()["pending"] == 1


def test_absent_agent_with_the_thread_drops_and_counts(tmp_path: Path) -> None:
    gpu = Gpu(auto=True)
    hook = StepHook(str(tmp_path / "nobody.sock"), cuda=True, rank=0, marker_factory=gpu.marker,
                    harvest_interval_s=0.005, flush_interval_s=0.001)
    for _ in range(200):
        with hook.step():
            pass
    hook.close()
    c = hook.counters()
    assert c["steps_reported"] == 200 and c["sent"] == 0 and c["send_drops"] == 200
    assert c["send_drop_reasons"] == {"agent_absent": 200} and c["internal_errors"] == 0


def test_profile_range_with_the_thread(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    calls: list[tuple[str, int, bool]] = []
    hook: StepHook

    def start() -> int:
        calls.append(("start", hook.steps_begun + 1, threading.current_thread() is threading.main_thread()))
        return 0

    def stop() -> int:
        calls.append(("stop", hook.steps_begun, threading.current_thread() is threading.main_thread()))
        return 0

    hook = StepHook(path, warmup_steps=0, cuda=True, rank=1, marker_factory=Gpu(auto=True).marker,
                    profiler=(start, stop), harvest_interval_s=3600)
    with hook.step():
        pass
    addr = hook.sender.address()
    assert addr
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(7, start_step=3, num_steps=2)), addr)
    for _ in range(5):
        hook._next_poll = 0  # poll at every step (the 50 ms throttle is wall-clock)
        with hook.step():
            pass
    # cudaProfilerStart/Stop at the exact boundaries, on the training thread.
    assert calls == [("start", 3, True), ("stop", 4, True)]
    got: list[tuple[int, bytes]] = []

    def statuses() -> list[tuple[str, int, int]]:
        got.extend(drain(sock))
        return [(wire.PROFILE_STATE_NAMES[s.state], s.request_id, s.step)
                for s in (wire.unpack_profile_status(d) for k, d in got if k == wire.KIND_PROFILE_STATUS)]

    # The statuses wake the sleeping harvester, which sends them.
    wait_until(lambda: len(statuses()) == 3)
    assert statuses() == [("accepted", 7, 3), ("started", 7, 3), ("stopped", 7, 4)]
    hook.close()
    flagged = [m.step for m in steps_in(got + drain(sock)) if m.flags & wire.FLAG_PROFILING]
    assert flagged == [3, 4]


@pytest.mark.slow
def test_a_dropped_hook_ends_its_thread() -> None:
    hook = StepHook("/nonexistent/perfd.sock", cuda=True, rank=0, marker_factory=Gpu(auto=True).marker,
                    harvest_interval_s=0.01)
    hook.step_begin()
    hook.step_end()
    t = hook._thread
    assert t is not None and t.is_alive()
    del hook
    gc.collect()
    t.join(10)
    assert not t.is_alive()


_EXIT_CHILD = """
import sys
from perfd.hook import HostMarker, StepHook
hook = StepHook(sys.argv[1], cuda=True, marker_factory=HostMarker, rank=0, warmup_steps=0,
                harvest_interval_s=3600)
for _ in range(5):
    with hook.step():
        pass
assert hook.counters()["harvester"] == "thread" and hook.steps_reported == 0
# no close(): the atexit handler reports and sends, and stops the thread
"""


def test_interpreter_exit_closes_the_hook(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    subprocess.run([sys.executable, "-c", _EXIT_CHILD, path], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[2])
    assert [m.step for m in steps_in(drain(sock))] == [1, 2, 3, 4, 5]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_neither_hangs_nor_sends_twice(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    hook = StepHook(path, cuda=True, rank=0, warmup_steps=0, marker_factory=Gpu(auto=True).marker,
                    harvest_interval_s=3600)
    unused = StepHook(path, cuda=False, rank=0, flush_interval_s=0)  # not used before the fork
    for _ in range(3):
        with hook.step():
            pass
    assert hook.counters()["pending"] == 3
    assert hook._lock.acquire(timeout=5)  # as if the harvester were mid-pass at the fork
    try:
        with warnings.catch_warnings():  # Python >= 3.12 warns about fork() beside threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: a DataLoader worker, say
            code = 3
            try:
                relocked = hook._lock.acquire(blocking=False)  # a new lock, not the one held
                if relocked:
                    hook._lock.release()
                with hook.step():
                    pass
                hook.harvest()
                hook.flush()
                hook.close()
                with unused.step():  # an unused hook works in the child, under its own pid
                    pass
                unused.close()
                ok = relocked and not hook.enabled and hook.steps_begun == 3 and unused.pid == os.getpid()
                code = 0 if ok else 2
            finally:
                os._exit(code)
    finally:
        hook._lock.release()
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "forked child hung"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    hook.close()
    got = steps_in(drain(sock))
    assert sorted((m.pid, m.step) for m in got) == sorted([(os.getpid(), s) for s in (1, 2, 3)] + [(pid, 1)])


def test_harvest_interval_and_mode_defaults() -> None:
    gpu = Gpu(auto=True)
    modes = {
        "cuda, batched": StepHook("/x", marker_factory=gpu.marker, cuda=True),
        "cuda, flush 0": StepHook("/x", marker_factory=gpu.marker, cuda=True, flush_interval_s=0),
        "host": StepHook("/x", cuda=False),
        "host, forced": StepHook("/x", cuda=False, harvest_interval_s=0.05),
        "cuda, forced inline": StepHook("/x", marker_factory=gpu.marker, cuda=True, harvest_interval_s=0),
    }
    assert {k: h.counters()["harvester"] for k, h in modes.items()} == {
        "cuda, batched": "thread", "cuda, flush 0": "inline", "host": "inline", "host, forced": "thread",
        "cuda, forced inline": "inline"}
    assert modes["cuda, batched"].harvest_interval_s == 0.05
    for h in modes.values():
        h.close()
    wrong = StepHook("/x", cuda=False, harvest_interval_s=-1)  # said once; the default used, never a raise
    assert wrong.counters()["harvester"] == "inline"
    wrong.close()
