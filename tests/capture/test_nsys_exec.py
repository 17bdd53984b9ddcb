"""nsys command lines and the executor, against a stand-in ``nsys`` (a script that logs its argv,
keeps sessions in a folder, writes a report on ``stop`` and a real-schema SQLite on ``export``)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from perfd.capture.binaries import NsysNotFoundError
from perfd.capture.nsys_exec import (
    NsysError,
    NsysExecutor,
    nsys_launch_argv,
    nsys_range_argv,
    range_reports,
    report_path,
    session_name,
    wait_stable,
)
from perfd.capture.nsys_sqlite import analyze_nsys

FAKE_NSYS = r'''#!{python}
import json, os, sqlite3, sys, time
STATE = {state!r}
args = sys.argv[1:]
with open(os.path.join(STATE, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
def opt(name):
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None
sessions = os.path.join(STATE, "sessions")
os.makedirs(sessions, exist_ok=True)
cmd = args[0] if args else ""
if os.path.exists(os.path.join(STATE, "fail_" + cmd)):
    print("fake nsys: " + cmd + " failed on purpose", file=sys.stderr)
    sys.exit(1)
if cmd == "sessions":
    print("      ID      TIME     STATE     LAUNCH NAME")
    for i, name in enumerate(sorted(os.listdir(sessions))):
        print(f"  {{1000 + i}}  00:01  Started  1  {{name}}")
elif cmd == "start":
    s = opt("--session")
    if not os.path.exists(os.path.join(sessions, s)):
        print(f"Session {{s}} not found", file=sys.stderr); sys.exit(1)
    with open(os.path.join(sessions, s), "w") as f:
        f.write(opt("-o"))
elif cmd == "stop":
    s = opt("--session")
    out = open(os.path.join(sessions, s)).read()
    with open(out + ".nsys-rep", "wb") as f:
        f.write(b"NSYS" * 64)
elif cmd == "cancel":
    pass
elif cmd == "export":
    dest, rep = opt("-o"), args[-1]
    con = sqlite3.connect(dest)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
            streamId INTEGER, globalPid INTEGER, shortName INTEGER, demangledName INTEGER);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
        INSERT INTO StringIds VALUES (1, 'gemm'), (2, 'ncclDevKernel_AllReduce');
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000000, 3000000, 0, 7, 0, 1, 1);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (2000000, 5000000, 0, 13, 0, 2, 2);
        INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '');
    """)
    con.commit(); con.close()
elif cmd == "--version":
    print("NVIDIA Nsight Systems version 2025.3.1 (fake)")
else:
    print("unknown command", file=sys.stderr); sys.exit(2)
'''


def make_fake_nsys(tmp: Path, sessions: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """(nsys script, state folder); ``sessions`` exist as if started by ``nsys launch``."""
    state = tmp / "nsys-state"
    (state / "sessions").mkdir(parents=True, exist_ok=True)
    for s in sessions:
        (state / "sessions" / s).write_text("")
    exe = tmp / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable, state=str(state)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, state


def calls(state: Path) -> list[list[str]]:
    p = state / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_command_lines_are_argument_lists():
    argv = nsys_launch_argv("/x/nsys", "perfd-job", ["torchrun", "--nproc_per_node", "2", "train.py"])
    assert argv == ["/x/nsys", "launch", "--session-new=perfd-job", "--trace=cuda,nvtx,osrt",
                    "torchrun", "--nproc_per_node", "2", "train.py"]
    argv = nsys_range_argv("/x/nsys", "/caps/r/rank%q{RANK}", ["python", "t.py"], repeat=5)
    assert argv[:5] == ["/x/nsys", "profile", "-c", "cudaProfilerApi", "--capture-range-end=repeat:5"]
    assert argv[-4:] == ["-o", "/caps/r/rank%q{RANK}", "python", "t.py"]
    with pytest.raises(ValueError):
        nsys_launch_argv("nsys", "bad name; rm -rf /", ["x"])
    with pytest.raises(ValueError):
        nsys_launch_argv("nsys", "ok", [])
    assert session_name("my job/1").startswith("perfd-my_job_1-") and session_name("j", 3) == "perfd-j-r3"
    assert report_path("/a/out") == Path("/a/out.nsys-rep")
    assert report_path("/a/o.nsys-rep") == Path("/a/o.nsys-rep")


@pytest.mark.slow
def test_session_start_stop_export_analyze(tmp_path):
    exe, state = make_fake_nsys(tmp_path, sessions=("perfd-j",))
    ex = NsysExecutor(nsys=str(exe), timeout_s=20)
    assert ex.available() is None
    assert ex.sessions() == ["perfd-j"]
    out = tmp_path / "cap" / "perfd-j"
    out.parent.mkdir()
    t = ex.start("perfd-j", out)
    assert abs(t - time.time()) < 30
    rep = ex.stop("perfd-j", out)
    assert rep == out.with_name("perfd-j.nsys-rep") and rep.stat().st_size == 256
    sqlite = ex.export(rep)
    assert sqlite.suffix == ".sqlite"
    analysis = analyze_nsys(sqlite)
    dev = analysis.device(0)
    assert dev.busy_ms == pytest.approx(4.0) and dev.comm_ms == pytest.approx(3.0)
    assert dev.comm_exposed_ms == pytest.approx(2.0)
    seen = calls(state)
    assert ["start", "--session=perfd-j", "--sample=none", "--cpuctxsw=none", "-o", str(out),
            "--force-overwrite=true"] in seen
    assert ["stop", "--session=perfd-j"] in seen
    assert any(c[:3] == ["export", "--type", "sqlite"] for c in seen)
    from perfd.capture.nsys_exec import first_event_epoch

    assert first_event_epoch(sqlite) == pytest.approx(1_700_000_000.001)


@pytest.mark.slow
def test_errors_are_clear(tmp_path, monkeypatch):
    exe, state = make_fake_nsys(tmp_path)
    ex = NsysExecutor(nsys=str(exe), timeout_s=20)
    with pytest.raises(NsysError, match="Session perfd-x not found"):
        ex.start("perfd-x", tmp_path / "o")
    (state / "fail_sessions").write_text("")
    with pytest.raises(NsysError, match="exited 1"):
        ex.sessions()
    monkeypatch.setenv("PERFD_NSYS", str(tmp_path / "missing"))
    missing = NsysExecutor()
    assert "PERFD_NSYS" in (missing.available() or "")
    with pytest.raises(NsysNotFoundError):
        missing.sessions()
    slow = tmp_path / "slow"
    slow.write_text(f"#!{sys.executable}\nimport time; time.sleep(30)\n")
    slow.chmod(0o755)
    with pytest.raises(NsysError, match="no answer within 1 s"):
        NsysExecutor(nsys=str(slow), timeout_s=1).sessions()


@pytest.mark.slow
def test_range_reports_and_wait_stable(tmp_path):
    base = tmp_path / "perfd-j" / "rank1"
    assert range_reports(base) == {}
    base.parent.mkdir()
    (base.parent / "rank1.1.nsys-rep").write_bytes(b"a")
    (base.parent / "rank10.1.nsys-rep").write_bytes(b"b")  # another rank's
    (base.parent / "rank1.nsys-rep").write_bytes(b"c")
    got = range_reports(base)
    assert sorted(got) == [0, 1] and got[1].name == "rank1.1.nsys-rep"
    assert range_reports(base, since=time.time() + 60) == {}
    growing = tmp_path / "growing"
    growing.write_bytes(b"x")

    def grow() -> None:
        for _ in range(5):
            time.sleep(0.1)
            with growing.open("ab") as f:
                f.write(b"x" * 100)

    t = threading.Thread(target=grow)
    t.start()
    got_files = wait_stable(lambda: [growing], timeout_s=10, settle_s=0.4, poll_s=0.05)
    t.join()
    assert got_files == [growing] and growing.stat().st_size == 501
    assert wait_stable(lambda: [], timeout_s=0.2, poll_s=0.05) is None



def test_rank_range_prefix_writes_where_the_agent_looks(tmp_path, monkeypatch, capsys):
    from perfd.agent.capture_executor import AgentCaptures
    from perfd.app.cli import main
    from perfd.capture.nsys_exec import rank_range_prefix

    words = rank_range_prefix("/opt/nsys", "gpt 8b", tmp_path / "caps")
    assert words[:4] == ["/opt/nsys", "profile", "-c", "cudaProfilerApi"]
    base = words[words.index("-o") + 1]
    caps = AgentCaptures("gpt 8b", str(tmp_path / "caps"), 1 << 30, emit=lambda e: None, kineto=False)
    try:
        agent_base = caps.nsys.range_base("gpt 8b", 3)  # where the agent's manager looks
    finally:
        caps.close()
    assert base.replace("%q{RANK}", "3") == str(agent_base)  # nsys expands %q{RANK} per rank
    # The command prints plain words for torchrun --no-python $(perfd nsys-prefix ...).
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\n")
    nsys.chmod(0o755)
    monkeypatch.setenv("PERFD_NSYS", str(nsys))
    assert main(["nsys-prefix", "--job", "j", "--mode", "profile", "--capture-dir", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == rank_range_prefix(str(nsys), "j", tmp_path / "c")
    assert (tmp_path / "c" / "nsys-ranges" / "perfd-j").is_dir()  # made before nsys runs
    assert main(["nsys-prefix", "--job", "j", "--mode", "profile",
                 "--capture-dir", str(tmp_path / "a b")]) == 2
    assert "split or expanded by the shell" in capsys.readouterr().err
    monkeypatch.setenv("PERFD_NSYS", str(tmp_path / "missing"))
    assert main(["nsys-prefix", "--job", "j"]) == 2


def test_the_agent_hands_its_manager_nsys_only_when_nsys_can_run(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager got the executor exactly when nsys was NOT found (available() returns None when
    it can run, else the reason): on the GPU machine a rule's nsys capture failed with "no nsys
    executor in this agent" although PERFD_NSYS named a working nsys."""
    from perfd.agent.capture_executor import AgentCaptures

    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\n")
    nsys.chmod(0o755)
    monkeypatch.setenv("PERFD_NSYS", str(nsys))
    caps = AgentCaptures("j", str(tmp_path / "a"), 1 << 30, emit=lambda e: None, kineto=False)
    try:
        assert caps.manager.nsys is caps.nsys
    finally:
        caps.close()
    monkeypatch.setenv("PERFD_NSYS", str(tmp_path / "missing"))
    caps = AgentCaptures("j", str(tmp_path / "b"), 1 << 30, emit=lambda e: None, kineto=False)
    try:
        assert caps.manager.nsys is None
    finally:
        caps.close()


class _Exec(Exception):
    """Raised by the stand-in for os.execv: the argv perfd nsys-exec would have become."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(argv)
        self.argv = argv


def _execv(path: str, argv: list[str]) -> None:
    raise _Exec([path, *argv[1:]])


@pytest.mark.slow
def test_nsys_prefix_runs_each_rank_in_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The default prefix: the printed words, run as torchrun --no-python runs them (RANK set),
    become ``nsys launch --session-new=perfd-<job>-r<RANK> CMD`` — the session name the capture
    manager looks for. The words are this Python's ``-m perfd.app.cli nsys-exec ...``: run here by the
    CLI's main() with the rank's environment, os.execv (which makes the rank's process nsys) replaced
    by a stand-in that stops the command with the argv nsys would have been started with."""
    import os

    from perfd.app.cli import main
    from perfd.capture.nsys_exec import rank_session_prefix

    nsys = tmp_path / "nsys"
    nsys.write_text(f"#!{sys.executable}\n")
    nsys.chmod(0o755)
    monkeypatch.setenv("PERFD_NSYS", str(nsys))
    assert main(["nsys-prefix", "--job", "gpt 8b"]) == 0
    words = capsys.readouterr().out.split()
    assert words == rank_session_prefix("gpt 8b")
    assert words[:3] == [sys.executable, "-m", "perfd.app.cli"]
    monkeypatch.setattr(os, "execv", _execv)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(_Exec) as became:
        main([*words[3:], "python", "train.py", "--lr", "1"])
    assert became.value.argv[0] == str(nsys)
    got = became.value.argv[1:]
    assert got == ["launch", f"--session-new={session_name('gpt 8b', 3)}", "--trace=cuda,nvtx,osrt",
                   "python", "train.py", "--lr", "1"]
    assert session_name("gpt 8b", 3).startswith("perfd-gpt_8b-") and session_name("gpt 8b", 3).endswith("-r3")
    # Refusals: no RANK (not under torchrun), no command.
    monkeypatch.delenv("RANK")
    capsys.readouterr()
    assert main([*words[3:], "python", "train.py"]) == 2
    assert "RANK is unset" in capsys.readouterr().err
    assert main(["nsys-exec", "--job", "j", "--"]) == 2
    assert "no command" in capsys.readouterr().err


def test_job_names_the_shell_or_the_cut_would_merge_get_sessions_and_ncu_paths_of_their_own(
        tmp_path: Path) -> None:
    """``team/a``, ``team a`` and ``team_a`` (and names sharing 40 characters) were once one
    nsys session and one ncu target path: a capture of one job could take another's session."""
    from perfd.capture.ncu_exec import rank_paths
    from perfd.capture.nsys_exec import SHELL_WORD, session_from_base, session_name

    long_a, long_b = "x" * 40 + "-run-a", "x" * 40 + "-run-b"
    names = ["team/a", "team a", "team_a", long_a, long_b, "team_a-0123456789"]
    sessions = {n: session_name(n, 3) for n in names}
    assert len(set(sessions.values())) == len(names), sessions
    assert len({rank_paths(tmp_path, n, 3)[1] for n in names}) == len(names)
    assert sessions["team_a"] == "perfd-team_a-r3"  # a name that is already a clean word keeps it
    for n, s in sessions.items():
        assert SHELL_WORD.fullmatch(s) and len(s) <= 64, (n, s)
    # nsys-prefix prints the base; nsys-exec maps it back to the very session the manager looks for.
    for n in names:
        base = session_name(n)[len("perfd-"):]
        assert session_from_base(base, 3) == sessions[n]


def test_start_range_arms_a_session_for_the_next_profiler_range(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def runner(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    ex = NsysExecutor(nsys="/x/nsys", runner=runner)
    ex.start_range("perfd-j-r1", tmp_path / "rank1")
    assert seen == [["/x/nsys", "start", "--session=perfd-j-r1", "-c", "cudaProfilerApi",
                     "--capture-range-end=stop", "--sample=none", "--cpuctxsw=none", "-o",
                     str(tmp_path / "rank1"), "--force-overwrite=true"]]
    with pytest.raises(ValueError):
        ex.start_range("bad name; rm -rf /", tmp_path / "x")


def test_a_window_on_several_sessions_stops_them_side_by_side(tmp_path: Path) -> None:
    """``nsys stop`` returns only once its report is written; stopped one after another, later ranks
    recorded longer (3.5 s and 13.8 s for a 3 s window on Megatron-LM PP=2). Each stand-in ``stop``
    here waits at a barrier for the other: stops issued one after another would break it."""
    barrier = threading.Barrier(2, timeout=10)
    order: list[str] = []

    def runner(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if cmd[1] == "stop":
            barrier.wait()  # BrokenBarrierError if the other stop is not running at the same time
            session = cmd[2].split("=", 1)[1]
            (tmp_path / f"{session}.nsys-rep").write_bytes(b"R" * 64)
        order.append(cmd[1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    ex = NsysExecutor(nsys="/x/nsys", runner=runner)
    reports, errors = ex.run_window(["perfd-j-r0", "perfd-j-r1"], tmp_path, 0.0, lambda s: None,
                                    lambda t: None, stop_timeout_s=10)
    assert errors == [] and sorted(reports) == ["perfd-j-r0", "perfd-j-r1"]
    assert order.count("start") == 2 and order.count("stop") == 2
