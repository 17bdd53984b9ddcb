"""The capture manager's hook traces against a stand-in hook that answers as the
step hook does (accepted, started, stopped, written, or a refusal), with the real store and the real
Chrome trace analysis: which ranks take this path, what is kept, and each failure with its reason
(a hook that cannot be reached, a rejection, silence, a process gone), and what the agent takes of
the file a hook names (only the sender's own, from its own private folder). The real hook and a real
torch loop: tests/hook/test_hook_trace.py, tests/captures/test_hook_trace_capture.py."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from perfd.capture import hook_trace
from perfd.capture.hook_trace import HOOK_TRACE
from perfd.capture.manager import CaptureManager
from perfd.capture.store import CaptureStore, Manifest
from perfd.transport.codec import Command
from tests.capture.test_manager import TRACE
from tests.security.other_user import OtherUser, other_user

PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's bound on /proc/sys/kernel/pid_max (64-bit)

Answer = Callable[[int, Path], None]  # (rank, where the hook writes): the stand-in's part


class StandInHooks:
    """The hook collector's side for the manager: ``request_trace`` answered from a thread with the
    statuses ``states`` (the file written into the hook's folder before ``written``, which names it
    with the uid of its sender), ``cancel_profile`` recorded."""

    def __init__(self, states: Sequence[str], folder: Path, traceable: dict[int, bool] | None = None,
                 write: Answer | None = None, reachable: bool = True, uid: int | None = None) -> None:
        self.states, self.folder, self.write, self.reachable = list(states), folder, write, reachable
        self.uid = os.geteuid() if uid is None else uid
        self.traceable = traceable if traceable is not None else {0: True, 1: True}
        self.asked: list[tuple[int, int, int, bool]] = []
        self.cancelled: list[int] = []
        self.mgr: CaptureManager | None = None

    def request_trace(self, rank: int, start: int, n: int, stack: bool) -> tuple[int, int] | None:
        if not self.reachable:
            return None
        self.asked.append((rank, start, n, stack))
        rid, pid = 30 + rank, os.getpid()
        path = self.folder / f"rank{rank}_{pid}_{rid}.json"

        def hook() -> None:
            assert self.mgr is not None
            for st in self.states:
                time.sleep(0.05)
                if st == "written":
                    (self.write or _write)(rank, path)
                self.mgr.on_hook_event({"kind": "hook_profile", "request_id": rid, "state": st,
                                        "step": start + (n - 1 if st in ("stopped", "written") else 0),
                                        "rank": rank, "time": time.time(), "pid": pid, "uid": self.uid,
                                        "path": str(path) if st == "written" else None})

        threading.Thread(target=hook, daemon=True).start()
        return pid, rid

    def cancel(self, rank: int) -> tuple[int, int] | None:
        self.cancelled.append(rank)
        return os.getpid(), 99


def _write(rank: int, path: Path) -> None:
    path.write_text(json.dumps({**TRACE, "distributedInfo": {"rank": rank}}))
    path.chmod(0o600)


def manager(tmp_path: Path, hooks: StandInHooks, pids: dict[int, int] | None = None) -> CaptureManager:
    mgr = CaptureManager(CaptureStore(tmp_path / "caps", 10**7), None,
                         pids_for_ranks=lambda j, r: pids or {0: os.getpid(), 1: os.getpid()},
                         hook_last_step=lambda r: 40, hook_canceller=hooks.cancel,
                         hook_tracer=hooks.request_trace,
                         hook_can_trace=lambda r: hooks.traceable.get(r, False))
    hooks.mgr = mgr
    return mgr


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The hook's private folder (0700), as perfd.hook.trace makes it."""
    d = tmp_path / "hook-traces"
    d.mkdir(mode=0o700)
    return d


def run(mgr: CaptureManager, ranks: tuple[int, ...], **args: str) -> Manifest:
    cid = mgr.handle(Command("capture", "job1", ranks, {"tool": "kineto", "steps": "2", **args}))
    assert cid and mgr.wait_idle(30)
    return mgr.store.read(cid)


def test_ranks_whose_hooks_can_trace_are_traced_by_their_hooks_and_analysed(tmp_path: Path,
                                                                            folder: Path) -> None:
    hooks = StandInHooks(["accepted", "started", "stopped", "written"], folder)
    m = run(manager(tmp_path, hooks), (0, 1))
    assert m["status"] == "ok", m["reason"]
    assert m["tool"] == "kineto" and m["mode"] == HOOK_TRACE and "step hook" in m["traced_by"]
    pid = os.getpid()
    # Each rank's hook asked for two steps from two past its last reported step; where to write is
    # the hook's to choose (no path in the request).
    assert hooks.asked == [(0, 42, 2, False), (1, 42, 2, False)]
    assert m["steps"] == {"start": 42, "count": 2}
    assert [a["name"] for a in m["artifacts"]] == [f"rank0_{pid}.json", f"rank1_{pid}.json"]
    assert all(Path(a["path"]).parent == Path(m["dir"]) for a in m["artifacts"])
    assert not list(folder.iterdir())  # taken: deleted from the hook's folder
    # The same analysis as a Kineto daemon's trace: the trace's kernels per device.
    assert m["analysis"]["1"]["devices"][0]["comm_ms"] == pytest.approx(2.0)
    assert hooks.cancelled == []


def test_a_rank_that_cannot_trace_keeps_the_kineto_path(tmp_path: Path, folder: Path) -> None:
    """One rank's process polls the Kineto daemon (or its hook cannot trace): the capture is the
    daemon's, here off, so it fails saying so; no hook is asked."""
    hooks = StandInHooks(["accepted"], folder, traceable={0: True, 1: False})
    m = run(manager(tmp_path, hooks), (0, 1))
    assert m["status"] == "failed" and "Kineto daemon is off" in (m["reason"] or "")
    assert hooks.asked == []


def test_a_rejected_trace_fails_the_capture_naming_the_rank(tmp_path: Path, folder: Path) -> None:
    hooks = StandInHooks(["rejected"], folder)
    m = run(manager(tmp_path, hooks), (1,))
    assert m["status"] == "failed"
    assert (m["reason"] or "").startswith("rank 1: the hook rejected the trace at step 42")
    assert "another range or trace runs" in (m["reason"] or "") and m["artifacts"] == []


def test_a_hook_that_cannot_be_reached_fails_at_once(tmp_path: Path, folder: Path) -> None:
    hooks = StandInHooks([], folder, reachable=False)
    m = run(manager(tmp_path, hooks), (0,))
    assert m["status"] == "failed" and "rank 0: its step hook cannot be reached" in (m["reason"] or "")


@pytest.mark.slow
def test_silence_times_out_and_cancels_the_trace(tmp_path: Path, folder: Path) -> None:
    """Accepted and started, never written: a timeout, and the hook asked to cancel (the job must not
    stay under the profiler)."""
    hooks = StandInHooks(["accepted", "started"], folder)
    m = run(manager(tmp_path, hooks), (0,), timeout_s="2")
    assert m["status"] == "timeout"
    assert "rank 0: no trace written within the 2 s timeout" in (m["reason"] or "")
    assert hooks.cancelled == [0]


def test_a_process_gone_ends_the_wait(tmp_path: Path, folder: Path) -> None:
    """The rank's process is gone once its hook accepted: the capture fails at once with that reason,
    not at its timeout. The rank's pid is one no process can have (past Linux's largest pid_max), so
    no process is started to have exited, and no other one can take its pid meanwhile."""
    gone = PID_MAX_LIMIT + 1
    hooks = StandInHooks(["accepted"], folder)
    m = run(manager(tmp_path, hooks, pids={0: gone}), (0,), timeout_s="60")
    # Failed, not timed out (status "timeout" at 60 s): the reason is the process's exit.
    assert m["status"] == "failed" and f"rank 0: its process (pid {gone}) exited" in (m["reason"] or "")


def test_a_time_window_is_not_a_hook_trace(tmp_path: Path, folder: Path) -> None:
    hooks = StandInHooks(["accepted"], folder)
    m = run(manager(tmp_path, hooks), (0,), duration_ms="2000")
    assert m["status"] == "failed" and "traces steps, not a time window" in (m["reason"] or "")
    assert hooks.asked == []


@pytest.mark.slow
def test_a_root_agent_takes_only_the_senders_own_file_from_its_own_folder(tmp_path: Path) -> None:
    """The rank's process runs as another user and writes into its own private folder; the root agent
    takes the file into its store. What the sender names is taken only when it is a plain file of the
    sender's uid, one link, in a folder of that uid closed to others: a link to a root file, a root
    file, a hard link, a folder others may enter are each refused, nothing read."""
    other = other_user()
    home = Path(tempfile.mkdtemp(prefix="perfd-shared-", dir="/tmp"))  # both users reach it, as /tmp
    home.chmod(0o1777)
    try:
        _take_only_the_senders_own(tmp_path, other, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _take_only_the_senders_own(tmp_path: Path, other: OtherUser, home: Path) -> None:
    hook_dir = home / "traces"
    hook_dir.mkdir(mode=0o700)
    os.chown(hook_dir, other.uid, other.gid)

    def write_as_other(rank: int, path: Path) -> None:
        other.run('umask 077; printf "%s" "$2" > "$1"', str(path), json.dumps(TRACE))

    hooks = StandInHooks(["accepted", "started", "stopped", "written"], hook_dir, write=write_as_other,
                         uid=other.uid)
    m = run(manager(tmp_path, hooks), (0,))
    assert m["status"] == "ok", m["reason"]
    (art,) = m["artifacts"]
    assert Path(art["path"]).parent == Path(m["dir"]) and art["bytes"] > 0
    assert m["analysis"]["0"]["devices"][0]["comm_ms"] == pytest.approx(2.0)
    assert not list(hook_dir.iterdir())  # deleted there once copied

    secret = home / "root-only.json"
    secret.write_text(json.dumps(TRACE))
    secret.chmod(0o600)

    def link_as_other(rank: int, path: Path) -> None:
        other.run('ln -s "$2" "$1"', str(path), str(secret))

    def root_file(rank: int, path: Path) -> None:  # a file the sender did not make (root's)
        _write(rank, path)

    def hard_link(rank: int, path: Path) -> None:
        other.run('umask 077; printf x > "$1.x"; ln "$1.x" "$1"', str(path))

    for write, why in ((link_as_other, "is a link, not a plain file of uid"),
                       (root_file, "is not a plain file of uid"),
                       (hard_link, "is not a plain file of uid")):
        hooks = StandInHooks(["accepted", "started", "stopped", "written"], hook_dir, write=write,
                             uid=other.uid)
        m = run(manager(tmp_path, hooks), (0,))
        assert m["status"] == "failed" and why in (m["reason"] or ""), (why, m["reason"])
        assert m["artifacts"] == []
        for p in hook_dir.iterdir():  # left there (not the agent's to delete): cleared for the next
            p.unlink()
    assert secret.read_text() == json.dumps(TRACE)  # never deleted through the link
    # The sender's folder open to others (anyone could have put the file there): refused.
    open_dir = home / "open"
    open_dir.mkdir()
    os.chown(open_dir, other.uid, other.gid)
    open_dir.chmod(0o777)
    hooks = StandInHooks(["accepted", "started", "stopped", "written"], open_dir, write=write_as_other,
                         uid=other.uid)
    m = run(manager(tmp_path, hooks), (0,))
    assert m["status"] == "failed" and "not a private folder of uid" in (m["reason"] or "")


def test_a_trace_larger_than_the_cap_is_not_taken(tmp_path: Path, folder: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hook_trace._take, "__defaults__", (100,))
    hooks = StandInHooks(["accepted", "started", "stopped", "written"], folder)
    m = run(manager(tmp_path, hooks), (0,))
    assert m["status"] == "failed" and "more than 100: not taken" in (m["reason"] or "")
