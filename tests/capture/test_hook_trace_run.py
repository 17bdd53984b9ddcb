"""The capture manager's hook traces (issue 44 item 4) against a stand-in hook that answers as the
step hook does (accepted, started, stopped, written, or a refusal), with the real store and the real
Chrome trace analysis: which ranks take this path, what is kept, and each failure with its reason
(a hook that cannot be reached, a rejection, silence, a process gone, another user's process). The
real hook and a real torch loop: tests/hook/test_hook_trace.py, tests/captures/test_hook_trace_capture.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from perfd.capture.hook_trace import HOOK_TRACE
from perfd.capture.manager import CaptureManager
from perfd.capture.store import CaptureStore
from perfd.transport.codec import Command
from tests.capture.test_manager import TRACE
from tests.security.other_user import other_user

Answer = Callable[[int, int, str], None]  # (rank, first step, path): the stand-in's part


class StandInHooks:
    """The hook collector's side for the manager: ``request_trace`` answered from a thread with the
    statuses ``states`` (the file written before ``written``), ``cancel_profile`` recorded."""

    def __init__(self, states: Sequence[str], traceable: dict[int, bool] | None = None,
                 write: Answer | None = None, reachable: bool = True) -> None:
        self.states, self.write, self.reachable = list(states), write, reachable
        self.traceable = traceable if traceable is not None else {0: True, 1: True}
        self.asked: list[tuple[int, int, int, str, bool]] = []
        self.cancelled: list[int] = []
        self.mgr: CaptureManager | None = None

    def request_trace(self, rank: int, start: int, n: int, path: str, stack: bool) -> int | None:
        if not self.reachable:
            return None
        self.asked.append((rank, start, n, path, stack))
        rid = 30 + rank

        def hook() -> None:
            assert self.mgr is not None
            for st in self.states:
                time.sleep(0.05)
                if st == "written":
                    (self.write or _write)(rank, start, path)
                self.mgr.on_hook_event({"kind": "hook_profile", "request_id": rid, "state": st,
                                        "step": start + (n - 1 if st in ("stopped", "written") else 0),
                                        "rank": rank, "time": time.time()})

        threading.Thread(target=hook, daemon=True).start()
        return rid

    def cancel(self, rank: int) -> int | None:
        self.cancelled.append(rank)
        return 99


def _write(rank: int, start: int, path: str) -> None:
    Path(path).write_text(json.dumps({**TRACE, "distributedInfo": {"rank": rank}}))


def manager(tmp_path: Path, hooks: StandInHooks, pids: dict[int, int] | None = None,
            owner: int | None = None) -> CaptureManager:
    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**7), None,
                         pids_for_ranks=lambda j, r: pids or {0: os.getpid(), 1: os.getpid()},
                         hook_last_step=lambda r: 40, hook_canceller=hooks.cancel,
                         hook_tracer=hooks.request_trace,
                         hook_can_trace=lambda r: hooks.traceable.get(r, False),
                         hook_owner=lambda r: owner)
    hooks.mgr = mgr
    return mgr


def run(mgr: CaptureManager, ranks: tuple[int, ...], **args: str) -> dict[str, Any]:
    cid = mgr.handle(Command("capture", "job1", ranks, {"tool": "kineto", "steps": "2", **args}))
    assert cid and mgr.wait_idle(30)
    return mgr.store.read(cid)


def test_ranks_whose_hooks_can_trace_are_traced_by_their_hooks_and_analysed(tmp_path: Path) -> None:
    hooks = StandInHooks(["accepted", "started", "stopped", "written"])
    m = run(manager(tmp_path, hooks), (0, 1))
    assert m["status"] == "ok", m["reason"]
    assert m["tool"] == "kineto" and m["mode"] == HOOK_TRACE and "step hook" in m["traced_by"]
    d = Path(m["dir"])
    pid = os.getpid()
    # Each rank's hook asked for two steps from two past its last reported step, into the capture's folder.
    assert [a[:3] for a in hooks.asked] == [(0, 42, 2), (1, 42, 2)]
    assert [a[3] for a in hooks.asked] == [str(d / f"rank0_{pid}.json"), str(d / f"rank1_{pid}.json")]
    assert m["steps"] == {"start": 42, "count": 2}
    assert [a["name"] for a in m["artifacts"]] == [f"rank0_{pid}.json", f"rank1_{pid}.json"]
    # The same analysis as a Kineto daemon's trace: the trace's kernels per device.
    assert m["analysis"]["1"]["devices"][0]["comm_ms"] == pytest.approx(2.0)
    assert hooks.cancelled == []


def test_a_rank_that_cannot_trace_keeps_the_kineto_path(tmp_path: Path) -> None:
    """One rank's process polls the Kineto daemon (or its hook cannot trace): the capture is the
    daemon's, here off, so it fails saying so; no hook is asked."""
    hooks = StandInHooks(["accepted"], traceable={0: True, 1: False})
    m = run(manager(tmp_path, hooks), (0, 1))
    assert m["status"] == "failed" and "Kineto daemon is off" in m["reason"]
    assert hooks.asked == []


def test_a_rejected_trace_fails_the_capture_naming_the_rank(tmp_path: Path) -> None:
    hooks = StandInHooks(["rejected"])
    m = run(manager(tmp_path, hooks), (1,))
    assert m["status"] == "failed"
    assert m["reason"].startswith("rank 1: the hook rejected the trace at step 42")
    assert "another range or trace runs" in m["reason"] and m["artifacts"] == []


def test_a_hook_that_cannot_be_reached_fails_at_once(tmp_path: Path) -> None:
    hooks = StandInHooks([], reachable=False)
    m = run(manager(tmp_path, hooks), (0,))
    assert m["status"] == "failed" and "rank 0: its step hook cannot be reached" in m["reason"]


def test_silence_times_out_and_cancels_the_trace(tmp_path: Path) -> None:
    """Accepted and started, never written: a timeout, and the hook asked to cancel (the job must not
    stay under the profiler)."""
    hooks = StandInHooks(["accepted", "started"])
    m = run(manager(tmp_path, hooks), (0,), timeout_s="2")
    assert m["status"] == "timeout" and "rank 0: no trace written within the 2 s timeout" in m["reason"]
    assert hooks.cancelled == [0]


def test_a_process_gone_ends_the_wait(tmp_path: Path) -> None:
    """The rank's process exits after its hook accepted: the capture fails at once with that reason,
    not at its timeout."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    hooks = StandInHooks(["accepted"])
    t0 = time.monotonic()
    m = run(manager(tmp_path, hooks, pids={0: dead.pid}), (0,), timeout_s="60")
    assert time.monotonic() - t0 < 20
    assert m["status"] == "failed" and f"rank 0: its process (pid {dead.pid}) exited" in m["reason"]


def test_a_time_window_is_not_a_hook_trace(tmp_path: Path) -> None:
    hooks = StandInHooks(["accepted"])
    m = run(manager(tmp_path, hooks), (0,), duration_ms="2000")
    assert m["status"] == "failed" and "traces steps, not a time window" in m["reason"]
    assert hooks.asked == []


def test_another_users_process_under_a_non_root_agent_fails_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = StandInHooks(["accepted"])
    mgr = manager(tmp_path, hooks, owner=4321)
    monkeypatch.setattr(os, "geteuid", lambda: 1234)  # the agent's user, after its store was made
    m = run(mgr, (0,))
    assert m["status"] == "failed" and "runs as uid 4321, this agent as uid 1234" in m["reason"]
    assert hooks.asked == []


def test_a_root_agent_gives_another_users_process_a_folder_of_its_own(tmp_path: Path) -> None:
    """The store is private to root; the rank's process (another user) writes into a fresh folder of
    its own, and the agent takes the file into the store; a link there instead of a file is refused."""
    other = other_user()
    made: list[str] = []

    def write_as_other(rank: int, start: int, path: str) -> None:
        made.append(path)
        other.run('printf "%s" "$2" > "$1"', path, json.dumps(TRACE))

    hooks = StandInHooks(["accepted", "started", "stopped", "written"], write=write_as_other)
    m = run(manager(tmp_path, hooks, owner=other.uid), (0,))
    assert m["status"] == "ok", m["reason"]
    (path,) = made
    assert not path.startswith(str(tmp_path / "caps")) and not os.path.exists(os.path.dirname(path))
    (art,) = m["artifacts"]
    assert Path(art["path"]).parent == Path(m["dir"]) and art["bytes"] > 0
    assert m["analysis"]["0"]["devices"][0]["comm_ms"] == pytest.approx(2.0)

    secret = tmp_path / "root-only.json"
    secret.write_text(json.dumps(TRACE))
    secret.chmod(0o600)

    def link_as_other(rank: int, start: int, path: str) -> None:
        other.run('ln -s "$2" "$1"', path, str(secret))

    hooks = StandInHooks(["accepted", "started", "stopped", "written"], write=link_as_other)
    m = run(manager(tmp_path, hooks, owner=other.uid), (0,))
    assert m["status"] == "failed" and "is a link, not a plain file of uid" in m["reason"]
    assert m["artifacts"] == []
