"""The Kineto on-demand daemon, against a client that speaks the protocol exactly as libkineto does
(``IpcFabricConfigClient`` + ipcfabric ``FabricManager``/``EndPoint``): its own bound datagram socket
named ``dynoconfigclient<uuid>``, a 40-byte header + ``LibkinetoRequest``, the reply read from that
socket. And, when torch is installed, an unmodified torch process writing a trace on request: for the
daemon alone, and for the capture manager's whole capture (the real processes of this suite's capture
tests live here, one xdist group)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from perfd.capture import kineto_daemon as kd
from perfd.capture.kineto_daemon import (
    CONFIG_ACTIVITIES,
    CONFIG_EVENTS,
    KinetoDaemon,
    KinetoDaemonError,
    build_config,
    kineto_env,
    trace_complete,
)
from perfd.capture.manager import CaptureManager
from perfd.capture.store import CaptureStore
from perfd.transport.codec import Command
from tests.capture.trace_content import holds_ops

BOTH = CONFIG_EVENTS | CONFIG_ACTIVITIES


class FakeLibkineto:
    """libkineto's side: ``EndPoint(name)`` binds ``\\0name\\0`` (or ``DIR/name``), ``sync_send`` to
    the daemon's name, ``poll_recv(9, 10 ms)`` for the answer (peek the header, then read it all)."""

    def __init__(self, daemon_name: str, socket_dir: str | None = None) -> None:
        self.name = "dynoconfigclient" + str(uuid.uuid4())
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if socket_dir:
            self.sock.bind(os.path.join(socket_dir, self.name))
            self.dest: str | bytes = os.path.join(socket_dir, daemon_name)
        else:
            self.sock.bind(b"\0" + self.name.encode() + b"\0")
            self.dest = b"\0" + daemon_name.encode() + b"\0"
        self.socket_dir = socket_dir

    def send(self, msg_type: bytes, payload: bytes) -> None:
        header = struct.pack("<Q32s", len(payload), msg_type)  # struct Metadata, memcpy'd
        self.sock.sendto(header + payload, self.dest)

    def recv(self, tries: int = 9, sleep_s: float = 0.01) -> tuple[bytes, bytes, object] | None:
        for _ in range(tries):
            try:
                peek = self.sock.recv(40, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                time.sleep(sleep_s)
                continue
            size, typ = struct.unpack("<Q32s", peek)
            data, addr = self.sock.recvfrom(40 + size)
            self._check_source(addr)
            return typ.split(b"\0")[0], data[40:40 + size], addr
        return None

    def _check_source(self, addr: object) -> None:
        # EndPoint::getName: libkineto terminates the process on a reply from the wrong kind of name.
        if self.socket_dir:
            assert isinstance(addr, str) and addr.startswith(self.socket_dir + "/"), addr
        else:
            assert isinstance(addr, bytes) and addr[:1] == b"\0", addr

    def request(self, pids: list[int], config_type: int = BOTH, job_id: int = 0) -> str | None:
        payload = struct.pack("<iiq", config_type, len(pids), job_id) + struct.pack(f"<{len(pids)}i", *pids)
        self.send(b"req", payload)
        got = self.recv(tries=100)
        if got is None:
            return None
        typ, body, _ = got
        assert typ == b"req"
        return body.decode()

    def close(self) -> None:
        self.sock.close()
        if self.socket_dir:
            os.unlink(os.path.join(self.socket_dir, self.name))


@pytest.fixture
def daemon():
    d = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    c = FakeLibkineto(daemon.socket_name)
    yield c
    c.close()


def test_wire_layout_matches_libkineto_structs():
    assert kd.HEADER.size == 40  # size_t + char[32]
    assert kd.REQUEST.size == 16  # int, int, int64 (pids[] follows, no padding)
    msg = kd.pack_request(CONFIG_ACTIVITIES, 77, [10, 9, 1])
    size, typ = struct.unpack_from("<Q32s", msg)
    assert size == 16 + 12 and typ.rstrip(b"\0") == b"req"
    assert struct.unpack_from("<iiq3i", msg, 40) == (CONFIG_ACTIVITIES, 3, 77, 10, 9, 1)
    _kind, payload = kd.unpack_message(msg)
    assert kd.unpack_request(payload) == (CONFIG_ACTIVITIES, 77, (10, 9, 1))
    with pytest.raises(ValueError):
        kd.unpack_message(msg[:-1])
    assert kd.socket_address("dynolog") == b"\0dynolog\0"
    assert kd.socket_address("dynolog", "/run/k") == "/run/k/dynolog"


def test_idle_daemon_answers_nothing_with_an_empty_reply():
    now = [1_700_000_000.0, 50.0]  # the daemon's clocks (wall, monotonic): the test moves them
    daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="",
                          clock=lambda: now[0], monotonic=lambda: now[1]).start()
    client = FakeLibkineto(daemon.socket_name)
    try:
        assert client.request([4242, 1]) == ""  # size 0: "nothing", as dynolog replies
        assert daemon.requests_seen[4242] == 1
        assert daemon.ancestors[4242] == (1,)
        assert daemon.polling()[4242] == (1,)
        now[0] += 4.0  # the wall clock stepped: the poll's period is the monotonic clock's
        now[1] += 0.05
        client.request([4242, 1])
        assert daemon.intervals[4242] == pytest.approx(0.05)
        now[1] += 0.2
        client.request([4242, 1])
        assert daemon.intervals[4242] == pytest.approx(0.2)
        assert daemon.shortest_intervals[4242] == pytest.approx(0.05)
    finally:
        client.close()
        daemon.stop()


def test_armed_pid_gets_its_config_once_and_launchers_never(daemon, client):
    cfg = build_config("/tmp/x.json", iterations=3)
    arming = daemon.arm({500}, cfg, time.time() + 30)
    # torchrun (pid 400) and a data-loader worker (pid 600, child of 500) poll too.
    assert client.request([400, 1]) == ""
    assert client.request([600, 500, 400, 1]) == ""
    assert client.request([500, 400, 1]) == cfg
    assert client.request([500, 400, 1], CONFIG_EVENTS) == ""  # tracing now: busy
    assert client.request([500, 400, 1]) == ""  # answered once per arming
    st = arming.state(500)
    assert st.answered_at is not None and st.active_at is not None and st.idle_at is not None
    assert arming.wait_idle(500, 0.1)
    assert daemon.armed_pids() == set()  # done: the arming ended itself
    assert daemon.answers_sent == 1


def test_busy_profiler_is_not_answered_until_it_can_accept(daemon, client):
    arming = daemon.arm({501}, "ACTIVITIES_DURATION_MSECS=10\n", time.time() + 30)
    assert client.request([501], CONFIG_EVENTS) == ""  # its own torch.profiler is running
    assert arming.state(501).busy_polls == 1
    assert client.request([501], BOTH) == "ACTIVITIES_DURATION_MSECS=10\n"
    assert arming.wait_answered(0.1)


def test_one_arming_per_pid_and_per_pid_configs(daemon, client):
    arming = daemon.arm({7: "A\n", 8: "B\n"}, expires_at=time.time() + 30)
    with pytest.raises(ValueError, match="already armed"):
        daemon.arm({8}, "C\n")
    assert client.request([8, 1]) == "B\n"
    assert client.request([7, 1]) == "A\n"
    assert set(arming.answered()) == {7, 8}
    daemon.disarm(arming)
    assert daemon.armed_pids() == set()
    daemon.arm({8}, "C\n")  # free again


def test_expired_arming_is_not_answered(daemon, client):
    arming = daemon.arm({900}, "X\n", time.time() - 1)
    assert client.request([900]) == ""
    assert arming.answered() == {}
    assert arming.cancelled


def test_an_arming_disarmed_while_a_request_for_it_was_read_is_not_answered(daemon, monkeypatch):
    """The receive thread looks the arming up, then the capture's worker gives up and disarms it (its
    capture failed, and said so), then the thread answers: a trace nobody collects. Made in order here:
    the disarm comes at the sender's check, which runs between the two."""
    arming = daemon.arm({910}, "X\n", time.time() + 30)
    real = kd._may_ask_for

    def disarmed_meanwhile(uid, pid):
        daemon.disarm(arming)
        return real(uid, pid)

    monkeypatch.setattr(kd, "_may_ask_for", disarmed_meanwhile)
    assert daemon._on_request(CONFIG_ACTIVITIES, 0, (910, 1), None, sender_uid=os.getuid()) == ""
    assert arming.cancelled and arming.answered() == {}
    assert daemon.answers_sent == 0


def test_kernel_reported_sender_pid_matches_across_pid_namespaces(daemon, client):
    # The job's own pid list says 12 (its namespace); the kernel says who really sent it.
    daemon.arm({os.getpid()}, "NS\n", time.time() + 30)
    assert client.request([12, 1]) == "NS\n"
    assert daemon.sender_pids.get(12) == os.getpid()


def test_registration_and_malformed_datagrams(daemon, client):
    client.send(b"ctxt", struct.pack("<iiq", 0, 1234, 0))
    got = client.recv(tries=100)
    assert got is not None and got[0] == b"ctxt" and struct.unpack("<i", got[1]) == (1,)
    client.sock.sendto(b"short", client.dest)
    client.send(b"req", struct.pack("<iiq", 3, 0, 0))  # no pids: dynolog does not answer either
    client.send(b"bogus", b"")
    assert client.request([5]) == ""  # still serving
    assert daemon.errors.get("malformed") == 1
    assert daemon.errors.get("malformed_req") == 1
    assert daemon.errors.get("unknown_type") == 1


def test_file_socket_mode():
    # A short folder: a client binds DIR/dynoconfigclient<uuid>, and a Unix address holds 107 bytes
    # (pytest's tmp_path under xdist, .../popen-gwN/test_file_socket_mode0/, is too long).
    sdir = tempfile.mkdtemp(prefix="pk", dir="/tmp")
    with KinetoDaemon(socket_name="dynolog", socket_dir=sdir) as d:
        assert d.address == f"{sdir}/dynolog"
        assert (os.stat(d.address).st_mode & 0o777) == 0o666
        c = FakeLibkineto("dynolog", sdir)
        try:
            d.arm({321}, "F\n", time.time() + 30)
            assert c.request([321]) == "F\n"
        finally:
            c.close()
    assert not os.path.exists(f"{sdir}/dynolog")
    shutil.rmtree(sdir, ignore_errors=True)


def test_name_in_use_is_a_clear_error(daemon):
    with pytest.raises(KinetoDaemonError, match="another Kineto daemon"):
        KinetoDaemon(socket_name=daemon.socket_name, socket_dir="").start()


def test_trace_complete(tmp_path):
    t = tmp_path / "t.json"
    t.write_text('{"traceEvents": [{"ph": "X"},')
    assert not kd.trace_complete(t)
    t.write_text('{"traceEvents": []}\n')
    assert kd.trace_complete(t)
    assert not kd.trace_complete(tmp_path / "missing.json")


def test_build_config_and_env(tmp_path):
    cfg = build_config("/tmp/t.json", iterations=3, roundup=10)
    assert cfg.splitlines() == ["ACTIVITIES_LOG_FILE=/tmp/t.json", "PROFILE_START_ITERATION=0",
                                "PROFILE_START_ITERATION_ROUNDUP=10", "ACTIVITIES_ITERATIONS=3"]
    cfg = build_config("/tmp/t.json", duration_ms=500, start_time_ms=1_700_000_000_000, warmup_s=1)
    assert "ACTIVITIES_DURATION_MSECS=500" in cfg and "PROFILE_START_TIME=1700000000000" in cfg
    assert "ACTIVITIES_WARMUP_PERIOD_SECS=1" in cfg and "ITERATION" not in cfg
    bad_args: list[dict[str, Any]] = [
        {"log_file": "/tmp/../etc/x.json", "iterations": 1}, {"log_file": "/tmp/a\nB=1", "iterations": 1},
        {"log_file": "/tmp/a.json"}, {"log_file": "/tmp/a.json", "iterations": 0}]
    for bad in bad_args:
        with pytest.raises(ValueError):
            build_config(**bad)
    env = kineto_env(poll_s=1, config_dir=tmp_path, trace_dir=tmp_path / "traces")
    assert env["KINETO_USE_DAEMON"] == "1"
    assert Path(env["KINETO_CONFIG"]).read_text() == "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n"
    assert env["KINETO_ONDEMAND_TRACE_DIR"] == str(tmp_path / "traces")
    with pytest.raises(ValueError):
        kineto_env(poll_s=0.5, config_dir=tmp_path)  # type: ignore[arg-type]


# --- a real torch process ----------------------------------------------------------------------
JOB = textwrap.dedent("""
    import os, sys, time
    import torch
    m = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    print("ready", flush=True)
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[1]):
        loss = m(torch.randn(16, 32)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.002)
""")


def torch_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def start_torch_job(tmp_path: Path, env_extra: dict[str, str], seconds: float) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, **env_extra}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.Popen([sys.executable, str(script), str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _capture_window_us(events: list[dict[str, Any]]) -> float:
    """The capture window libkineto writes in every trace it ends, whether or not the job ran an
    operator in it: the process's metadata events stamped at the window's start, and the global
    instant "Record Window End" at its end (µs)."""
    starts = {e["ts"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    ends = {e["ts"] for e in events if e.get("ph") == "i" and e.get("name") == "Record Window End"}
    assert len(starts) == 1 and len(ends) == 1, (starts, ends)
    return float(ends.pop()) - float(starts.pop())


@pytest.mark.slow
# One worker runs the real torch processes one after another (`make test` runs pytest-xdist with
# --dist loadgroup): two at once on a small machine starve each other's traced steps.
@pytest.mark.xdist_group("torch_processes")
@pytest.mark.skipif(not torch_available(), reason="torch is not installed (CPU torch enables this test)")
def test_real_torch_process_traces_the_window_its_config_asks(tmp_path):
    """An unmodified torch process with KINETO_USE_DAEMON=1 and a 1 s poll takes the config perfd's
    daemon hands it and writes its trace where the config says, for the window it says: file-socket
    mode keeps the test off the host-wide abstract name ``dynolog``.

    The CPU build traces for the config's duration and ignores its iterations (checked: a config of 3
    iterations alone traced libkineto's default 500 ms, 3 to 18 steps in it at a load of ~11); a GPU
    build's iteration-aligned window is the GPU machine's to prove (tests/gpu/hook_trace_live.py). What
    this process makes of its window is the machine's: at a load of ~11 the job's 2 s window held 2 to
    38 optimizer steps over eight runs, and in one loaded suite run none (the job starved of its CPU
    for it). So the test holds what the config decides, exactly: the capture window libkineto writes
    in every trace is the 2 s it asked (not libkineto's 500 ms default); the steps in it are printed."""
    # A short directory: libkineto's client binds DIR/dynoconfigclient<uuid> (Unix addresses: 107 bytes).
    sdir = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    env = kineto_env(poll_s=1, config_dir=tmp_path, socket_dir=str(sdir), trace_dir=tmp_path)
    with KinetoDaemon(socket_dir=str(sdir)) as daemon:
        proc = start_torch_job(tmp_path, env, 40)
        steps: list[dict[str, Any]] = []
        try:
            deadline = time.time() + 20
            while proc.pid not in daemon.requests_seen and time.time() < deadline:
                time.sleep(0.1)
            if proc.pid not in daemon.requests_seen:
                proc.kill()
                out = proc.communicate()[0]
                shutil.rmtree(sdir, ignore_errors=True)
                pytest.skip(f"this torch build never polled the daemon (no daemon support?): {out[-500:]}")
            # One arming, of a config with both a window (2 s) and iterations (3): the CPU build takes the
            # window, a GPU build ends the trace after the three iterations.
            out_dir = tmp_path / "arming"
            out_dir.mkdir()
            config = build_config(out_dir / "trace.json", iterations=3, duration_ms=2000)
            arming = daemon.arm({proc.pid}, config, time.time() + 10)
            assert arming.wait_answered(5), "the process did not poll within 5 s of arming"
            assert arming.wait_idle(proc.pid, 20)
            # The trace is written by the job after its window (thousands of events as JSON, on a CPU the
            # machine's load may leave it little of): waited for, whole, while the job that writes it lives.
            def whole() -> tuple[list[str], dict[str, Any] | None]:
                traces = sorted(out_dir.glob("trace_*.json"))
                try:
                    return [t.name for t in traces], json.loads(traces[0].read_text()) if traces else None
                except ValueError:  # still being written
                    return [t.name for t in traces], None

            names, doc = whole()
            while doc is None and proc.poll() is None:
                time.sleep(0.2)
                names, doc = whole()
            assert names == [f"trace_{proc.pid}.json"] and doc is not None, names
            steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("Optimizer.step")]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    shutil.rmtree(sdir, ignore_errors=True)
    window = _capture_window_us(doc["traceEvents"])
    spans = [e for e in doc["traceEvents"] if e.get("cat") == "Trace" and e.get("ph") == "X"]
    print(f"{len(steps)} optimizer steps in the job's window of {window / 1e6:.3f} s; profiler spans "
          f"{[s['dur'] for s in spans]}")
    # The config's window, 2,000 ms, not libkineto's default 500. libkineto ends the window at the
    # requested start + the duration and begins it when its thread gets there, so a loaded machine
    # shortens it by that thread's late start (eight loaded runs: 1.99 to 2.11 s); 1 s tells the two
    # apart with a second of such lateness allowed.
    assert window >= 1_000_000, window
    # The profiler's own span ("PyTorch Profiler (0)") is written only where the job ran an operator in
    # the window (libkineto skips an empty CPU trace): a job starved of its CPU for all of it, or one
    # that runs none (a torch process sleeping through its window, checked: its trace holds the window's
    # markers alone), has none. Where there is one, it is that window.
    assert len(spans) <= 1 and (not spans or spans[0]["dur"] >= 1_000_000), spans
    ops = sum(e.get("cat") in ("cpu_op", "user_annotation") for e in doc["traceEvents"])
    assert bool(spans) == bool(ops), (len(spans), ops)
    # The 1 s poll of kineto_env is in effect (libkineto's default asks every 5 s): told by the
    # shortest period the daemon measured between the process's polls (a loaded machine mostly
    # lengthens one; a 5 s poller reads under 3 s only after a receipt 2 s late).
    assert proc.pid in arming.answered() and daemon.shortest_intervals[proc.pid] < 3.0


@pytest.mark.slow
# One worker runs the real torch processes one after another (`make test` runs pytest-xdist with
# --dist loadgroup): two at once on a small machine starve each other's traced steps.
@pytest.mark.xdist_group("torch_processes")
@pytest.mark.skipif(not torch_available(), reason="torch is not installed (CPU torch enables this test)")
def test_real_torch_process_captured_by_the_manager(tmp_path):
    sdir = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
    store = CaptureStore(tmp_path / "captures", 10**8)
    env = kineto_env(poll_s=1, config_dir=tmp_path, socket_dir=str(sdir), trace_dir=store.root)
    events: list[dict[str, Any]] = []
    with KinetoDaemon(socket_dir=str(sdir)) as daemon:
        proc = start_torch_job(tmp_path, env, 30)
        mgr = CaptureManager(store, daemon, pids_for_ranks=lambda j, r: {0: proc.pid}, emit=events.append)
        try:
            deadline = time.time() + 20
            while proc.pid not in daemon.requests_seen and time.time() < deadline:
                time.sleep(0.1)
            if proc.pid not in daemon.requests_seen:
                pytest.skip("this torch build never polled the daemon")
            cid = mgr.handle(Command("capture", "cpu-job", (0,), {"steps": "3", "timeout_s": "40"}))
            assert cid and mgr.wait_idle(45)
        finally:
            mgr.close()
            proc.kill()
            proc.communicate()
            shutil.rmtree(sdir, ignore_errors=True)
    m = store.read(cid)
    art = m["artifacts"][0]
    assert art["name"] == f"rank0_{proc.pid}.json" and trace_complete(art["path"])
    assert isinstance(json.loads(Path(art["path"]).read_text())["traceEvents"], list)
    # The verdict the file calls for: analysed where the job's window holds its ops; the rank's miss where
    # its profiler recorded nothing (a starved CPU job: tests/capture/trace_content.py)
    recorded = holds_ops(art["path"])
    if recorded:
        assert m["status"] == "ok", m["reason"]
    else:
        assert m["status"] == "failed" and "holds no timed event" in (m["reason"] or ""), m
    # The 1 s poll (libkineto's default is 5 s): the shortest period the daemon measured between polls
    # (a loaded machine mostly lengthens one; a 5 s poller reads under 3 s only after a receipt 2 s late),
    # below the default's: this tells the two settings apart, it times nothing. The capture's latency is
    # its start's time from the request's, not bounded here.
    assert daemon.shortest_intervals[proc.pid] < 3.0
    t = m["timings"]
    started = t["started_at"]
    assert started is not None and m["latency_s"] == round(started - t["requested_at"], 3) >= 0
    if recorded:
        assert m["analysis"]["0"]["devices"] == []  # CPU only: no kernels, and nothing invented
    ended = "capture_finished" if recorded else "capture_failed"
    assert [e["kind"] for e in events] == ["capture_started", ended]
    assert os.path.exists(m["artifacts"][0]["path"])
