"""The capture manager end to end on one machine: commands in, Kineto (a protocol-exact stand-in for
libkineto, and a real CPU torch process when torch is installed) or nsys (a stand-in binary) captures
out, with manifests, analyses, events, the busy rule, the quota and argument validation."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.capture.kineto_daemon import (
    CONFIG_ACTIVITIES,
    CONFIG_EVENTS,
    KinetoDaemon,
)
from perfd.capture.manager import CaptureManager
from perfd.capture.nsys_exec import NsysExecutor, session_name
from perfd.capture.request import BUSY_REASON, parse_command
from perfd.capture.store import CaptureStore
from perfd.transport.codec import Command
from tests.capture.test_kineto_daemon import FakeLibkineto
from tests.capture.test_nsys_exec import calls, make_fake_nsys

TRACE = {"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 0.0, "dur": 2000.0},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 13, "ts": 1000.0,
     "dur": 2000.0},
], "distributedInfo": {"rank": 1}}


class FakeRank(threading.Thread):
    """A training process's libkineto poll thread: asks every ``period`` s, traces when told (writes
    ``<log>_<pid>.json`` after ``trace_s``), reports busy meanwhile."""

    def __init__(self, daemon_name: str, pid: int, period: float = 0.2, trace_s: float = 0.4,
                 write: bool = True, trace: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.client = FakeLibkineto(daemon_name)
        self.pid, self.period, self.trace_s, self.write = pid, period, trace_s, write
        self.trace = TRACE if trace is None else trace
        self.configs: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        busy_until = 0.0
        pending: str | None = None
        while not self.stop.is_set():
            busy = time.time() < busy_until
            mask = CONFIG_EVENTS if busy else CONFIG_EVENTS | CONFIG_ACTIVITIES
            got = self.client.request([self.pid, 1], mask)
            if pending is not None and not busy:
                if self.write:
                    path = pending.split("ACTIVITIES_LOG_FILE=")[1].splitlines()[0]
                    Path(path.replace(".json", f"_{self.pid}.json")).write_text(json.dumps(self.trace))
                pending = None
            if got:
                self.configs.append(got)
                pending, busy_until = got, time.time() + self.trace_s
            time.sleep(self.period)
        self.client.close()


def two_ranks(tmp_path: Path, traces: dict[int, dict[str, Any]] | None = None) -> Iterator[
        tuple[CaptureManager, list[dict[str, Any]], list[FakeRank]]]:
    """A capture manager over ranks 0 and 1 (pids 1000, 1001) on stand-in libkinetos, each writing
    TRACE or the trace ``traces`` gives it: the manager, its events, the ranks; ended after."""
    daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
    events: list[dict[str, Any]] = []
    store = CaptureStore(tmp_path / "captures", quota_bytes=10**7)
    pids = {0: 1000, 1: 1001}
    mgr = CaptureManager(store, daemon, None, pids_for_ranks=lambda job, ranks: {
        r: p for r, p in pids.items() if not ranks or r in ranks}, emit=events.append, settle_s=0.2,
        kineto_poll_s=0.2)
    ranks = [FakeRank(daemon.socket_name, p, trace=(traces or {}).get(r)) for r, p in pids.items()]
    for fake in ranks:
        fake.start()
    yield mgr, events, ranks
    mgr.close()
    for fake in ranks:
        fake.stop.set()
    daemon.stop()


@pytest.fixture
def env(tmp_path):
    yield from two_ranks(tmp_path)


def cmd(ranks=(1,), **args: str) -> Command:
    return Command("capture", "job1", tuple(ranks), {"tool": "kineto", "steps": "3", **args}, id="cmd-1")


def kinds(events):
    return [e["kind"] for e in events]


@pytest.mark.slow
def test_kineto_capture_of_one_rank(env):
    mgr, events, ranks = env
    cid = mgr.handle(cmd(rule="low_mfu", fired_at=str(time.time() - 0.5)))
    assert cid is not None
    assert mgr.wait_idle(20)
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    assert m["tool"] == "kineto" and m["ranks"] == [1] and m["pids"] == {"1": 1001}
    assert [a["name"] for a in m["artifacts"]] == ["rank1_1001.json"]
    dev = m["analysis"]["1"]["devices"][0]
    assert dev["busy_ms"] == pytest.approx(3.0) and dev["comm_exposed_ms"] == pytest.approx(1.0)
    t = m["timings"]
    order = ("requested_at", "started_at", "first_event_at", "trace_ready_at", "finished_at")
    assert [t[k] for k in order] == sorted(t[k] for k in order)
    # The latency is the start's time from the request's (its seconds are the machine's: not bounded
    # here), and the firing came before the request.
    assert m["latency_s"] == round(t["started_at"] - t["requested_at"], 3) >= 0
    assert m["latency_from_firing_s"] >= m["latency_s"]
    assert "PROFILE_START_ITERATION=0" in m["config"] and "ACTIVITIES_ITERATIONS=3" in m["config"]
    assert ranks[1].configs and not ranks[0].configs  # only the targeted process got a config
    assert kinds(events) == ["capture_started", "capture_finished"]
    fin = events[-1]
    assert fin["labels"] == {"job": "job1", "tool": "kineto", "ranks": "1", "rule": "low_mfu"}
    assert fin["links"] == {"capture_id": cid, "command_id": "cmd-1", "steps": "next+3"}
    summary = fin["payload"]["ranks"]["1"]["devices"][0]
    assert summary["top_kernel"] in ("gemm", "ncclDevKernel_AllReduce") and "top_kernels" not in summary
    assert len(json.dumps(fin["payload"])) < 2000
    # when the rank's part ended: the aggregator's window of disturbed iterations ends there
    assert fin["payload"]["trace_ready_at"] == t["trace_ready_at"] < fin["time"]
    assert mgr.busy() == {}


@pytest.mark.slow
def test_second_capture_of_a_busy_process_is_refused(env):
    mgr, events, _ = env
    first = mgr.handle(cmd(ranks=(0, 1)))
    second = mgr.handle(cmd(ranks=(1,)))
    assert first is not None and second is None
    refused = [e for e in events if e["kind"] == "capture_failed"]
    assert refused and refused[0]["payload"]["reason"].startswith(BUSY_REASON)
    assert mgr.wait_idle(20)
    assert mgr.store.read(first)["status"] == "ok"
    assert any(m["status"] == "skipped" and BUSY_REASON in (m["reason"] or "") for m in mgr.list())
    again = mgr.handle(cmd(ranks=(1,)))  # free once the first one ended
    assert again is not None and mgr.wait_idle(20)


@pytest.mark.parametrize(("args", "ranks", "why"), [
    ({"tool": "perf"}, (1,), "tool="),
    ({"steps": "0"}, (1,), "steps=0"),
    ({"steps": "many"}, (1,), "not an integer"),
    ({"log_file": "/etc/passwd"}, (1,), "names a path"),
    ({"output_dir": "../x"}, (1,), "names a path"),
    ({"timeout_s": "nan"}, (1,), "timeout_s"),
    ({}, (7,), "no process known for rank(s) [7]"),
])
def test_bad_requests_are_refused_with_a_reason(env, args, ranks, why):
    mgr, events, _ = env
    assert mgr.handle(cmd(ranks=ranks, **args)) is None
    assert events[-1]["kind"] == "capture_failed" and why in events[-1]["payload"]["reason"]
    assert mgr.list()[0]["status"] == "skipped"


def test_quota_refuses(env):
    mgr, events, _ = env
    (mgr.store.root / "junk").write_bytes(b"x" * (mgr.store.quota_bytes + 1))
    assert mgr.handle(cmd()) is None
    assert "quota" in events[-1]["payload"]["reason"]


def test_unknown_args_are_kept_not_used(tmp_path):
    args = {"steps": "5", "start_iteration": "40", "roundup": "10", "colour": "blue", "rule": "r"}
    req = parse_command(Command("capture", "j", (2, 1, 2), args), time.time())
    assert req.ranks == (1, 2) and req.steps == 5 and req.start_iteration == 40 and req.roundup == 10
    assert req.ignored_args == ["colour"] and req.context == {"rule": "r"}
    assert req.steps_link() == "40-44"


@pytest.mark.slow
def test_process_that_never_polls_fails_with_the_fix(tmp_path):
    daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
    events: list[dict[str, Any]] = []
    mgr = CaptureManager(CaptureStore(tmp_path, 10**6), daemon, pids_for_ranks=lambda j, r: {0: 4242},
                         emit=events.append, kineto_poll_s=0.1)
    try:
        cid = mgr.handle(Command("capture", "j", (0,), {"timeout_s": "3"}))
        assert cid and mgr.wait_idle(10)
        m = mgr.store.read(cid)
        assert m["status"] == "failed" and "KINETO_USE_DAEMON=1" in (m["reason"] or "")
        assert kinds(events) == ["capture_failed"]
    finally:
        daemon.stop()


@pytest.mark.slow
def test_answered_but_no_trace_times_out(tmp_path):
    daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
    rank = FakeRank(daemon.socket_name, 5000, write=False)
    rank.start()
    mgr = CaptureManager(CaptureStore(tmp_path, 10**6), daemon, pids_for_ranks=lambda j, r: {0: 5000},
                         settle_s=0.2, kineto_poll_s=0.2)
    try:
        cid = mgr.handle(Command("capture", "j", (0,), {"timeout_s": "3"}))
        assert cid and mgr.wait_idle(10)
        m = mgr.store.read(cid)
        assert m["status"] == "timeout" and "no trace" in (m["reason"] or "") and m["latency_s"] is not None
    finally:
        rank.stop.set()
        daemon.stop()


@pytest.mark.slow
def test_nsys_session_capture(tmp_path):
    exe, state = make_fake_nsys(tmp_path, sessions=(session_name("job1"),))
    events: list[dict[str, Any]] = []
    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**6), None, NsysExecutor(nsys=str(exe)),
                         pids_for_ranks=lambda j, r: {0: 10, 1: 11}, emit=events.append)
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "auto", "duration_ms": "200"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    assert m["tool"] == "nsys" and m["mode"] == "session" and m["sessions"] == ["perfd-job1"]
    assert "every process" in m["scope"]
    assert sorted(a["kind"] for a in m["artifacts"]) == ["nsys_report", "nsys_sqlite"]
    assert m["analysis"]["perfd-job1"]["devices"][0]["comm_ms"] == pytest.approx(3.0)
    t = m["timings"]
    started = t["started_at"]
    assert started is not None and m["latency_s"] == round(started - t["requested_at"], 3) >= 0
    assert kinds(events) == ["capture_started", "capture_finished"]
    assert [c[0] for c in calls(state)] == ["sessions", "start", "stop", "export"]


@pytest.mark.slow
def test_nsys_per_rank_sessions_and_missing_session(tmp_path):
    exe, _ = make_fake_nsys(tmp_path, sessions=(session_name("job1", 0), session_name("job1", 1)))
    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**6), None, NsysExecutor(nsys=str(exe)),
                         pids_for_ranks=lambda j, r: {0: 10, 1: 11})
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "nsys", "duration_ms": "100"}))
    assert cid and mgr.wait_idle(30)
    assert mgr.store.read(cid)["sessions"] == ["perfd-job1-r1"]
    other = mgr.handle(Command("capture", "job2", (), {"tool": "nsys", "duration_ms": "100"}))
    assert other and mgr.wait_idle(30)
    reason = mgr.store.read(other)["reason"] or ""
    assert "Session perfd-job2 not found" in reason and "perfd launch --nsys" in reason


@pytest.mark.slow
def test_nsys_step_aligned_range_through_the_hook(tmp_path):
    exe, _ = make_fake_nsys(tmp_path)
    range_dir = tmp_path / "caps" / "nsys-ranges"
    ex = NsysExecutor(nsys=str(exe), range_dir=range_dir)
    base = ex.range_base("job1", 1)
    assert base is not None
    base.parent.mkdir(parents=True)
    asked: list[tuple[int, int, int]] = []
    mgr: CaptureManager

    def hook(rank: int, start: int, n: int) -> tuple[int, int]:
        asked.append((rank, start, n))

        def training() -> None:  # the hook's answers, then nsys writing the range's report
            time.sleep(0.1)
            for state in ("accepted", "started"):
                mgr.on_hook_event({"kind": "hook_profile", "request_id": 9, "state": state, "step": 42,
                                   "rank": rank, "pid": 11, "time": time.time()})
            time.sleep(0.2)
            (base.parent / "rank1.1.nsys-rep").write_bytes(b"R" * 100)

        threading.Thread(target=training, daemon=True).start()
        return 11, 9  # (the pid it went to, the request id)

    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**6), None, ex, hook_requester=hook,
                         pids_for_ranks=lambda j, r: {1: 11}, settle_s=0.2, hook_last_step=lambda r: 40)
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "nsys", "steps": "2"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    assert asked == [(1, 42, 2)] and m["mode"] == "range" and m["steps"] == {"start": 42, "count": 2}
    assert [a["name"] for a in m["artifacts"]] == ["rank1_rank1.1.nsys-rep", "rank1_rank1.1.sqlite"]
    assert not (base.parent / "rank1.1.nsys-rep").exists()  # moved into the capture


def _session_range_manager(tmp_path: Path, hook_states: tuple[str, ...], write_report: bool = True,
                           ) -> tuple[CaptureManager, Path, list[tuple[int, int, int]]]:
    """A manager for a job whose ranks 0 and 1 run in their own nsys sessions (perfd nsys-prefix);
    the stand-in hook answers with ``hook_states`` and, like nsys at the range's close, writes the
    report where ``nsys start -o`` pointed the rank's session."""
    exe, state = make_fake_nsys(tmp_path, sessions=(session_name("job1", 0), session_name("job1", 1)))
    asked: list[tuple[int, int, int]] = []
    mgr: CaptureManager

    def hook(rank: int, start: int, n: int) -> tuple[int, int]:
        asked.append((rank, start, n))
        # The hook's answers before the requester returns (a real one's may race its return: the
        # manager keeps them): they are in whatever the capture's deadline, however long the stand-in
        # nsys took to run before this request on a loaded machine.
        for st in hook_states:
            mgr.on_hook_event({"kind": "hook_profile", "request_id": 20 + rank, "state": st,
                               "step": start, "rank": rank, "pid": 10 + rank, "time": time.time()})

        def training() -> None:
            time.sleep(0.2)
            out = (state / "sessions" / session_name("job1", rank)).read_text()  # set by nsys start
            if write_report and "started" in hook_states:
                Path(out + ".nsys-rep").write_bytes(b"R" * 100)

        threading.Thread(target=training, daemon=True).start()
        return 10 + rank, 20 + rank

    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**6), None, NsysExecutor(nsys=str(exe)),
                         hook_requester=hook, pids_for_ranks=lambda j, r: {0: 10, 1: 11}, settle_s=0.2,
                         hook_last_step=lambda r: 40)
    return mgr, state, asked


@pytest.mark.slow
def test_nsys_step_aligned_range_in_each_ranks_session(tmp_path):
    """Each rank in its own session: the capture arms the targeted rank's session with
    ``nsys start -c cudaProfilerApi --capture-range-end=stop``, the hook opens and closes the range,
    and the report nsys writes at the close is exported at once — no wait for the job's end."""
    mgr, state, asked = _session_range_manager(tmp_path, ("accepted", "started"))
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "auto", "steps": "2"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "ok", m["reason"]
    assert m["tool"] == "nsys" and m["mode"] == "range" and m["sessions"] == ["perfd-job1-r1"]
    assert asked == [(1, 42, 2)] and m["steps"] == {"start": 42, "count": 2}
    assert [a["name"] for a in m["artifacts"]] == ["rank1.nsys-rep", "rank1.sqlite"]
    assert m["analysis"]["1"]["devices"][0]["comm_ms"] == pytest.approx(3.0)
    cs = calls(state)
    assert [c[0] for c in cs] == ["sessions", "start", "export"]
    assert cs[1][:4] == ["start", "--session=perfd-job1-r1", "-c", "cudaProfilerApi"]
    assert "--capture-range-end=stop" in cs[1]


def test_nsys_session_range_refused_by_the_hook_disarms_the_session(tmp_path):
    mgr, state, _ = _session_range_manager(tmp_path, ("rejected",))
    cid = mgr.handle(Command("capture", "job1", (0, 1), {"tool": "nsys", "steps": "2"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "failed" and "rejected the profile range" in (m["reason"] or "")
    # Both armed sessions cancelled: a session left armed would record the next range nobody asked for.
    assert sorted(c[1] for c in calls(state) if c[0] == "cancel") == ["--session=perfd-job1-r0",
                                                                     "--session=perfd-job1-r1"]


@pytest.mark.slow
def test_nsys_session_range_without_a_report_times_out_and_disarms(tmp_path):
    mgr, state, _ = _session_range_manager(tmp_path, ("accepted", "started"), write_report=False)
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "nsys", "steps": "2", "timeout_s": "2"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "timeout" and "session perfd-job1-r1 wrote no report" in (m["reason"] or "")
    assert [c[1] for c in calls(state) if c[0] == "cancel"] == ["--session=perfd-job1-r1"]


@pytest.mark.slow
def test_a_range_that_never_opens_says_which_step_the_hook_waits_for(tmp_path):
    """The hook accepted the range but never reached its start step (a loop whose step numbers do
    not advance): the timeout names the accepted step and the last step the rank reported."""
    mgr, state, _ = _session_range_manager(tmp_path, ("accepted",))
    cid = mgr.handle(Command("capture", "job1", (1,), {"tool": "nsys", "steps": "2", "timeout_s": "2"}))
    assert cid and mgr.wait_idle(30)
    m = mgr.store.read(cid)
    assert m["status"] == "timeout"
    assert "no cudaProfilerStart" in (m["reason"] or "")
    assert "accepted for step 42, last step reported 40" in (m["reason"] or "")
    assert [c[1] for c in calls(state) if c[0] == "cancel"] == ["--session=perfd-job1-r1"]
