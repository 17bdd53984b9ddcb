"""A hook sender is who the kernel says it is: another local user who may write the
hook socket (mode 0666, as documented for jobs of other users) names other processes in step records,
and the root agent must neither follow nor dump them.

The attacker is a real process of another uid (tests/security/other_user.py) speaking the hook's wire
format byte for byte; the victim is a root process with a secret on its command line; the agent is the
real `perfd agent` running as root beside a real aggregator. The attack as the issue ran it: step
records claiming the victim and the aggregator as ranks 0 and 1, then silence.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.hook import peers as P
from perfd.core.limits import HOOK_QUEUE_SHARES
from perfd.hook import StepHook, wire
from tests.inproc import pipeline
from tests.procs import Procs, WaitTimeout, get_json, http_get, start_agent, start_aggregator, wait_for
from tests.security.other_user import OtherUser, other_user

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_PASSCRED is Linux's")

SECRET = "hunter2-e1f0"  # on the victim's command line; it must appear nowhere perfd serves
# The attacker: the hook's step record (perfd/hook/wire.py STEP) packed by hand, one per (rank, pid)
# of its plan per step, then silence. "self" is its own pid, "setuid" a setuid-root child of it
# (/usr/bin/passwd waiting for input: its descendant, but not its user's process alone).
ATTACK = r"""
import json, math, os, socket, struct, subprocess, sys, time
STEP = struct.Struct("<BBHiIqqqqqqqqIIIdd")
path, plan, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
child = None
if any(who == "setuid" for _, who in plan):
    child = subprocess.Popen(["/usr/bin/passwd"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    time.sleep(0.3)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("")
for i in range(1, steps + 1):
    for rank, who in plan:
        pid = {"self": os.getpid(), "setuid": child.pid if child else 0}.get(who, who)
        s.sendto(STEP.pack(1, 1, 0, rank, pid, i, time.time_ns(), 20_000_000, -1, -1, -1, -1, -1, 0, 0, 0,
                           math.nan, math.nan), path)
    print("step", i, flush=True)  # progress: a datagram socket blocks while the agent reads slowly
    time.sleep(0.05)
print("sent", os.getpid(), child.pid if child else 0, flush=True)
time.sleep(600)  # silent, as the issue's attacker: the stall that follows asks for stacks
"""


def _victim(procs: Procs) -> subprocess.Popen[bytes]:
    """A root process holding a secret on its command line (what the issue saw served)."""
    return procs.start("victim", [sys.executable, "-c", "import time; time.sleep(600)",
                                  f"--db-password={SECRET}"])


def _stop(p: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait(timeout=10)


def _collect_until(c: HookCollector, done: Any, timeout: float = 30.0) -> Collected:
    out, deadline = Collected(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = c.collect(time.time())
        out.steps += got.steps
        if done(out):
            break
        time.sleep(0.02)
    return out


@pytest.fixture
def attacker() -> OtherUser:
    return other_user()


def test_records_naming_processes_not_the_senders_are_refused(shared_tmp: Path, attacker: OtherUser,
                                                               tmp_path: Path) -> None:
    """The job runs as the attacker's user (its ``job_user``): a process of the job naming processes that
    are not its own (root's, the aggregator's, a setuid child) is refused; its own rank is taken. A
    process of another user than the job's (here root's own hook) is refused whatever it names."""
    sock = str(shared_tmp / "hook.sock")
    col = HookCollector({"socket_path": sock, "job": "j", "mode": "0666", "job_user": attacker.uid})
    col.start()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # Rank 5 from this (root) process: a real StepHook, but root is not the job's user.
        hook = StepHook(sock, cuda=False, rank=5, flush_interval_s=0)
        with hook.step():
            pass
        _collect_until(col, lambda o: col.errors.get("sender:not_job_user", 0) >= 1)
        plan: list[list[Any]] = [[0, victim.pid], [1, os.getpid()], [2, "self"], [3, "setuid"]]
        atk = _attack(attacker, sock, plan, 3, tmp_path / "attacker.out", 30, col.errors)
        try:
            _, atk_pid, child_pid = _sent_line(tmp_path / "attacker.out")
            out = _collect_until(col, lambda o: sum(col.errors.get(f"sender:{r}", 0) for r in (
                P.NOT_SENDER, P.OTHER_UID)) >= 9 and len(o.steps) >= 3)
        finally:
            _stop(atk)
        # Only its own pid, as its own rank, got in; the kernel's pid is the one kept.
        assert sorted((s.rank, s.iteration) for s in out.steps) == [(2, 1), (2, 2), (2, 3)]
        assert all(s.fields["pid"] == atk_pid for s in out.steps)
        assert col.verified[int(atk_pid)] == attacker.uid
        assert col.peers[2].uid == attacker.uid and 5 not in col.peers
        # The victim and root's process (ranks 0, 1): not the sender's; its setuid child (rank 3): not
        # its user's alone. Three steps each. Root's hook: not the job's user.
        assert col.errors[f"sender:{P.NOT_SENDER}"] == 6
        assert col.errors[f"sender:{P.OTHER_UID}"] == 3 and int(child_pid) not in col.verified
        assert col.errors["sender:not_job_user"] >= 1 and os.getpid() not in col.verified
        assert victim.pid not in col.verified
    finally:
        victim.kill()
        victim.wait()
        col.stop()


def _where(p: subprocess.Popen[bytes], out: Path) -> str:
    """A process's exit status or its state and kernel wait (/proc), and its output so far."""
    said = out.read_text(errors="replace")[-2000:]
    if p.poll() is not None:
        return f"the attacker exited {p.returncode}, output {said!r}"
    try:
        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = Path(f"/proc/{p.pid}/wchan").read_text()
    except OSError as e:
        state, wchan = "?", str(e)
    return f"the attacker (pid {p.pid}) is in state {state}, waiting in {wchan!r}, output {said!r}"


def _sent_line(out: Path) -> list[str]:
    """The attacker's last line, "sent PID CHILD_PID" (its steps' lines come before it)."""
    return next(ln for ln in out.read_text().splitlines() if ln.startswith("sent")).split()


def _attack(attacker: OtherUser, sock: str, plan: list[list[Any]], steps: int, out: Path, timeout: float,
            errors: Mapping[str, int] | None = None) -> subprocess.Popen[bytes]:
    """The attacker started and waited for until it has sent its records ("sent"); the wait goes on
    while it steps (a unix datagram socket holds 10 unread: its sends wait for the reader). One that
    does not get there fails, saying where it was (its output, state and kernel wait): twice in full
    suites one printed nothing at all, beside gRPC's "Other threads are currently calling into gRPC,
    skipping fork() handlers" from the worker that forked it — the cause the second user's processes
    now avoid (tests/security/other_user.py: setpriv, so Popen vforks and execs at once); it was
    started a second time then, which no longer is."""
    atk = attacker.python(ATTACK, sock, json.dumps(plan), str(steps), out=out)
    try:
        wait_for(lambda: "sent" in out.read_text(), timeout, "the attacker's records",
                 progress=lambda: out.read_text().count("step"))
    except WaitTimeout as e:
        where = _where(atk, out)
        _stop(atk)
        raise AssertionError(f"{e}; {where}; collector errors {dict(errors or {})}") from None
    return atk


FLOOD_RANKS, FLOOD_STEPS = 200, 30  # the flooder's plan: 200 datagrams a step, 6,000 in all
JOB_RECORDS = 300  # the job's own, sent while the flood runs


def _handled(col: HookCollector) -> int:
    """Datagrams the receiver thread has taken off the socket so far: queued, refused or dropped."""
    refused, _, dropped, over_share, _ = col.inbox.counters()
    return len(col.inbox.items) + dropped + over_share + sum(refused.values())


def _job_records_during_flood(col: HookCollector, flooder: OtherUser, out: Path) -> Collected:
    """The issue's flood: ``flooder`` sends FLOOD_RANKS x FLOOD_STEPS one-record
    datagrams, and once its first step is out this process (the job's user, rank 0) sends JOB_RECORDS
    step records, one datagram each, blocking (none is lost at the socket: each waits for the
    receiver). Nothing is collected until the receiver has taken every datagram off the socket, as
    under an agent busy for a moment; then everything is collected."""
    sock = col.config.socket_path

    def job() -> None:
        wait_for(lambda: "step" in out.read_text() if out.exists() else False, 60, "the flood's first step")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind("")  # an address, as the hook has: requests go back to it
        try:
            for i in range(1, JOB_RECORDS + 1):
                s.sendto(wire.pack_step(wire.StepMsg(0, os.getpid(), i, time.time_ns(), 20_000_000)), sock)
        finally:
            s.close()

    sender = threading.Thread(target=job, name="job-records")
    sender.start()
    plan: list[list[Any]] = [[1, "self"]] * FLOOD_RANKS
    atk = _attack(flooder, sock, plan, FLOOD_STEPS, out, 60, col.errors)
    try:
        sender.join(60)
        assert not sender.is_alive(), "the job's records were not all sent"
        total = FLOOD_RANKS * FLOOD_STEPS + JOB_RECORDS
        wait_for(lambda: _handled(col) >= total, 30, "the receiver to take every datagram",
                 progress=lambda: _handled(col))
        return _collect_until(col, lambda o: not col.inbox.items, 10)
    finally:
        _stop(atk)


def _mine(got: Collected) -> list[tuple[int, int]]:
    # the hook's records name their rank ("last" / "all" only for a log's)
    return sorted((int(s.rank), s.iteration) for s in got.steps if s.fields["pid"] == str(os.getpid()))


@pytest.mark.slow
def test_a_flood_from_another_uid_takes_no_room_from_the_jobs_records(shared_tmp: Path, attacker: OtherUser,
                                                                       tmp_path: Path) -> None:
    """The issue: with the socket 0666 another uid's flood filled the queue before its senders were
    checked, and 122 of the job's 300 records were dropped (``queue_full``). Now its datagrams are
    refused off ``recvmsg``, counted, and take no room: all 300 arrive."""
    col = HookCollector({"socket_path": str(shared_tmp / "hook.sock"), "job": "j", "mode": "0666",
                         "max_queued": 3200})  # the flood (6,000) is larger; the job's share 400
    col.start()
    try:
        got = _job_records_during_flood(col, attacker, tmp_path / "flood.out")
        assert _mine(got) == [(0, i) for i in range(1, JOB_RECORDS + 1)]
        assert len(got.steps) == JOB_RECORDS  # none of the flood's
        assert col.errors[f"sender:{P.NOT_JOB_USER}"] == FLOOD_RANKS * FLOOD_STEPS  # every one counted
        assert "queue_full" not in col.errors and col.queued_bytes == 0
    finally:
        col.stop()


@pytest.mark.slow
def test_one_process_of_the_jobs_user_cannot_crowd_out_the_others(shared_tmp: Path, tmp_path: Path) -> None:
    """A process of the job's own user (a second root process here) floods: it is held to its share of
    the queue (``queue_share_full``), the job's other process keeps all of its 300 records."""
    col = HookCollector({"socket_path": str(shared_tmp / "hook.sock"), "job": "j", "mode": "0666",
                         "max_queued": 3200})
    col.start()
    try:
        got = _job_records_during_flood(col, OtherUser("root", 0, 0), tmp_path / "flood.out")
        assert _mine(got) == [(0, i) for i in range(1, JOB_RECORDS + 1)]
        share = 3200 // HOOK_QUEUE_SHARES
        assert len([s for s in got.steps if s.rank == 1]) == share  # the flooder's: its share, taken
        assert col.errors["queue_share_full"] == FLOOD_RANKS * FLOOD_STEPS - share  # the rest counted
        assert "queue_full" not in col.errors
    finally:
        col.stop()


@pytest.fixture
def live(shared_tmp: Path, tmp_path: Path) -> Iterator[tuple[Procs, str, str, Path]]:
    sock = str(shared_tmp / "hook.sock")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"batch_interval_s: 0.5\njob_user: {other_user().name}\ncollectors:\n"
                   f"  hook: {{socket_path: {sock}, mode: '0666'}}\n  ranks: {{interval_s: 1.0}}\n")
    with Procs(tmp_path) as procs:
        grpc_port, _, base = start_aggregator(procs, "--rules-interval", "1")
        start_agent(procs, grpc_port, "--job", "attacked", "--host", "off", "--node", "n1", nvml="off",
                    config=cfg)
        wait_for(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        yield procs, base, sock, tmp_path


@pytest.mark.e2e  # the aggregator a root process apart from the agent: what the attacker names
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_root_agent_dumps_only_the_senders_own_process(live: tuple[Procs, str, str, Path],
                                                           attacker: OtherUser) -> None:
    procs, base, sock, out_dir = live
    victim = _victim(procs)
    aggregator_pid = next(p.pid for n, _, p in procs.procs if n == "aggregator")
    # Ranks 0 and 1 claimed for the victim and the aggregator (the attack), rank 2 the
    # attacker's own process (allowed: its own, and the control that shows the stall path works).
    plan: list[list[Any]] = [[0, victim.pid], [1, aggregator_pid], [2, "self"]]
    atk = _attack(attacker, sock, plan, 40, out_dir / "attacker.out", 60)
    try:
        atk_pid = int(_sent_line(out_dir / "attacker.out")[1])

        def stall() -> dict[str, Any] | None:
            for inc in get_json(f"{base}/api/jobs/attacked/incidents")["incidents"]:
                st = (inc.get("evidence") or {}).get("stall") or {}
                if "2" in (st.get("stacks") or {}):
                    return dict(st)
            return None

        # The attacker went silent: a stall, and the agent's stacks of the job's verified ranks.
        st = wait_for(stall, 90, "the stall's stacks", interval=0.5)
    finally:
        _stop(atk)
    stacks = st["stacks"]
    assert stacks["2"]["pid"] == atk_pid and "<module>" in stacks["2"].get("stack", ""), stacks["2"]
    assert set(stacks) == {"2"}, stacks  # the victim and the aggregator were never dumped
    assert set(st["ranks"]) == {"2"}, st["ranks"]  # nor followed for host evidence
    served = "".join(http_get(f"{base}{p}").decode() for p in (
        "/api/jobs/attacked/incidents", "/api/jobs/attacked/summary", "/api/jobs/attacked/gpus",
        "/api/jobs/attacked/iterations", "/api/events"))
    assert SECRET not in served and f'"pid": {victim.pid}' not in served
    # Refused, counted and logged by the agent's hook collector (the records of ranks 0 and 1).
    log = (out_dir / "agent.out").read_text()
    assert "refused" in log and P.NOT_SENDER in log


JOB_LOOP = """
import sys, time
from perfd.hook import StepHook, wire
from perfd.core.limits import HOOK_QUEUE_SHARES
hook = StepHook(cuda=False, rank=0, flush_interval_s=0.05)
while True:
    with hook.step():
        time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stacks_and_command_lines_are_served_to_token_holders_only_and_redacted(tmp_path: Path) -> None:
    token = "a-token-of-enough-length-43"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)  # a token others may read is refused
    (tmp_path / "token").chmod(0o600)
    sock = str(tmp_path / "hook.sock")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"batch_interval_s: 0.5\ncollectors:\n  hook: {{socket_path: {sock}}}\n"
                   "  ranks: {interval_s: 1.0}\n")
    auth = {"Authorization": f"Bearer {token}"}
    # The aggregator and the agent in the test's process (tests/inproc.py); the job a process (stopped).
    with Procs(tmp_path) as procs, pipeline(tmp_path, "--rules-interval", "1", "--auth-token-file",
                                            tmp_path / "token") as pipe:
        base = pipe.base
        pipe.agent("--job", "own", "--host", "off", "--node", "n1", "--auth-token-file", tmp_path / "token",
                   "--nvml", "off", "--config", cfg)
        pipe.wait(lambda: os.path.exists(sock), 30, "the agent's hook socket")
        (tmp_path / "loop.py").write_text(JOB_LOOP)
        job = procs.start("job", [sys.executable, str(tmp_path / "loop.py"), f"--api-key={SECRET}"],
                          env={"PERFD_HOOK_SOCKET": sock})

        def api(path: str) -> Any:
            return json.loads(http_get_h(f"{base}{path}", auth))

        wait_for(lambda: ((api("/api/jobs")["jobs"] or [{}])[0].get("iterations_seen") or 0) >= 30, 60,
                 "the job's steps at the aggregator", ignore=(OSError, ValueError, KeyError, IndexError))
        os.kill(job.pid, signal.SIGSTOP)
        try:
            stack = wait_for(lambda: next(((i["evidence"]["stall"].get("stacks") or {}).get("0")
                                           for i in api("/api/jobs/own/incidents")["incidents"]
                                           if "stall" in i["kinds"]), None), 60, "the stopped rank's stack",
                             interval=0.5, ignore=(OSError, KeyError))
            assert "stack" in stack, stack
            # py-spy names the process by its command line: served redacted.
            assert f"Process {job.pid}" in stack["stack"] and "loop.py --api-key=<redacted>" in stack["stack"]
            assert SECRET not in stack["stack"]
            # Without the token: every path that could show a stack or a command line is refused ...
            for path in ("/api/jobs/own/incidents", "/api/jobs/own/summary", "/api/jobs/own/gpus",
                         "/api/events", "/api/jobs"):
                with pytest.raises(urllib.error.HTTPError) as err:
                    http_get(f"{base}{path}")
                assert err.value.code == 401, path
            # ... and what stays open carries neither.
            metrics = http_get(f"{base}/metrics").decode()
            assert 'perfd_job_stalled_seconds{job_name="own"}' in metrics
            assert "MainThread" not in metrics and "--api-key" not in metrics and SECRET not in metrics
        finally:
            os.kill(job.pid, signal.SIGCONT)


def http_get_h(url: str, headers: dict[str, str]) -> bytes:
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return bytes(r.read())
