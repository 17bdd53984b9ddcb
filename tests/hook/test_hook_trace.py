"""A Kineto trace the hook opens in its own process when the agent asks (issue 44 item 4), with a
real CPU torch loop and real torch.profiler: the request over the hook's datagram protocol, the
steps asked traced exactly (``ProfilerStep#N``), CPU ops in the trace that perfd's Chrome trace
reader takes, the file written where the agent said off the training thread; requests not from the
agent's socket refused unanswered, paths that exist or are not ``*.json`` rejected, one trace at a
time. On a GPU the trace stops only once the last traced step's end marker completes (no device
sync): checked here with fake markers, on the GPU by tests/gpu/hook_trace_live.py."""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.capture.chrome_trace import read_chrome_trace
from perfd.hook import StepHook, wire
from tests.hook.test_step_hook import FakeGpu, drain, records, steps_of

torch = pytest.importorskip("torch")
Hook = functools.partial(StepHook, flush_interval_s=0, warmup_steps=0, rank=0)


def statuses(msgs: list[tuple[bytes, Any]]) -> list[tuple[str, int, int]]:
    return [(wire.PROFILE_STATE_NAMES[s.state], s.request_id, s.step)
            for k, d in records(msgs) if k == wire.KIND_PROFILE_STATUS
            for s in [wire.unpack_profile_status(d)]]


class Loop:
    """A small real training loop stepped through the hook; what the agent's socket received."""

    def __init__(self, hook: StepHook, sock: socket.socket) -> None:
        self.hook, self.sock = hook, sock
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.inbox: list[tuple[bytes, Any]] = []

    def steps(self, n: int) -> list[tuple[bytes, Any]]:
        for _ in range(n):
            self.hook._next_poll = 0  # poll at every step (the 50 ms throttle is wall-clock)
            self.hook.step_begin()
            x = torch.randn(16, 64)
            self.hook.data_ready()
            self.model(x).sum().backward()
            self.opt.step()
            self.opt.zero_grad()
            self.hook.step_end()
            self.inbox.extend(drain(self.sock))
        got, self.inbox = self.inbox, []
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


def test_a_trace_request_traces_the_steps_asked_and_writes_the_chrome_trace(
        agent: tuple[str, socket.socket], tmp_path: Path) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    first = loop.steps(2)
    addr = first[-1][1]
    job = next(wire.unpack_job(d) for k, d in records(first) if k == wire.KIND_JOB)
    assert job.flags & wire.JOB_FLAG_CAN_TRACE and not job.flags & wire.JOB_FLAG_KINETO_DAEMON
    out = tmp_path / "rank0_trace.json"
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(5, 5, 3, str(out))), addr)
    msgs = loop.steps(7)
    assert statuses(msgs)[:3] == [("accepted", 5, 5), ("started", 5, 5), ("stopped", 5, 7)]
    assert [m.step for m in steps_of(msgs) if m.flags & wire.FLAG_PROFILING] == [5, 6, 7]
    seen = loop.wait_written(5, statuses(msgs))
    assert seen[3:] == [("written", 5, 7)] and out.exists()
    assert not list(tmp_path.glob(".perfd-trace-*"))  # the temporary file is gone
    trace = read_chrome_trace(out)
    assert trace.steps == 3 and trace.rank == 0  # ProfilerStep#5..7, distributedInfo.rank
    ops = {r.name for r in trace.ranges}
    assert {"aten::addmm", "aten::relu"} <= ops  # the CPU ops perfd charges kernels to
    c = hook.counters()
    assert c["internal_errors"] == 0 and c["control_refused"] == 0 and not c["profiling"]
    # The loop goes on untraced; a second trace may follow the first.
    out2 = tmp_path / "rank0_again.json"
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(6, 0, 1, str(out2), stack=True)), addr)
    n = hook._next_step  # a start already passed: the next step
    msgs = loop.steps(2)
    assert statuses(msgs)[:3] == [("accepted", 6, n), ("started", 6, n), ("stopped", 6, n)]
    loop.wait_written(6, statuses(msgs))
    assert read_chrome_trace(out2).steps == 1
    hook.close()


def test_requests_that_are_not_the_agents_or_not_writable_are_refused(
        agent: tuple[str, socket.socket], tmp_path: Path) -> None:
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    # Another local process (any user may send to an abstract socket): no answer, nothing written.
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(str(tmp_path / "other.sock"))
    target = tmp_path / "planted.json"
    other.sendto(wire.pack_trace_request(wire.TraceRequest(1, 0, 1, str(target))), addr)
    other.sendto(b"\x01\x12junk", addr)
    other.close()
    assert statuses(loop.steps(3)) == [] and not target.exists()
    assert hook.counters()["control_refused"] == 2
    # From the agent, but a file that exists (never overwritten), a relative path, not *.json.
    exists = tmp_path / "exists.json"
    exists.write_text("keep")
    for rid, p in ((2, str(exists)), (3, "rel.json"), (4, str(tmp_path / "x.txt")),
                   (5, str(tmp_path / "no" / "dir.json"))):
        sock.sendto(wire.pack_trace_request(wire.TraceRequest(rid, 0, 1, p)), addr)
    assert [s[0] for s in statuses(loop.steps(1))] == ["rejected"] * 4
    assert exists.read_text() == "keep"
    # One at a time: a trace pending, a second request (trace or range) is rejected.
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(7, 100, 1, str(tmp_path / "a.json"))), addr)
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(8, 100, 1, str(tmp_path / "b.json"))), addr)
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(9, 100, 1)), addr)
    assert statuses(loop.steps(1)) == [("accepted", 7, 100), ("rejected", 8, 100), ("rejected", 9, 100)]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(0, 0, 0, cancel=True)), addr)
    assert statuses(loop.steps(1)) == [("cancelled", 7, 7)]  # seen at step 7's begin
    hook.close()
    assert not (tmp_path / "a.json").exists()


def test_on_a_gpu_the_trace_stops_once_its_last_step_is_done_never_syncing(
        agent: tuple[str, socket.socket], tmp_path: Path) -> None:
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
    out = tmp_path / "gpu.json"
    addr = hook.sender.address()
    assert addr is not None
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(3, 4, 2, str(out))), addr)
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
    assert read_chrome_trace(out).steps == 2  # ProfilerStep#4, #5 only
    assert hook.counters()["internal_errors"] == 0


def test_a_cancel_mid_trace_keeps_nothing_and_the_next_trace_works(
        agent: tuple[str, socket.socket], tmp_path: Path) -> None:
    """The agent cancels a trace it no longer waits for (its capture timed out): the profiler stops at
    the next step boundary, nothing is written, and the process can be traced again."""
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    out = tmp_path / "cancelled.json"
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(11, 0, 50, str(out))), addr)
    got = statuses(loop.steps(3))
    assert [s[0] for s in got] == ["accepted", "started"]
    assert torch.autograd.profiler._is_profiler_enabled
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(0, 0, 0, cancel=True)), addr)
    got = statuses(loop.steps(2))
    assert [s[:2] for s in got] == [("cancelled", 11)]
    assert not torch.autograd.profiler._is_profiler_enabled and not hook.counters()["profiling"]
    assert not out.exists() and not list(tmp_path.glob(".perfd-trace-*"))
    again = tmp_path / "again.json"
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(12, 0, 2, str(again))), addr)
    loop.wait_written(12, statuses(loop.steps(3)))
    assert read_chrome_trace(again).steps == 2
    hook.close()


def test_a_trace_open_at_close_is_written_with_the_steps_it_has(
        agent: tuple[str, socket.socket], tmp_path: Path) -> None:
    """The loop ends (close) while a trace runs: the steps traced so far are written at close, and the
    agent hears it (stopped, written), since the process is about to end."""
    path, sock = agent
    hook = Hook(path, cuda=False)
    loop = Loop(hook, sock)
    addr = loop.steps(1)[-1][1]
    out = tmp_path / "at_close.json"
    sock.sendto(wire.pack_trace_request(wire.TraceRequest(21, 0, 100, str(out))), addr)
    loop.steps(4)
    hook.close(timeout_s=5.0)
    got = statuses(drain(sock))
    assert got == [("stopped", 21, 5), ("written", 21, 5)]  # steps 2-5: polled at step 2's begin
    assert read_chrome_trace(out).steps == 4
    assert not torch.autograd.profiler._is_profiler_enabled
