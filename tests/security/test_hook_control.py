"""The hook's control channel answers only to its agent, and the agent only to its hooks, each
attack run as it was first run:

- a datagram from another socket cancels a running capture (another user's process, and another socket
  of the same user), or asks for a range: the kernel refuses it (EPERM at the sender), the range runs on;
- a trace request naming where to write, from a socket whose path is then swapped for a link to the
  agent's socket: refused before anything is read, nothing written where it asked;
- a range or trace of 10^6 steps: rejected;
- statuses pre-marked "rejected" for ids 1..5,000 by another process cannot fail a later real range;
  a flood of unique ids and of large datagrams leaves the agent's structures within their caps;
- another user sending step records for ranks 0-7 before the job starts locks no real rank out.

The attackers are real processes (another uid through tests/security/other_user.py, speaking the wire
format byte for byte with the system's Python); the hooks are real StepHooks, the agent side the real
hook collector and the capture code's HookRanges.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.capture.bookkeeping import CaptureFailed, RunContext
from perfd.capture.hook_ranges import HookRanges
from perfd.capture.request import CaptureRequest
from perfd.capture.store import CaptureStore
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.hook import StepHook, wire
from tests.hook.test_step_hook import drain, records
from tests.procs import wait_for
from tests.security.other_user import OtherUser, other_user

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's Unix sockets")

# Sends one datagram (hex) from a socket of its own to the hook's abstract address (hex) and says how
# the kernel answered: "sent" or the errno's name. Runs as the other user, with the system's Python.
SEND = r"""
import errno, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
try:
    s.sendto(bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[1]))
    print("sent", flush=True)
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno), flush=True)
"""
# The symlink swap: bind a socket at argv[1] (a folder of the attacker's), send a trace request
# naming argv[4] as the file to write from it, then put a link to the agent's socket (argv[3]) in its
# place, so that the realpath of the sender's address is the agent's.
SWAP = r"""
import errno, os, socket, sys
path, hook, agent, target = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
t = target.encode()
import struct
req = struct.Struct("<BBHIqIH").pack(1, 18, 0, 77, 0, 3, len(t)) + t  # the path-carrying form
try:
    s.sendto(req, hook)
    out = "sent"
except OSError as exc:
    out = errno.errorcode.get(exc.errno, str(exc.errno))
os.rename(path, path + ".old")
os.symlink(agent, path)
print(out, flush=True)
"""
# Step records (wire STEP) with its own pid for ranks 0-7, every 50 ms, until killed.
SQUAT = r"""
import math, os, socket, struct, sys, time
STEP = struct.Struct("<BBHiIqqqqqqqqIIIdd")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
i = 0
while True:
    i += 1
    for rank in range(8):
        try:
            s.sendto(STEP.pack(1, 1, 0, rank, os.getpid(), i, time.time_ns(), 20_000_000, -1, -1, -1, -1,
                               -1, 0, 0, 0, math.nan, math.nan), sys.argv[1])
        except OSError:
            pass
    if i == 3:
        print("squatting", os.getpid(), flush=True)
    time.sleep(0.05)
"""


def _hex(addr: Any) -> str:
    return (addr if isinstance(addr, bytes) else addr.encode()).hex()


def _run_as(who: OtherUser, code: str, *args: str, timeout: float = 30.0) -> str:
    p = subprocess.run(who.argv(_system_python(), "-c", code, *args), capture_output=True, text=True,
                       timeout=timeout, cwd="/")
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def _system_python() -> str:
    from tests.security.other_user import system_python

    return system_python()


@pytest.fixture
def agent(shared_tmp: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bare socket standing in for the agent, in a folder both users reach (0666, as the docs allow
    for a job of another user)."""
    path = str(shared_tmp / "hook.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.setblocking(False)
    yield path, sock
    sock.close()


def _states(msgs: list[tuple[bytes, Any]]) -> list[tuple[str, int, int]]:
    return [(wire.PROFILE_STATE_NAMES[s.state], s.request_id, s.step)
            for k, d in records(msgs) if k == wire.KIND_PROFILE_STATUS
            for s in [wire.unpack_profile_status(d)]]


def test_a_datagram_from_another_socket_cannot_cancel_a_range_or_ask_for_one(
        agent: tuple[str, socket.socket]) -> None:
    """The issue: one datagram cancelled an operator's capture ("hook cancelled the trace at step 225").
    Here the agent's range of steps 3-6 is running; another user's process and another socket of the
    hook's own user send a cancel and a request for a range: the kernel refuses each, the range ends
    where the agent asked."""
    path, sock = agent
    calls: list[str] = []
    hook = StepHook(path, cuda=False, rank=0, warmup_steps=0, flush_interval_s=0,
                    profiler=(lambda: calls.append("start"), lambda: calls.append("stop")))
    with hook.step():
        pass
    addr = drain(sock)[-1][1]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(7, 3, 4)), addr)
    msgs: list[tuple[bytes, Any]] = []
    for _ in range(3):  # steps 2-4: accepted at 2, started at 3
        hook._next_poll = 0
        with hook.step():
            pass
        msgs += drain(sock)
    assert _states(msgs) == [("accepted", 7, 3), ("started", 7, 3)]
    cancel = wire.pack_profile_request(wire.ProfileRequest(0, 0, 0, cancel=True)).hex()
    ask = wire.pack_profile_request(wire.ProfileRequest(8, 0, 1)).hex()
    outcomes = [_run_as(other_user(), SEND, _hex(addr), cancel), _run_as(other_user(), SEND, _hex(addr), ask)]
    mine = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # the same user, another socket
    for data in (cancel, ask):
        try:
            mine.sendto(bytes.fromhex(data), addr)
            outcomes.append("sent")
        except PermissionError:
            outcomes.append("EPERM")
    mine.close()
    for _ in range(4):  # steps 5-8: the range ends at 6, as asked
        hook._next_poll = 0
        with hook.step():
            pass
        msgs += drain(sock)
    hook.close()
    assert _states(msgs) == [("accepted", 7, 3), ("started", 7, 3), ("stopped", 7, 6)], outcomes
    assert calls == ["start", "stop"]
    assert outcomes == ["EPERM"] * 4  # refused by the kernel at the sender: nothing reached the hook


@pytest.mark.slow
def test_a_symlink_swap_of_the_senders_address_writes_nothing(
        agent: tuple[str, socket.socket], shared_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue: a trace request from a socket whose path the attacker then swapped for a link to the
    agent's passed ``realpath(addr) == realpath(agent)``, and the victim wrote a 402 KB trace (0644) where
    the attacker asked. Here: refused by the kernel (the hook listens to the agent's socket only), and
    nothing is traced or written whatever the hook polls."""
    torch = pytest.importorskip("torch")
    attacker = other_user()
    att_dir = shared_tmp / "att"
    att_dir.mkdir()
    os.chown(att_dir, attacker.uid, attacker.gid)
    att_dir.chmod(0o777)
    target = att_dir / "stolen.json"
    monkeypatch.setenv("PERFD_HOOK_TRACE_DIR", str(shared_tmp / "victim-traces"))
    path, sock = agent
    hook = StepHook(path, cuda=False, rank=0, warmup_steps=0, flush_interval_s=0)
    with hook.step():
        pass
    addr = drain(sock)[-1][1]
    said = _run_as(attacker, SWAP, str(att_dir / "a.sock"), _hex(addr), path, str(target))
    assert os.path.realpath(att_dir / "a.sock") == os.path.realpath(path)  # the swap is in place
    model = torch.nn.Linear(8, 8)
    msgs: list[tuple[bytes, Any]] = []
    for _ in range(8):
        hook._next_poll = 0
        with hook.step():
            model(torch.randn(4, 8)).sum().backward()
        msgs += drain(sock)
        time.sleep(0.02)
    hook.close(timeout_s=2.0)
    msgs += drain(sock)
    assert not target.exists() and not (shared_tmp / "victim-traces").exists()
    assert _states(msgs) == [] and not hook.counters()["profiling"]
    assert said == "EPERM"  # refused by the kernel at the sender: nothing reached the hook


def test_a_range_or_trace_of_a_million_steps_is_rejected(agent: tuple[str, socket.socket]) -> None:
    """The issue: a 10^6-step trace slowed the job's steps from 81 to 534 ms and grew its RSS 33 MB in
    90 s. From the agent itself, a range or a trace that long is rejected."""
    path, sock = agent
    hook = StepHook(path, cuda=False, rank=0, warmup_steps=0, flush_interval_s=0,
                    profiler=(lambda: None, lambda: None))
    with hook.step():
        pass
    addr = drain(sock)[-1][1]
    sock.sendto(wire.pack_profile_request(wire.ProfileRequest(1, 0, 10**6)), addr)
    sock.sendto(struct.Struct("<BBHIqI").pack(1, wire.KIND_TRACE_REQUEST, 0, 2, 0, 10**6), addr)
    msgs: list[tuple[bytes, Any]] = []
    for _ in range(3):
        hook._next_poll = 0
        with hook.step():
            pass
        msgs += drain(sock)
    hook.close()
    assert [s[:2] for s in _states(msgs)] == [("rejected", 1), ("rejected", 2)]


# ------------------------------------------------------------------------------------- the agent's side

FORGE = r"""
import os, socket, struct, sys
STATUS = struct.Struct("<BBHiIIq")  # wire PROFILE_STATUS: version, kind, state, rank, pid, request_id, step
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
first, last, state, size = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
batch = []
for rid in range(first, last + 1):
    batch.append(STATUS.pack(1, 3, state, 0, os.getpid(), rid, 1))
    if len(batch) * STATUS.size >= size:
        s.sendto(b"".join(batch), sys.argv[1])
        batch = []
if batch:
    s.sendto(b"".join(batch), sys.argv[1])
print("forged", os.getpid(), flush=True)
"""


class Rig:
    """The real hook collector, a real StepHook (rank 0, this process) and HookRanges fed by the
    collector's events as the agent feeds them, on one thread standing in for the agent's loop."""

    def __init__(self, tmp_path: Path) -> None:
        self.col = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": "j"})
        self.col.start()
        self.calls: list[str] = []
        self.hook = StepHook(self.col.config.socket_path, cuda=False, rank=0, warmup_steps=0,
                             flush_interval_s=0,
                             profiler=(lambda: self.calls.append("start"), lambda: self.calls.append("stop")))
        self.store = CaptureStore(tmp_path / "caps", 10**7)
        ctx = RunContext(self.store, time.time, 0.1, threading.Event(), lambda *a, **k: None)
        last = lambda r: self.col.peers[r].last_step if r in self.col.peers else None  # noqa: E731
        self.ranges = HookRanges(ctx, self.col.request_profile, last, self.col.cancel_profile)
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def pump(self) -> Collected:
        out = self.col.collect(time.time())
        for ev in out.events:
            self.events.append(ev)
            self.ranges.on_hook_event(ev)
        return out

    def step_until(self, done: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            self.hook._next_poll = 0
            with self.hook.step():
                pass
            self.pump()
            time.sleep(0.01)

    def run_loop(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self.step_until(self._stop.is_set, 0.05)

        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()

    def close(self) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join(10)
        self.hook.close()
        self.col.stop()


def test_statuses_pre_marked_by_another_sender_cannot_fail_a_real_range(tmp_path: Path) -> None:
    """The issue: ids 1..5,000 pre-marked "rejected" made the next capture fail "hook rejected the trace
    at step 1". Another process of the job's own user forges them; the real range opens."""
    rig = Rig(tmp_path)
    try:
        rig.step_until(lambda: 0 in rig.col.peers)
        forger = subprocess.run([sys.executable, "-c", FORGE, rig.col.config.socket_path, "1", "5000",
                                 str(wire.PROFILE_REJECTED), "3000"], capture_output=True, text=True,
                                timeout=60, check=True)
        forger_pid = int(forger.stdout.split()[1])
        rig.step_until(lambda: rig.col.errors.get("sender:unsolicited_status", 0) >= 5000)
        rig.run_loop()
        req = CaptureRequest(job="j", ranks=(0,), tool="nsys", steps=2)
        m = rig.store.new_capture("j", (0,), "nsys")
        try:
            keys = rig.ranges.open(req, m, time.monotonic() + 30)
        except CaptureFailed as exc:
            raise AssertionError(f"a forged status failed the real range: {exc.reason}") from exc
        assert m["steps"]["count"] == 2 and keys[0][0] == os.getpid()
    finally:
        rig.close()
    assert not any(e.get("pid") == forger_pid for e in rig.events)  # none of its statuses taken
    assert rig.col.errors["sender:unsolicited_status"] == 5000  # each refused and counted
    assert rig.calls[:1] == ["start"]


@pytest.mark.slow
def test_a_flood_of_unique_ids_and_large_datagrams_stays_within_the_caps(tmp_path: Path) -> None:
    """The issue: unique ids for 60 s took the root agent from 55 MB to 3.66 GB (statuses never pruned,
    a queue capped at 200,000 datagrams whatever their size). Here 50,000 unique ids, then 300 datagrams
    of 60 KB while the agent does not collect."""
    rig = Rig(tmp_path)
    try:
        rig.step_until(lambda: 0 in rig.col.peers)
        subprocess.run([sys.executable, "-c", FORGE, rig.col.config.socket_path, "1", "50000",
                        str(wire.PROFILE_ACCEPTED), "3000"], capture_output=True, timeout=120, check=True)
        # Each counted: refused as unsolicited, or dropped before that, in its datagram of 125 (3,000
        # bytes of 24-byte statuses), past the forger's share of the receive queue.
        def counted() -> int:
            errors = rig.col.errors
            return errors.get("sender:unsolicited_status", 0) + 125 * errors.get("queue_share_full", 0)

        rig.step_until(lambda: counted() >= 50000, timeout=120)
        assert counted() == 50000 and rig.events == []
        # Answers fed straight to the capture side (as if the collector let them through): only those
        # of requests a capture waits for are kept, each request's capped.
        for rid in range(1, 20001):
            rig.ranges.on_hook_event({"kind": "hook_profile", "pid": 1, "rank": 0, "request_id": rid,
                                      "state": "rejected"})
        waiting = rig.ranges.expect((os.getpid(), 4242), 0)
        for _ in range(100):
            rig.ranges.on_hook_event({"kind": "hook_profile", "pid": os.getpid(), "rank": 0,
                                      "request_id": 4242, "state": "accepted"})
        assert len(rig.ranges._events) == 1 and rig.ranges.held <= 16 and rig.ranges.dropped >= 20000
        rig.ranges.forget([waiting])
        assert rig.ranges.held == 0
        # Large datagrams: the receiver queues them, nobody collects; bounded in bytes.
        inbox = rig.col.inbox
        _, _, dropped0, over0, _ = inbox.counters()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        blob = bytes([1, 99]) + b"x" * 60_000
        for _ in range(300):
            s.sendto(blob, rig.col.config.socket_path)
        s.close()

        def all_received() -> bool:  # each of the 300 queued, or dropped and counted
            _, _, dropped, over, _ = inbox.counters()
            mine = sum(1 for _, _, sender in list(inbox.items)
                       if sender is not None and sender.pid == os.getpid())
            return mine + (over - over0) + (dropped - dropped0) >= 300

        wait_for(all_received, 60, "the receiver took in each of the 300 large datagrams", interval=0.05)
        held = sum(len(d) for d, _, _ in list(rig.col.inbox.items))
        assert held <= 8 << 20, f"{held >> 20} MiB queued"
        # One sender: held to its share of the queue, its excess dropped and counted.
        assert rig.col.queued_bytes <= (8 << 20) // 8 and rig.col.inbox.over_share > 0
    finally:
        rig.close()


def test_another_user_squatting_ranks_0_to_7_locks_no_real_rank_out(agent: tuple[str, socket.socket],
                                                                    tmp_path: Path, shared_tmp: Path) -> None:
    """The issue: with the socket 0666, another uid sent step records with its own pid for ranks 0-7
    before the job started; every real rank was then refused (``rank_of_other_uid``) while it lived,
    and the job showed the attacker's steps. The job's user here is this process's (the agent's own,
    undeclared); the squatter's records are refused whenever they come, the job's all taken."""
    sock_path = str(shared_tmp / "agent-hook.sock")
    col = HookCollector({"socket_path": sock_path, "job": "j", "mode": "0666"})
    col.start()
    attacker = other_user()
    out = tmp_path / "squatter.out"
    squat = attacker.python(SQUAT, sock_path, out=out)
    try:
        deadline = time.monotonic() + 30
        got = Collected()
        while "squatting" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
            got.steps += col.collect(time.time()).steps
            time.sleep(0.02)
        got.steps += col.collect(time.time()).steps
        hooks = [StepHook(sock_path, cuda=False, rank=r, warmup_steps=0, flush_interval_s=0)
                 for r in range(8)]
        for _ in range(5):
            for h in hooks:
                with h.step():
                    pass
            time.sleep(0.02)
        for h in hooks:  # a hook's last steps may still be with its harvester: close sends them
            h.close(timeout_s=2.0)
        deadline = time.monotonic() + 30
        while len([s for s in got.steps if s.fields["pid"] == str(os.getpid())]) < 40 \
                and time.monotonic() < deadline:
            got.steps += col.collect(time.time()).steps
            time.sleep(0.02)
    finally:
        os.killpg(squat.pid, 9)
        squat.wait(10)
        col.stop()
    # its line, not the first: the child may log first (gRPC's fork notice, when a test beside it runs
    # gRPC threads in this worker)
    squatter = int(next(ln for ln in out.read_text().splitlines() if ln.startswith("squatting")).split()[1])
    mine = [(s.rank, s.iteration) for s in got.steps if s.fields["pid"] == str(os.getpid())]
    assert sorted(mine) == [(r, i) for r in range(8) for i in range(1, 6)]  # every real step taken
    assert not [s for s in got.steps if s.fields["pid"] == str(squatter)]
    assert all(col.peers[r].pid == os.getpid() for r in range(8))
    assert col.errors.get("sender:not_job_user", 0) >= 24  # its records, 8 ranks a tick: refused, counted


def test_the_job_user_comes_from_the_launch_manifest(tmp_path: Path) -> None:
    """``perfd launch`` records its user; ``perfd agent --launch-manifest`` makes it the job's user for
    the hook (and the GPU process lists and captures)."""
    from perfd.agent.config import AgentConfig, apply_overrides
    from perfd.core.manifest import MANIFEST_VERSION, write_manifest

    path = tmp_path / "manifest.json"
    write_manifest(path, {"version": MANIFEST_VERSION, "job": "j", "uid": 4321,
                          "collectors": {"hook": {"socket_path": str(tmp_path / "h.sock")}}})
    cfg = apply_overrides(AgentConfig(), launch_manifest=str(path), nvml="off")
    assert cfg.job_uid == 4321
    from perfd.agent.node_agent import Agent
    from perfd.collectors.collector import Registry

    made: list[HookCollector] = []

    def hook(conf: dict[str, Any]) -> HookCollector:
        made.append(HookCollector(conf))
        return made[-1]

    reg = Registry()
    reg.register("hook", hook)
    Agent(cfg, reg).build()
    assert made[0].job_uid == 4321
    # What perfd launch writes: its own user.
    from perfd.app.launcher import LaunchOptions, manifest_data, plan_launch

    plan = plan_launch(LaunchOptions(job="j", command=["true"], run_dir=str(tmp_path / "run"),
                                     agent_socket=str(tmp_path / "h.sock")), {})
    data = manifest_data(plan, LaunchOptions(job="j", command=["true"]), 1, "running", 0.0)
    assert data["uid"] == os.getuid()
