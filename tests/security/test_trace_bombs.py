"""A trace written by a job's process cannot exhaust the memory of the root agent that
reads it, nor of `perfd analyze trace` (perfd.capture.trace_input). A 0.5 MB gzip of JSON whitespace
inflating to 1 GB took a root agent from 62 to 1,092 MB; offline, a 1 MB gzip 2.1 GB, a 0.2 MB xz
2.15 GB. Now every compressed format (gzip, xz, zstd) and a plain file are read within a budget while
they stream in, what the parse may build is bounded, and a refusal is counted (the agent's
perfd_agent_collector_errors_total{collector="captures",reason}), logged once and said: the capture
fails with the reason, `perfd analyze trace` exits non-zero with one line naming the file and the cap.

The bombs of 1 GiB are concatenated members (gzip members, xz streams, zstd frames: each a valid file
of its format, and what every reader of the format reads whole), each compressed once: built in
milliseconds where compressing 1 GiB takes seconds. The agent's reading path and the command run in
a process of their own, under an address-space limit. Their peak RSS is printed, not asserted: it is
the machine's (`perfd bench memory --scenario trace-bomb` measures it); what is asserted is the
refusal at the cap, which is what bounds it.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import lzma
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from perfd.agent.capture_executor import AgentCaptures
from perfd.agent.config import apply_overrides, load_config
from perfd.agent.node_agent import Agent
from perfd.capture import bookkeeping, trace_input
from perfd.capture.chrome_trace import read_chrome_trace
from perfd.capture.kineto_daemon import trace_complete
from perfd.capture.store import CaptureStore
from perfd.capture.trace_input import TraceCaps, TraceRefused, read_trace_bytes
from perfd.core import limits as L
from tests.capture.test_hook_trace_run import StandInHooks, manager, run

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
HEAD, TAIL = b'{"traceEvents": [', b"]}"
PACK: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: gzip.compress(b, 6),
    "xz": lambda b: lzma.compress(b, preset=1),
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
    "plain": lambda b: b,
}
# Small caps for the per-format cases (the same code as the defaults, a thousandth of the bytes).
CAPS = TraceCaps(file_bytes=64 << 10, inflated_bytes=MIB, json_values=10_000)
# The largest recorded traces (36.5 MB of JSON, 2.43 M values): the caps must keep taking them.
LARGEST = [ROOT / "tests/data/captures" / p for p in (
    "kineto_h200_v3_megatron/plan_many_mb_rank0.json.xz", "kineto_h100_megatron/ops_stack_rank0.json.gz",
    "kineto_h100_megatron/ops_default_rank0.json.gz")]


def bomb(path: Path, kind: str, total: int = 1 << 30) -> Path:
    """``{"traceEvents": [`` ``total`` bytes of whitespace ``]}``, in 16 MiB members."""
    pack, pad = PACK[kind], b" " * (16 * MIB)
    one = pack(pad)
    path.write_bytes(pack(HEAD) + one * (total // len(pad)) + pack(TAIL))
    return path


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bombs")
    return {k: bomb(d / f"bomb.json.{k}", k) for k in ("gzip", "xz")}


# Run in the measured process itself: a peak read by the parent (wait4's ru_maxrss) includes the
# moments between fork and exec, when the child is still a copy of the pytest worker (late in a full
# suite 380-430 MB of it: this test once failed so, the reader's own peak being ~170 MB). VmHWM is the
# new program's alone. The address-space limit is a safety net for the machine when the reader is
# broken (the unbounded read took 2.1 GB): far above the ~170 MB the reader takes, so it never decides a
# result on a working reader.
MEASURED = r"""
import atexit, os, resource, sys
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
cap = 6 << 30 if hard == resource.RLIM_INFINITY else min(6 << 30, hard)
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

def _peak():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["PERFD_TEST_PEAK_FILE"], "w") as out:
        out.write(kb)

atexit.register(_peak)
code, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
exec(compile(code, "<measured>", "exec"), {"__name__": "__main__"})
"""


def run_measured(code: str, *args: str) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, peak RSS in MB) of ``code`` run by Python with ``args`` from the
    repository (this checkout's perfd): the peak of that program alone (its VmHWM at exit)."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        peak_file = Path(tmp) / "peak"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PERFD_TEST_PEAK_FILE": str(peak_file)}
        p = subprocess.Popen([sys.executable, "-c", MEASURED, code, *args], stdout=out, stderr=err, env=env,
                             cwd=ROOT)
        try:
            p.wait(300)  # a hang fails the test instead of the suite
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
        assert peak_file.exists(), f"no peak written (exit {p.returncode}): {stderr[-900:]}"
        return p.returncode, stdout, stderr, int(peak_file.read_text()) / 1024


# The root agent's path for a Kineto capture: the daemon hands the rank's process its config, the
# process answers with its trace (here the bomb), the capture run waits for it and analyses it.
AGENT_READ = r"""
import json, shutil, sys, threading, uuid
from pathlib import Path
from perfd.capture.kineto_daemon import CONFIG_ACTIVITIES, CONFIG_EVENTS, KinetoDaemon
from perfd.capture.manager import CaptureManager
from perfd.capture.store import CaptureStore
from perfd.transport.codec import Command
from tests.capture.test_kineto_daemon import FakeLibkineto

bomb, root = Path(sys.argv[1]), Path(sys.argv[2])
daemon = KinetoDaemon(socket_name=f"perfd-test-{uuid.uuid4().hex[:12]}", socket_dir="").start()
events = []
mgr = CaptureManager(CaptureStore(root, quota_bytes=1 << 30), daemon, None,
                     pids_for_ranks=lambda job, ranks: {0: 4242}, emit=events.append, settle_s=0.2,
                     kineto_poll_s=0.2)
done = threading.Event()

def rank():  # its libkineto polls; the config it gets is answered with the bomb as the trace
    client = FakeLibkineto(daemon.socket_name)
    while not done.is_set():
        got = client.request([4242, 1], CONFIG_EVENTS | CONFIG_ACTIVITIES)
        if got:
            path = got.split("ACTIVITIES_LOG_FILE=")[1].splitlines()[0]
            shutil.copy(bomb, path.replace(".json", "_4242.json"))
            break
        done.wait(0.2)  # its poll period
    client.close()

threading.Thread(target=rank, daemon=True).start()
cid = mgr.handle(Command("capture", "job1", (0,), {"tool": "kineto", "steps": "3"}, id="cmd-1"))
idle = mgr.wait_idle(240)
done.set()
m = mgr.store.read(cid)
mgr.close()
daemon.stop()
print(json.dumps({"idle": idle, "status": m["status"], "reason": m["reason"],
                  "errors": getattr(mgr, "errors", None), "analysis": m.get("analysis", {}),
                  "events": [[e["kind"], e["payload"].get("reason")] for e in events]}))
"""


@pytest.mark.slow
def test_the_root_agent_reading_a_1gb_gzip_bomb_stays_small_and_fails_the_capture_counted(
        bombs: dict[str, Path], tmp_path: Path) -> None:
    code, out, err, peak = run_measured(AGENT_READ, str(bombs["gzip"]), str(tmp_path / "captures"))
    assert code == 0, err
    got = json.loads(out.splitlines()[-1])
    print(f"FIGURES the agent's reading path of a 1 GiB gzip bomb peaked at {peak:.0f} MB")
    assert got["idle"] and got["status"] == "failed", got
    assert got["reason"].startswith("rank 0: its trace rank0_4242.json was refused (trace_inflated): it "
                                    "inflates past 128 MiB"), got["reason"]
    assert got["errors"] == {L.TRACE_REFUSED_INFLATED: 1}
    assert got["analysis"] == {}  # nothing half-read is kept as the rank's analysis
    assert got["events"][-1] == ["capture_failed", got["reason"]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gzip", "xz"])
def test_offline_analyze_refuses_a_bomb_in_one_line_with_bounded_memory(bombs: dict[str, Path],
                                                                         kind: str) -> None:
    path = bombs[kind]
    cli = "import sys; from perfd.app.cli import main; sys.exit(main(sys.argv[1:]))"
    code, out, err, peak = run_measured(cli, "analyze", "trace", str(path))
    print(f"FIGURES perfd analyze trace of a 1 GiB {kind} bomb peaked at {peak:.0f} MB")
    assert code != 0 and out == ""
    assert err.splitlines() == [f"perfd: cannot analyse {path}: refused (trace_inflated): it inflates past "
                                "128 MiB, the most a trace may hold "
                                "(perfd.core.limits.MAX_TRACE_INFLATED_BYTES)"]


@pytest.mark.slow
def test_a_hook_trace_bomb_fails_the_capture_with_its_reason_counted(tmp_path: Path) -> None:
    """The step hook's path (the hook writes the trace; the agent takes and reads it): refused, said
    for the rank, counted once, and the rank's good trace beside it kept (a partial capture)."""
    folder = tmp_path / "hook-traces"
    folder.mkdir(mode=0o700)
    big = bomb(tmp_path / "b.gz", "gzip", 256 * MIB)

    def write(rank: int, path: Path) -> None:
        if rank == 1:
            path.write_bytes(big.read_bytes())
        else:
            path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0,
                                                         "tid": 7, "ts": 0.0, "dur": 5.0}]}))
        path.chmod(0o600)

    hooks = StandInHooks(["accepted", "started", "stopped", "written"], folder, write=write)
    mgr = manager(tmp_path, hooks)
    m = run(mgr, (0, 1))
    assert m["status"] == "ok" and (m["reason"] or "").startswith(
        f"partial: rank 1: its trace rank1_{os.getpid()}.json was refused (trace_inflated)"), m["reason"]
    assert list(m["analysis"]) == ["0"]
    assert mgr.errors == {L.TRACE_REFUSED_INFLATED: 1}


def test_the_agent_reads_one_trace_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caps bound one read; the captures of a node's ranks run on threads of their own."""
    held: list[bool] = []

    def analyze(path: Path) -> object:
        held.append(bookkeeping._TRACE_READS.locked())
        raise TraceRefused(L.TRACE_REFUSED_VALUES, "a test's")

    monkeypatch.setattr(bookkeeping, "analyze_chrome_trace", analyze)
    counted: list[str] = []
    store = CaptureStore(tmp_path, 10**6)
    ctx = bookkeeping.RunContext(store, time.time, 0.1, threading.Event(), lambda *a: None,
                                 lambda reason, detail: counted.append(reason))
    m = store.new_capture("job1", (3,), "kineto")
    assert bookkeeping.record_trace(ctx, m, 3, tmp_path / "t.json") == bookkeeping.TraceMiss(
        bookkeeping.TraceMissKind.REFUSED,
        "rank 3: its trace t.json was refused (trace_json_values): a test's")
    assert held == [True] and counted == [L.TRACE_REFUSED_VALUES]


def test_the_agent_serves_the_trace_refusals_by_reason_from_zero(tmp_path: Path) -> None:
    agent = Agent(apply_overrides(load_config(None), node="n7", job="gpt", nvml="off", metrics_port=-1))
    agent.captures = AgentCaptures("gpt", str(tmp_path / "caps"), 10**7, lambda ev: None, kineto=False)
    agent.captures.manager.count_error(L.TRACE_REFUSED_VALUES, "a test")

    def rows() -> dict[str, float]:
        return {lab["reason"]: v for lab, name, v in agent.self_metric_rows()
                if name == "perfd_agent_collector_errors_total" and lab.get("collector") == "captures"}

    assert rows() == {**dict.fromkeys(L.TRACE_REFUSED_REASONS, 0.0), L.TRACE_REFUSED_VALUES: 1.0}


# ---- the reader, each format -------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(PACK))
@pytest.mark.parametrize("body", [b" " * (2 * MIB), b'"' + b"a" * (2 * MIB) + b'"'],
                         ids=["whitespace", "one_huge_string"])
def test_each_format_is_refused_past_its_budget_while_it_streams(tmp_path: Path, kind: str,
                                                                 body: bytes) -> None:
    path = tmp_path / "t"
    path.write_bytes(PACK[kind](HEAD + body + TAIL))
    with pytest.raises(TraceRefused) as exc:
        read_chrome_trace(path, CAPS)
    # A plain file is its own inflated bytes: refused by its size before a byte is read.
    want = L.TRACE_REFUSED_FILE if kind == "plain" else L.TRACE_REFUSED_INFLATED
    assert exc.value.reason == want and "1 MiB" in str(exc.value)


@pytest.mark.parametrize("kind", list(PACK))
def test_each_format_is_refused_past_its_json_values(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t"
    path.write_bytes(PACK[kind](HEAD + b",".join([b"{}"] * 20_000) + TAIL))  # 60 KB, 20,000 dicts
    with pytest.raises(TraceRefused, match="10,000, the most a trace may hold") as exc:
        read_chrome_trace(path, CAPS)
    assert exc.value.reason == L.TRACE_REFUSED_VALUES


@pytest.mark.parametrize("kind", ["gzip", "xz", "zstd"])
def test_a_compressed_file_past_its_size_cap_is_refused_unread(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t"
    path.write_bytes(PACK[kind](HEAD + json.dumps(os.urandom(100_000).hex()).encode() + TAIL))
    assert path.stat().st_size > CAPS.file_bytes
    with pytest.raises(TraceRefused, match="the most a compressed trace may be") as exc:
        read_chrome_trace(path, CAPS)
    assert exc.value.reason == L.TRACE_REFUSED_FILE


def test_a_file_that_grows_past_its_cap_while_it_is_read_is_refused(tmp_path: Path) -> None:
    """Its size is checked at the open, and what is read is counted again (the job may append)."""
    path = tmp_path / "t.json"
    path.write_bytes(b" " * 5000)
    with open(path, "rb", buffering=0) as fh:
        capped = trace_input._Capped(fh, 1000, "a test's")
        with pytest.raises(TraceRefused, match="grew past 1,000 bytes while it was read") as exc:
            capped.read(5000)
    assert exc.value.reason == L.TRACE_REFUSED_FILE


def test_text_that_decodes_wide_is_charged_its_width(tmp_path: Path) -> None:
    """One character past U+FFFF makes the whole text the parser reads 4 bytes a character."""
    text = HEAD + b'{"name": "' + b"a" * (400 << 10) + b'"}' + TAIL
    (tmp_path / "ascii.json").write_bytes(text)
    assert read_chrome_trace(tmp_path / "ascii.json", CAPS).kernels == []
    (tmp_path / "wide.json").write_bytes(text.replace(b"aaaa", "\U0001f600".encode(), 1))
    with pytest.raises(TraceRefused, match="decode to 4 bytes a character") as exc:
        read_chrome_trace(tmp_path / "wide.json", CAPS)
    assert exc.value.reason == L.TRACE_REFUSED_INFLATED


def test_a_json_escape_past_u00ff_is_charged_its_width(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """ASCII text whose ``\\uXXXX`` escape parses to a character past U+00FF: the string the parse
    builds around it is 2 or 4 bytes a character (a 90 MB string ending in a surrogate pair's escapes
    parsed to 360 MB); an escape split between two chunks counts; UTF-16 text is charged twice."""
    def read(name: str, body: bytes) -> object:
        (tmp_path / name).write_bytes(body)
        try:
            return read_chrome_trace(tmp_path / name, CAPS).kernels
        except TraceRefused as e:
            return e

    def text(n: int, end: bytes) -> bytes:
        return HEAD + b'{"name": "' + b"a" * n + end + b'"}' + TAIL

    assert read("latin1.json", text(900 << 10, b"\\u00e9")) == []  # a byte a character: not charged
    for width, end in ((4, b"\\ud83d\\ude00"), (4, b"\\uD83D\\uDE00"), (2, b"\\u0100"), (2, b"\\uFFFF")):
        got = read("wide.json", text(300 << 10 if width == 4 else 600 << 10, end))
        assert isinstance(got, TraceRefused) and got.reason == L.TRACE_REFUSED_INFLATED, (end, got)
        assert f"decode to {width} bytes a character" in str(got)
    monkeypatch.setattr(trace_input, "_CHUNK", 4096)
    for cut in range(1, 6):  # the escape's first `cut` bytes end a chunk
        body = text(300 << 10, b"")
        body = body[:4096 - cut] + b"\\ud83d\\ude00" + body[4096 - cut:]
        got = read("split.json", body)
        assert isinstance(got, TraceRefused) and "4 bytes a character" in str(got), (cut, got)
    # UTF-16: half as many characters as bytes, each parsed to 4 bytes at most (its escapes unseen).
    utf16 = json.dumps({"traceEvents": [], "pad": "a" * (200 << 10)}).encode("utf-16-le")
    assert read("utf16.json", utf16) == []
    got = read("utf16_wide.json", json.dumps({"traceEvents": [], "pad": "a" * (300 << 10) + "\U0001f600"},
                                             ensure_ascii=True).encode("utf-16-le"))
    assert isinstance(got, TraceRefused) and got.reason == L.TRACE_REFUSED_INFLATED, got


@pytest.mark.slow
def test_offline_analyze_refuses_a_small_gzip_whose_escape_widens_a_huge_string(tmp_path: Path) -> None:
    """The review's input: a 0.2 MB gzip of 3.99 M small objects and one 90 MB ASCII string ending in
    ``\\ud83d\\ude00`` (129.9 MB of text, 8.0 M values: inside both caps) peaked at 1.53 GB, exit 0."""
    path = tmp_path / "combo.json.gz"
    body = HEAD + b'{"a":1.5},' * 3_990_000 + b'{"name":"' + b"a" * 90_000_000 + b'\\ud83d\\ude00"}' + TAIL
    path.write_bytes(gzip.compress(body, 1))
    cli = "import sys; from perfd.app.cli import main; sys.exit(main(sys.argv[1:]))"
    code, out, err, peak = run_measured(cli, "analyze", "trace", str(path))
    assert code != 0 and out == "", (code, peak, err[-500:])
    print(f"FIGURES perfd analyze trace of the widening escape peaked at {peak:.0f} MB")
    assert err.splitlines() == [f"perfd: cannot analyse {path}: refused (trace_inflated): its 129,900,042 "
                                "bytes read decode to 4 bytes a character, past 128 MiB, the most a trace "
                                "may hold (perfd.core.limits.MAX_TRACE_INFLATED_BYTES)"]


# ---- the defaults ---------------------------------------------------------------------------------


def test_many_small_values_are_refused_at_the_default_cap_before_they_are_parsed(tmp_path: Path) -> None:
    """9 M empty dicts: 27 MB of JSON (smaller than real traces), ~650 MB of Python objects."""
    path = tmp_path / "dicts.json.gz"
    n = 9_000_000
    path.write_bytes(gzip.compress(HEAD + b"{}," * (n - 1) + b"{}" + TAIL, 1))
    with pytest.raises(TraceRefused, match="8,000,000, the most a trace may hold") as exc:
        read_chrome_trace(path)
    assert exc.value.reason == L.TRACE_REFUSED_VALUES


def test_deep_nesting_is_refused_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "deep.json.gz"
    path.write_bytes(gzip.compress(b"[" * 100_000 + b"]" * 100_000))
    with pytest.raises(TraceRefused, match="nested deeper than the parser recurses") as exc:
        read_chrome_trace(path)
    assert exc.value.reason == L.TRACE_REFUSED_DEPTH


def _returns(fn: Callable[[], object]) -> object:
    """``fn()`` on a thread: what it returned or raised, or a failure when it hangs (a FIFO opened
    for reading waits for a writer)."""
    got: list[object] = []

    def call() -> None:
        try:
            got.append(fn())
        except Exception as exc:
            got.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        pytest.fail(f"{fn} hung")
    return got[0]


def test_what_is_not_a_regular_file_is_refused_never_waited_on_or_read_forever(tmp_path: Path) -> None:
    fifo, zero = tmp_path / "rank0_1.json", tmp_path / "rank1_1.json"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")  # a plain "trace" that never ends
    try:
        for path in (fifo, zero):
            got = _returns(functools.partial(read_chrome_trace, path))
            assert isinstance(got, TraceRefused) and got.reason == L.TRACE_REFUSED_FILE, got
            assert "not a regular file" in str(got)
            assert _returns(functools.partial(trace_complete, path)) is False
    finally:  # a reader stuck on the FIFO (a broken build) is let go: a writer opens it and leaves
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_the_largest_recorded_traces_stay_well_inside_the_caps() -> None:
    for path in LARGEST:
        text = read_trace_bytes(path)
        assert len(text) * 3 < L.MAX_TRACE_INFLATED_BYTES, path
        assert (text.count(b",") + text.count(b"{") + text.count(b"[")) * 3 < L.MAX_TRACE_JSON_VALUES, path
        assert path.stat().st_size * 10 < L.MAX_TRACE_FILE_BYTES, path
