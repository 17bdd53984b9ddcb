"""A Kineto trace the hook opens in its own process when the agent asks, with a
real CPU torch loop and real torch.profiler: the request over the hook's datagram protocol, the
steps asked traced exactly (``ProfilerStep#N``), CPU ops in the trace that perfd's Chrome trace
reader takes, the file written off the training thread into the hook's own private folder (0700, the
file 0600) and named in its ``written`` record; requests of too many steps or of an
older agent's form (naming a path) refused, one trace at a time, a trace past its budget cut short and
one past its size deleted. On a GPU the trace stops only once the last traced step's end marker
completes (no device sync): checked here with fake markers, on the GPU by tests/gpu/hook_trace_live.py.
Requests from anyone but the agent: tests/security/test_hook_control.py."""

from __future__ import annotations

import functools
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perfd.hook.trace
from perfd.capture.chrome_trace import read_chrome_trace
from perfd.core.limits import HOOK_MAX_STEPS
from perfd.hook import StepHook, wire
from tests.hook.test_step_hook import FakeGpu, drain, records, steps_of
from tests.torch_tests import needs_torch

pytestmark = [pytest.mark.slow, needs_torch]
Hook = functools.partial(StepHook, flush_interval_s=0, warmup_steps=0, rank=0)


@pytest.fixture(autouse=True)
def traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The hook's own trace folder (PERFD_HOOK_TRACE_DIR): made by the hook, 0700."""
    d = tmp_path / "hook-traces"
    monkeypatch.setenv(perfd.hook.trace.TRACE_DIR_ENV, str(d))
    yield d


def statuses(msgs: list[tuple[bytes, Any]]) -> list[tuple[str, int, int]]:
    out = []
    for k, d in records(msgs):
        if k == wire.KIND_PROFILE_STATUS:
            s = wire.unpack_profile_status(d)
            out.append((wire.PROFILE_STATE_NAMES[s.state], s.request_id, s.step))
        elif k == wire.KIND_TRACE_WRITTEN:
            w = wire.unpack_trace_written(d)
            assert w is not None
            out.append(("written", w.request_id, w.step))
    return out


def written(msgs: list[tuple[bytes, Any]]) -> dict[int, Path]:
    """request id -> the file its hook wrote, from the TraceWritten records."""
    return {w.request_id: Path(w.path) for k, d in records(msgs) if k == wire.KIND_TRACE_WRITTEN
            for w in [wire.unpack_trace_written(d)] if w is not None}


def ask(sock: socket.socket, addr: Any, rid: int, start: int, n: int, stack: bool = False) -> None:
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(rid, start, n, stack)), addr)


class Loop:
    """A small real training loop stepped through the hook; what the agent's socket received."""

    def __init__(self, hook: StepHook, sock: socket.socket) -> None:
        import torch

        self.torch = torch
        self.hook, self.sock = hook, sock
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.inbox: list[tuple[bytes, Any]] = []
        self.seen: list[tuple[bytes, Any]] = []  # every datagram, for the written records

    def steps(self, n: int) -> list[tuple[bytes, Any]]:
        for _ in range(n):
            self.hook._next_poll = 0  # poll at every step (the 50 ms throttle is wall-clock)
            self.hook.step_begin()
            x = self.torch.randn(16, 64)
            self.hook.data_ready()
            self.model(x).sum().backward()
            self.opt.step()
            self.opt.zero_grad()
            self.hook.step_end()
            self.inbox.extend(drain(self.sock))
        got, self.inbox = self.inbox, []
        self.seen += got
        return got

    def wait_written(self, rid: int, seen: list[tuple[str, int, int]],
                     timeout: float = 30.0) -> list[tuple[str, int, int]]:
        """Step until the written (or failed) status of ``rid`` arrives (``seen``: statuses so far):
        the file is written on its own thread, its status goes out with a later step (inline)."""
        seen = list(seen)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(s[1] == rid and s[0] in ("written", "failed") for s in seen):
                return seen
            time.sleep(0.01)
            seen += statuses(self.steps(1))
        raise AssertionError(f"no written status for request {rid}: {seen}")


@pytest.mark.slow
def test_a_trace_request_traces_the_steps_asked_and_writes_the_chrome_trace(
        agent: tuple[str, socket.socket], traces: Path) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    first = loop.steps(2)
    addr = first[-1][1]
    job = next(wire.unpack_job(d) for k, d in records(first) if k == wire.KIND_JOB)
    assert job.flags & wire.JOB_FLAG_CAN_TRACE and not job.flags & wire.JOB_FLAG_KINETO_DAEMON
    ask(sock, addr, 5, 5, 3)
    msgs = loop.steps(7)
    assert statuses(msgs)[:3] == [("accepted", 5, 5), ("started", 5, 5), ("stopped", 5, 7)]
    assert [m.step for m in steps_of(msgs) if m.flags & wire.FLAG_PROFILING] == [5, 6, 7]
    seen = loop.wait_written(5, statuses(msgs))
    assert seen[3:] == [("written", 5, 7)]
    out = written(loop.seen)[5]
    # Where the hook chose: its own folder, 0700, the file 0600 and named for rank, pid and request.
    assert out == traces / f"rank0_{os.getpid()}_5.json" and out.exists()
    assert stat.S_IMODE(traces.stat().st_mode) == 0o700 and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in traces.iterdir()) == [out.name]  # the temporary file is gone
    trace = read_chrome_trace(out)
    assert trace.steps == 3 and trace.rank == 0  # ProfilerStep#5..7, distributedInfo.rank
    ops = {r.name for r in trace.ranges}
    assert {"aten::addmm", "aten::relu"} <= ops  # the CPU ops perfd charges kernels to
    c = hook.counters()
    assert c["internal_errors"] == 0 and c["control_refused"] == 0 and not c["profiling"]
    # The loop goes on untraced; a second trace may follow the first.
    ask(sock, addr, 6, 0, 1, stack=True)
    n = hook._next_step  # a start already passed: the next step
    msgs = loop.steps(2)
    assert statuses(msgs)[:3] == [("accepted", 6, n), ("started", 6, n), ("stopped", 6, n)]
    loop.wait_written(6, statuses(msgs))
    assert read_chrome_trace(written(loop.seen)[6]).steps == 1
    hook.close()


@pytest.mark.slow
def test_requests_out_of_bounds_or_of_an_older_form_are_refused(
        agent: tuple[str, socket.socket], traces: Path) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    # An older agent's request named the file to write: not a request this hook takes (no answer).
    old = struct.Struct("<BBHIqIH")
    planted = str(traces.parent / "planted.json").encode()
    sock.sendto(old.pack(1, wire.KIND_TRACE_REQUEST, 0, 1, 0, 1, len(planted)) + planted, addr)
    sock.sendto(b"\x01\x12junk", addr)
    assert statuses(loop.steps(2)) == [] and not (traces.parent / "planted.json").exists()
    assert hook.counters()["control_refused"] == 2
    # Steps: none, or more than HOOK_MAX_STEPS (a 10^6-step trace or range) are rejected.
    for rid, n in ((2, 0), (3, 10**6), (4, HOOK_MAX_STEPS + 1)):
        ask(sock, addr, rid, 0, n)
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(5, 0, 10**6)), addr)
    assert [s[:2] for s in statuses(loop.steps(1))] == [("rejected", 2), ("rejected", 3), ("rejected", 4),
                                                        ("rejected", 5)]
    # One at a time: a trace pending, a second request (trace or range) is rejected.
    ask(sock, addr, 7, 100, HOOK_MAX_STEPS)
    ask(sock, addr, 8, 100, 1)
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(9, 100, 1)), addr)
    assert statuses(loop.steps(1)) == [("accepted", 7, 100), ("rejected", 8, 100), ("rejected", 9, 100)]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(0, 0, 0, cancel=True)), addr)
    assert statuses(loop.steps(1)) == [("cancelled", 7, 6)]  # seen at step 6's begin
    hook.close()
    assert not list(traces.glob("*.json"))


def test_a_trace_folder_that_is_not_private_is_refused(agent: tuple[str, socket.socket], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PERFD_HOOK_TRACE_DIR naming a link (or a folder under one others may rename in): rejected,
    nothing written there."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(perfd.hook.trace.TRACE_DIR_ENV, str(tmp_path / "link"))
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    ask(sock, addr, 1, 0, 1)
    assert statuses(loop.steps(2)) == [("rejected", 1, 0)]
    assert "no private folder" in (hook.last_error or "") and not list(real.iterdir())
    hook.close()


def test_a_trace_past_its_budget_is_cut_and_one_too_large_is_deleted(
        agent: tuple[str, socket.socket], traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    # Memory: any growth is too much here; the trace ends with the step at whose begin it was seen.
    real_init = perfd.hook.trace.KinetoTrace.__init__

    def init(self: Any, *a: Any, **kw: Any) -> None:
        kw["max_rss_growth"] = -1
        real_init(self, *a, **kw)

    monkeypatch.setattr(perfd.hook.trace.KinetoTrace, "__init__", init)
    n = hook._next_step
    ask(sock, addr, 1, 0, 50)
    got = loop.wait_written(1, statuses(loop.steps(4)))
    assert ("stopped", 1, n + 1) in got  # started at n, cut at n + 1's begin: two steps, not 50
    assert read_chrome_trace(written(loop.seen)[1]).steps == 2
    monkeypatch.setattr(perfd.hook.trace.KinetoTrace, "__init__", real_init)
    # Size: a written trace past the cap is deleted and the request fails.
    monkeypatch.setattr(perfd.hook.trace.TraceFolder.write, "__defaults__", (100,))
    ask(sock, addr, 2, 0, 1)
    got = loop.wait_written(2, statuses(loop.steps(3)))
    assert got[-1][:2] == ("failed", 2) and 2 not in written(loop.seen)
    assert sorted(p.name for p in traces.iterdir()) == [written(loop.seen)[1].name]
    assert "more than 100" in (hook.last_error or "")
    hook.close()


@pytest.mark.usefixtures("no_data_marker")  # one marker more a step: the fake GPU fell behind the loop
def test_on_a_gpu_the_trace_stops_once_its_last_step_is_done_never_syncing(
        agent: tuple[str, socket.socket]) -> None:
    """Fake CUDA markers (the GPU is three steps behind): the profiler stays on until the last traced
    step's end marker completes, checked with query() at the next boundaries; the steps meanwhile
    are flagged as profiled (the profiler's overhead is on them)."""
    path, sock = agent
    gpu = FakeGpu()
    hook = Hook(path, cuda=True, marker_factory=gpu.marker, harvest_interval_s=0)
    made: list[Any] = []  # the markers the hook makes after its pool: the trace's drain marker
    make = hook._make

    def tracked() -> Any:
        m = make()
        made.append(m)
        return m

    hook._make = tracked
    loop = Loop(hook, sock)
    for _ in range(2):
        loop.steps(1)
        gpu.advance(1)
    addr = hook.sender.address()
    assert addr is not None
    ask(sock, addr, 3, 4, 2)
    got: list[tuple[str, int, int]] = []
    at: dict[str, int] = {}  # state -> the loop step during which its status went out
    msgs: list[tuple[bytes, Any]] = []
    for i in range(12):
        m = loop.steps(1)
        msgs += m
        for st in statuses(m):
            got.append(st)
            at.setdefault(st[0], i + 3)
        gpu.advance(1)  # one record a step while the loop records two or more: the GPU falls behind
    hook.close(timeout_s=1.0)
    msgs += drain(sock)
    got += [st for st in statuses(msgs) if st not in got]
    assert got[:2] == [("accepted", 3, 4), ("started", 3, 4)]
    assert ("stopped", 3, 5) in got and ("written", 3, 5) in got
    # Not at step 5's end: later, once the marker recorded there had completed on the "GPU".
    assert len(made) == 1 and made[0].query() and at["stopped"] > 5
    flagged = [m.step for m in steps_of(msgs) if m.flags & wire.FLAG_PROFILING]
    assert flagged[:2] == [4, 5] and flagged == list(range(4, at["stopped"] + 1))[:len(flagged)]
    assert read_chrome_trace(written(msgs)[3]).steps == 2  # ProfilerStep#4, #5 only
    assert hook.counters()["internal_errors"] == 0


def test_a_cancel_mid_trace_keeps_nothing_and_the_next_trace_works(
        agent: tuple[str, socket.socket], traces: Path) -> None:
    """The agent cancels a trace it no longer waits for (its capture timed out): the profiler stops at
    the next step boundary, nothing is written, and the process can be traced again."""
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    ask(sock, addr, 11, 0, 50)
    got = statuses(loop.steps(3))
    assert [s[0] for s in got] == ["accepted", "started"]
    assert loop.torch.autograd.profiler._is_profiler_enabled
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(0, 0, 0, cancel=True)), addr)
    got = statuses(loop.steps(2))
    assert [s[:2] for s in got] == [("cancelled", 11)]
    assert not loop.torch.autograd.profiler._is_profiler_enabled and not hook.counters()["profiling"]
    assert not list(traces.iterdir())  # nothing kept, no temporary file left
    ask(sock, addr, 12, 0, 2)
    loop.wait_written(12, statuses(loop.steps(3)))
    assert read_chrome_trace(written(loop.seen)[12]).steps == 2
    hook.close()


def test_a_trace_open_at_close_is_written_with_the_steps_it_has(
        agent: tuple[str, socket.socket]) -> None:
    """The loop ends (close) while a trace runs: the steps traced so far are written at close, and the
    agent hears it (stopped, written), since the process is about to end."""
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    ask(sock, addr, 21, 0, 100)
    loop.steps(4)
    hook.close(timeout_s=5.0)
    msgs = drain(sock)
    assert statuses(msgs) == [("stopped", 21, 5), ("written", 21, 5)]  # steps 2-5: polled at step 2's begin
    assert read_chrome_trace(written(msgs)[21]).steps == 4
    assert not loop.torch.autograd.profiler._is_profiler_enabled
