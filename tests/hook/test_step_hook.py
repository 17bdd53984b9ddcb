"""StepHook: send/drop accounting, harvesting, warm-up, percentiles, profile control (CPU only)."""

from __future__ import annotations

import functools
import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.hook import RollingPercentiles, StepHook, wire
from tests.hook.sim_clock import SimClock
from tests.procs import wait_for

Hook = functools.partial(StepHook, flush_interval_s=0)  # one datagram per record: tests read at once


# Event counts below must not depend on timing (tests/hook/conftest.py).
pytestmark = pytest.mark.usefixtures("generous_alias_gap")


def drain(sock: socket.socket) -> list[tuple[bytes, Any]]:
    out = []
    while True:
        try:
            out.append(sock.recvfrom(65536))
        except BlockingIOError:
            return out


def records(msgs: list[tuple[bytes, Any]]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for d, _ in msgs:
        recs, problem = wire.split_records(d)
        assert problem is None
        out += recs
    return out


def steps_of(msgs: list[tuple[bytes, Any]]) -> list[wire.StepMsg]:
    return [wire.unpack_step(d) for k, d in records(msgs) if k in wire.STEP_KINDS]


def run(hook: StepHook, n: int, work_s: float = 0.0, data_s: float = 0.0,
        clock: SimClock | None = None) -> None:
    """n steps; each waits ``data_s`` for its data, then works ``work_s``, on the simulated ``clock``."""
    assert clock is not None or not (work_s or data_s), "time passes on the simulated clock"
    for _ in range(n):
        with hook.step():
            if clock is not None:
                clock.advance(data_s)
            hook.data_ready()
            if clock is not None:
                clock.advance(work_s)


# --------------------------------------------------------------------------- agent absent / slow / present


def test_agent_absent_steps_are_counted_as_dropped(tmp_path: Path) -> None:
    # What a step costs the loop with the agent absent is `perfd bench hook` ("agent absent"): a figure
    # of the machine. Here: every step is counted as dropped for that reason, and nothing else happens.
    hook = StepHook(str(tmp_path / "nobody.sock"), cuda=False, rank=0)
    run(hook, 2000)
    hook.close()
    c = hook.counters()
    assert c["steps_reported"] == 2000 and c["sent"] == 0 and c["internal_errors"] == 0
    assert c["send_drops"] == 2000 and c["send_drop_reasons"] == {"agent_absent": 2000}


def test_agent_appears_after_backoff(tmp_path: Path) -> None:
    """Steps sent before the agent listens are held and delivered, oldest first, once it does (a job
    started before its agent once lost its first 35 steps silently)."""
    path = str(tmp_path / "late.sock")
    hook = Hook(path, cuda=False, rank=0)
    hook.sender.retry_ns = 0  # retry at once, for the test
    run(hook, 3)
    assert hook.counters()["held"] == 3 and hook.counters()["send_drops"] == 0
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        run(hook, 3)
        got = steps_of(drain(sock))
        assert [m.step for m in got] == [1, 2, 3, 4, 5, 6]
        assert hook.sender.drops == {} and all(m.send_drops == 0 for m in got)
        c = hook.counters()
        assert c["held"] == 0 and c["delivered_late"] == 3 and c["sent"] == 6
    finally:
        sock.close()


def test_a_pause_announced_while_the_agent_is_away_comes_late_in_its_place(tmp_path: Path) -> None:
    """A checkpoint's begin and end, announced while the agent is absent (or too busy to read, as a loaded
    machine makes it), are held with the steps and reach it in the order they happened, once it reads:
    dropped, the save's steps would read as a stall (a full suite on 2 cores lost one this way)."""
    path = str(tmp_path / "late.sock")
    hook = Hook(path, cuda=False, rank=0)
    hook.sender.retry_ns = 0
    run(hook, 2)
    with hook.phase("checkpoint"):
        pass
    run(hook, 1)
    assert hook.sender.drops == {} and hook.counters()["held"] == 5  # 3 steps, the phase's 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        run(hook, 1)
        got = [(k, wire.unpack_step(d).step if k in wire.STEP_KINDS else wire.unpack_phase(d).state)
               for k, d in records(drain(sock)) if k in (*wire.STEP_KINDS, wire.KIND_PHASE)]
        kinds = [k if k == wire.KIND_PHASE else "step" for k, _ in got]
        assert kinds == ["step", "step", wire.KIND_PHASE, wire.KIND_PHASE, "step", "step"], got
        assert [v for k, v in got if k == wire.KIND_PHASE] == [wire.PHASE_BEGIN, wire.PHASE_END]
        assert hook.sender.drops == {}
    finally:
        sock.close()


@pytest.mark.parametrize("harvest_interval_s", [0.0, 0.05], ids=["inline", "harvester-thread"])
def test_what_a_busy_agent_left_held_reaches_it_during_the_pause_not_after(
        tmp_path: Path, harvest_interval_s: float) -> None:
    """Steps and a checkpoint's announcement held while the agent was away (or too busy to read), then
    the loop pauses: they reach the agent as soon as it reads, while the pause goes on, not at the
    loop's next step. Held through the pause, the steps before it and its announcement came after it
    and the aggregator opened a stall (a loaded suite run: "no record arrived for 14 s after iteration
    548, but the records' own times show no gap"). Inline, a drainer thread tries them; with a
    harvester thread, its passes do; either ends with nothing held."""
    path = str(tmp_path / "late.sock")
    hook = Hook(path, cuda=False, rank=0, harvest_interval_s=harvest_interval_s)
    hook.sender.retry_ns = 0
    run(hook, 2)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with hook.phase("checkpoint"):  # the pause: no step, no send from the loop until it ends
            wait_for(lambda: hook.counters()["held"] >= 3, 10, "2 steps and the announcement held")
            sock.bind(path)
            sock.setblocking(False)
            got: list[tuple[int, bytes]] = []

            def arrived() -> bool:
                got.extend(records(drain(sock)))
                return sum(1 for k, _ in got if k == wire.KIND_PHASE) >= 1
            wait_for(arrived, 10, "the held steps and the announcement, during the pause")
            kinds = [k if k == wire.KIND_PHASE else "step" for k, _ in got
                     if k in (*wire.STEP_KINDS, wire.KIND_PHASE)]
            want: list[object] = ["step", "step", wire.KIND_PHASE]
            if harvest_interval_s:  # the announcement may go before steps the thread had not harvested
                assert sorted(kinds, key=str) == sorted(want, key=str), kinds  # yet (it names its step)
            else:
                assert kinds == want, kinds
            begin = next(d for k, d in got if k == wire.KIND_PHASE)
            assert wire.unpack_phase(begin).state == wire.PHASE_BEGIN
            wait_for(lambda: hook.counters()["held"] == 0 and hook._drainer is None, 10, "nothing held")
        hook.close()
        assert hook.sender.drops == {}
        assert not [t for t in threading.enumerate() if t.name == "perfd-hook-drain"]
    finally:
        hook.close()
        sock.close()


def test_the_backlog_is_bounded_and_what_it_loses_is_counted(tmp_path: Path) -> None:
    path = str(tmp_path / "late.sock")
    hook = Hook(path, cuda=False, rank=0)
    hook.sender.retry_ns = 0
    hook.sender.backlog_max = 5  # perfd.core.limits.HOOK_BACKLOG_RECORDS, small for the test
    run(hook, 8)
    assert hook.counters()["held"] == 5 and hook.sender.drops == {"agent_absent": 3}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        run(hook, 1)
        got = steps_of(drain(sock))
        # The oldest three went; the newest five come late, then step 9, which says what was lost.
        assert [m.step for m in got] == [4, 5, 6, 7, 8, 9] and got[-1].send_drops == 3
    finally:
        sock.close()
    hook2 = Hook(str(tmp_path / "never.sock"), cuda=False, rank=0)
    run(hook2, 4)
    hook2.close()  # never delivered: counted as dropped at close
    assert hook2.counters()["send_drops"] == 4 and hook2.counters()["held"] == 0


def test_slow_agent_never_blocks_the_loop(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent  # bound, never read: its queue fills (net.unix.max_dgram_qlen)
    hook = Hook(path, cuda=False, rank=0)
    # A blocking send would never return (the agent never reads): that the loop ends is the proof. Its
    # cost on the loop's thread is `perfd bench hook` ("agent slow"): a figure, not asserted here.
    run(hook, 3000)
    c = hook.counters()
    # What the full queue refused is held for later (bounded), past the bound dropped and counted.
    assert c["held"] > 0 and c["held"] + c["send_drop_reasons"].get("agent_busy", 0) > 0
    assert c["sent"] + c["send_drops"] + c["held"] == 3000 and c["internal_errors"] == 0
    got = steps_of(drain(sock))
    assert len(got) == c["sent"] and [m.step for m in got] == list(range(1, len(got) + 1))


class _DrainClock:
    """The sender's ``time``: its monotonic clock simulated, each sleep the agent's turn (``reads``:
    whether the agent reads its queue then) and that long on the clock."""

    def __init__(self, sock: socket.socket, reads: bool) -> None:
        self.sock, self.reads, self.now = sock, reads, time.monotonic()
        self.got: list[wire.StepMsg] = []
        self.sleeps = 0

    def monotonic(self) -> float:
        return self.now

    def monotonic_ns(self) -> int:
        return int(self.now * 1e9)

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s
        if self.reads:
            self.got.extend(steps_of(drain(self.sock)))


@pytest.mark.parametrize("reads", [True, False], ids=["agent-catches-up", "agent-stuck"])
def test_at_close_what_a_busy_agent_was_not_given_is_tried_again_for_a_bounded_while(
        agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch, reads: bool) -> None:
    """The job's last steps, held while its agent was busy (its queue full), go once the agent reads
    again, however late in the close (one try at the close is the likely cause of a loaded test's job
    losing its last 4 of 60 steps); an agent that never reads costs the close HOOK_CLOSE_DRAIN_S, then
    they are dropped and counted."""
    from perfd.core.limits import HOOK_CLOSE_DRAIN_S
    from perfd.hook import sender

    path, sock = agent  # bound; read only where the test says
    hook = Hook(path, cuda=False, rank=0)
    run(hook, 300)
    c = hook.counters()
    assert c["held"] > 0 and c["send_drops"] == 0, c
    clock = _DrainClock(sock, reads)
    monkeypatch.setattr(sender, "time", clock)
    hook.close()
    c = hook.counters()
    if reads:
        got = [m.step for m in clock.got + steps_of(drain(sock))]
        assert got == list(range(1, 301)) and c["send_drops"] == 0 and c["held"] == 0, c
    else:
        assert c["send_drop_reasons"] == {"agent_busy": c["send_drops"]} and c["send_drops"] > 0, c
        polls = HOOK_CLOSE_DRAIN_S / sender._DRAIN_POLL_S
        assert c["held"] == 0 and clock.sleeps == pytest.approx(polls, abs=2)


def test_present_agent_gets_every_step(agent: tuple[str, socket.socket], sim_clock: SimClock) -> None:
    path, sock = agent
    hook = Hook(path, warmup_steps=2, tokens_per_step=4096, flops_per_step=1.5e15, cuda=False, rank=3)
    run(hook, 6, work_s=0.002, data_s=0.001, clock=sim_clock)
    msgs = drain(sock)
    got = steps_of(msgs)
    assert [m.step for m in got] == [1, 2, 3, 4, 5, 6]
    m = got[-1]
    assert m.rank == 3 and m.pid == os.getpid() and m.tokens_per_step == 4096 and m.flops_per_step == 1.5e15
    assert m.flags & wire.FLAG_HAS_DATA and not m.flags & wire.FLAG_CUDA
    assert (m.data_wait_ns, m.compute_ns, m.step_ns) == (1_000_000, 2_000_000, 3_000_000)
    assert abs(m.end_time_ns / 1e9 - time.time()) < 5
    assert msgs[0][1] == hook.sender.address()  # the agent can answer to this address


# --------------------------------------------------------------------------- warm-up and percentiles


def test_warmup_is_reported_but_excluded_from_percentiles(agent: tuple[str, socket.socket],
                                                         sim_clock: SimClock) -> None:
    path, sock = agent
    hook = Hook(path, warmup_steps=3, cuda=False, rank=0)
    run(hook, 3, work_s=0.03, clock=sim_clock)  # slow warm-up steps (compilation, allocator)
    got = steps_of(drain(sock))  # drain often: a datagram receiver queues only ~10 (max_dgram_qlen)
    run(hook, 10, work_s=0.001, clock=sim_clock)
    got += steps_of(drain(sock))
    assert [bool(m.flags & wire.FLAG_WARMUP) for m in got] == [True] * 3 + [False] * 10
    assert got[2].p50_ns is None and got[2].window_n == 0
    last = got[-1]
    assert last.window_n == 10
    assert last.p99_ns == 1_000_000  # no warm-up step in there
    assert last.p50_ns is not None and last.p90_ns is not None and last.p50_ns <= last.p90_ns <= last.p99_ns


def test_rolling_percentiles_match_a_brute_force_reference() -> None:
    rng = random.Random(7)
    rp = RollingPercentiles(window=50)
    values: list[int] = []
    for _ in range(500):
        v = rng.randrange(1_000_000)
        rp.add(v)
        values.append(v)
        win = sorted(values[-50:])
        for p in (50, 90, 99):
            k = max(1, -(-p * len(win) // 100))
            assert rp.percentile(p) == win[k - 1]
    assert len(rp) == 50
    assert RollingPercentiles(3).percentile(50) is None
    small = RollingPercentiles(10)
    for v in (5, 1, 3):
        small.add(v)
    assert (small.percentile(0), small.percentile(50), small.percentile(100)) == (1, 3, 5)
    with pytest.raises(ValueError):
        RollingPercentiles(0)


# --------------------------------------------------------------------------- harvesting with fake events


class FakeGpu:
    """Events complete when the fake GPU has processed them: ``advance(k)`` completes k records."""

    def __init__(self) -> None:
        self.recorded = 0
        self.completed = 0
        self.queries = 0

    def marker(self) -> FakeEvent:
        return FakeEvent(self)

    def advance(self, k: int = 1 << 30) -> None:
        self.completed = min(self.recorded, self.completed + k)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.seq = 0

    def record(self) -> None:
        self.gpu.recorded += 1
        self.seq = self.gpu.recorded

    def query(self) -> bool:
        self.gpu.queries += 1
        return self.seq <= self.gpu.completed

    def elapsed_ns(self, end: FakeEvent) -> int:
        assert self.query() and end.query(), "elapsed read before completion: would block"
        return (end.seq - self.seq) * 1000


def test_harvest_waits_for_query_and_reports_in_order(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, cuda_data_event=True)
    for _ in range(3):
        with hook.step():
            hook.data_ready()
    # Back to back: step 1 records begin, data, end; steps 2 and 3 reuse the previous end as
    # their begin and record data and end only.
    assert gpu.recorded == 7
    assert steps_of(drain(sock)) == [] and hook.counters()["pending"] == 3
    gpu.advance(5)  # steps 1 and 2 complete, step 3 not yet
    assert hook.harvest() == 2
    got = steps_of(drain(sock))
    assert [m.step for m in got] == [1, 2] and all(m.flags & wire.FLAG_CUDA for m in got)
    assert [(m.step_ns, m.compute_ns) for m in got] == [(2000, 1000), (2000, 1000)]
    gpu.advance()
    with hook.step():  # no data_ready this time
        pass
    # step_end never queries the end it has just recorded: step 3 is reported, step 4 waits.
    assert [m.step for m in steps_of(drain(sock))] == [3]
    gpu.advance()
    hook.close()
    (m,) = steps_of(drain(sock))
    assert m.step == 4 and m.step_ns == 1000 and m.data_wait_ns is None and not m.flags & wire.FLAG_HAS_DATA
    assert hook.alias_misses == 0


def test_a_gap_between_steps_records_a_real_begin(agent: tuple[str, socket.socket],
                                                  sim_clock: SimClock) -> None:
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, cuda_data_event=False)
    with hook.step():
        pass
    sim_clock.advance(0.2)  # host work between steps (it could launch GPU work): no reuse
    with hook.step():
        pass
    with hook.step():
        pass
    assert gpu.recorded == 2 + 2 + 1
    gpu.advance()
    hook.close()
    assert [m.step_ns for m in steps_of(drain(sock))] == [1000, 1000, 1000]


def test_aliasing_survives_drops_and_a_user_harvest_mid_step(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, pool_size=3,
                cuda_data_event=False)
    for _ in range(8):  # the GPU never catches up: the oldest are dropped, markers handed over
        with hook.step():
            pass
    gpu.advance()
    hook.step_begin()  # open step aliasing the last end ...
    hook.harvest()  # ... while the user harvests: the marker goes to the open step
    hook.step_end()
    gpu.advance()
    hook.close()
    got = steps_of(drain(sock))
    assert hook.alias_misses == 0 and hook.harvest_drops > 0
    assert [m.step for m in got] == list(range(10 - len(got), 10))
    assert all(m.step_ns == 1000 for m in got)


@pytest.mark.usefixtures("no_data_marker")  # no host wait long enough for the marker that bounds it
def test_without_the_data_event_compute_is_absent(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, cuda_data_event=False)
    with hook.step():
        hook.data_ready()
    assert gpu.recorded == 2  # begin and end only
    gpu.advance()
    hook.harvest()
    (m,) = steps_of(drain(sock))
    assert m.step_ns == 1000 and m.data_wait_ns is not None and m.compute_ns is None


def test_pool_exhaustion_drops_the_oldest_and_counts(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, warmup_steps=0, cuda=True, rank=0, marker_factory=gpu.marker, pool_size=4)
    for _ in range(10):  # the GPU never catches up meanwhile
        with hook.step():
            pass
    assert hook.harvest_drops == 6  # 4 pending at most: from step 5 on, each end drops the oldest
    gpu.advance()
    hook.harvest()
    got = steps_of(drain(sock))
    assert [m.step for m in got] == [7, 8, 9, 10] and got[-1].harvest_drops == 6


def test_close_waits_only_up_to_its_timeout(agent: tuple[str, socket.socket]) -> None:
    path, _ = agent
    gpu = FakeGpu()
    hook = Hook(path, cuda=True, rank=0, marker_factory=gpu.marker)
    with hook.step():
        pass
    t0 = time.monotonic()
    hook.close(timeout_s=0.05)
    # It waited its timeout (its deadline is on the monotonic clock read after t0: an order, not a
    # speed), and not for the pending marker, which never completes: that it returned at all says so
    # (the test's own timeout bounds a close that would not). No upper bound on the seconds: what a
    # loaded machine adds to them is the machine's.
    assert time.monotonic() - t0 >= 0.05
    assert hook.counters()["pending"] == 1


# --------------------------------------------------------------------------- API misuse never raises


def test_unpaired_calls_and_exceptions_in_the_step(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    hook = Hook(path, warmup_steps=0, cuda=False, rank=0)
    hook.step_end()  # no open step
    hook.data_ready()  # no open step: ignored
    hook.step_begin()
    hook.step_begin()  # twice: the first is dropped
    hook.step_end()
    with pytest.raises(ZeroDivisionError), hook.step():
        _ = 1 / 0  # the step is abandoned, the exception is the loop's own
    with hook.step(step=100):
        pass
    assert [m.step for m in steps_of(drain(sock))] == [2, 100]
    assert hook.unpaired == 2 and hook.internal_errors == 0


def test_a_broken_marker_is_counted_not_raised(agent: tuple[str, socket.socket]) -> None:
    class Broken:
        def record(self) -> None:
            raise RuntimeError("CUDA error")

        def query(self) -> bool:
            return True

        def elapsed_ns(self, end: Any) -> int:
            return 0

    hook = Hook(agent[0], cuda=True, rank=0, marker_factory=Broken)
    run(hook, 3)
    assert hook.internal_errors >= 3 and "CUDA error" in (hook.last_error or "")


def test_disabled_hook_does_nothing(agent: tuple[str, socket.socket],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFD_HOOK_DISABLE", "1")
    hook = Hook(agent[0], cuda=True)
    run(hook, 3)
    assert steps_of(drain(agent[1])) == [] and hook.steps_begun == 0


def test_rank_from_environment(agent: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    hook = Hook(agent[0], cuda=False)
    run(hook, 1)
    assert steps_of(drain(agent[1]))[0].rank == 5
    monkeypatch.delenv("RANK")
    for var in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    hook = Hook(agent[0], cuda=False)
    run(hook, 1)
    assert steps_of(drain(agent[1]))[0].rank == 0  # no launcher, no process group: single process


# --------------------------------------------------------------------------- profile control


class FakeProfiler:
    """Records in which step each call happens: start runs before the step's begin marker, stop
    after its end marker."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.hook: StepHook | None = None

    def start(self) -> int:
        assert self.hook is not None
        self.calls.append(("start", self.hook.steps_begun + 1))  # the step about to begin
        return 0

    def stop(self) -> int:
        assert self.hook is not None
        self.calls.append(("stop", self.hook.steps_begun))  # the step just ended
        return 0


def statuses(msgs: list[tuple[bytes, Any]]) -> list[tuple[str, int, int]]:
    out = []
    for k, d in records(msgs):
        if k == wire.KIND_PROFILE_STATUS:
            s = wire.unpack_profile_status(d)
            out.append((wire.PROFILE_STATE_NAMES[s.state], s.request_id, s.step))
    return out


def test_profile_range_starts_and_stops_at_exact_steps(agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    prof = FakeProfiler()
    hook = prof.hook = Hook(path, warmup_steps=0, cuda=False, rank=1, profiler=(prof.start, prof.stop))
    inbox: list[tuple[bytes, Any]] = []

    def steps(n: int) -> list[tuple[bytes, Any]]:
        for _ in range(n):
            hook._next_poll = 0  # poll at every step (the 50 ms throttle is wall-clock)
            with hook.step():
                pass
            inbox.extend(drain(sock))  # drain often: a datagram receiver queues only ~10
        got = list(inbox)
        inbox.clear()
        return got

    addr = steps(2)[-1][1]

    def ask(req: wire.ProfileRequest) -> None:
        sock.sendto(wire.pack_profile_request(req), addr)

    ask(wire.ProfileRequest(7, start_step=5, num_steps=3))
    msgs = steps(10)
    assert prof.calls == [("start", 5), ("stop", 7)]
    assert statuses(msgs) == [("accepted", 7, 5), ("started", 7, 5), ("stopped", 7, 7)]
    assert [m.step for m in steps_of(msgs) if m.flags & wire.FLAG_PROFILING] == [5, 6, 7]
    assert len(steps_of(msgs)) == 10
    # A start already passed begins at the next step; a second request meanwhile is rejected.
    ask(wire.ProfileRequest(8, start_step=1, num_steps=2))
    ask(wire.ProfileRequest(9, start_step=50, num_steps=2))
    assert statuses(steps(3)) == [("accepted", 8, 13), ("rejected", 9, 50), ("started", 8, 13),
                                  ("stopped", 8, 14)]
    # Cancel while running: stopped at the boundary where the cancel is seen.
    ask(wire.ProfileRequest(10, start_step=17, num_steps=100))
    steps(3)
    ask(wire.ProfileRequest(0, 0, 0, cancel=True))
    assert statuses(steps(1))[-1] == ("cancelled", 10, 18)
    assert prof.calls[-2:] == [("start", 17), ("stop", 18)]
    # Cancel before the start: nothing runs.
    ask(wire.ProfileRequest(11, start_step=40, num_steps=1))
    steps(1)
    ask(wire.ProfileRequest(0, 0, 0, cancel=True))
    assert statuses(steps(1)) == [("cancelled", 11, 21)]
    assert len(prof.calls) == 6  # three ranges ran; the cancelled one never started


def test_profile_request_without_profiler_is_rejected_and_failure_reported(
        agent: tuple[str, socket.socket]) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False, rank=0)  # host timing, no CUDA profiler API
    run(hook, 1)
    addr = drain(sock)[-1][1]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(1, 3, 1)), addr)
    hook._next_poll = 0
    run(hook, 1)
    assert statuses(drain(sock)) == [("rejected", 1, 3)]

    def failing() -> int:
        return 1  # cudaErrorInvalidValue-like return code

    hook = Hook(path, cuda=False, rank=0, profiler=(failing, failing))
    run(hook, 1)
    addr = drain(sock)[-1][1]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(2, 2, 1)), addr)
    hook._next_poll = 0
    run(hook, 2)
    assert statuses(drain(sock)) == [("accepted", 2, 2), ("failed", 2, 2)]


# --------------------------------------------------------------------------- with (CPU) torch


@pytest.mark.slow
def test_cpu_torch_loop_and_cuda_fallback(agent: tuple[str, socket.socket]) -> None:
    torch = pytest.importorskip("torch")
    path, sock = agent
    hook = Hook(path, warmup_steps=1, cuda=True, rank=0)  # no GPU here: host timing
    assert hook.cuda == torch.cuda.is_available()
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        with hook.step():
            x = torch.randn(32, 64)
            hook.data_ready()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    hook.close()
    got = steps_of(drain(sock))
    assert [m.step for m in got] == [1, 2, 3, 4, 5] and got[-1].window_n == 4
    if not torch.cuda.is_available():
        assert "host timing" in (hook.last_error or "")


def test_records_are_batched_into_few_datagrams(agent: tuple[str, socket.socket],
                                                sim_clock: SimClock) -> None:
    path, sock = agent
    hook = StepHook(path, cuda=False, rank=0, flush_interval_s=60, batch_records=32)
    run(hook, 40)
    first = drain(sock)
    assert len(first) == 1 and len(steps_of(first)) == 32  # full batch sent, 8 still batched
    assert hook.counters()["batched"] == 8
    hook.flush()
    assert [m.step for m in steps_of(drain(sock))] == list(range(33, 41))
    assert hook.sender.datagrams == 2 and hook.sender.sent == 40
    hook = StepHook(path, cuda=False, rank=0, flush_interval_s=0.02)
    run(hook, 3)
    assert hook.counters()["batched"] == 3  # within the interval: held
    sim_clock.advance(0.03)
    run(hook, 1)  # the interval has passed: this step flushes all four
    assert len(drain(sock)) == 1 and hook.counters()["batched"] == 0
