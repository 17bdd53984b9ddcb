"""`perfd bench memory`: what a real aggregator process's memory does under the floods the fault and
security tests send — its RSS and the C allocator's bytes in use, read from outside.

    perfd bench memory [--scenario retain,slow-readers,hang-events,series-flood,job-flood] [--json]

Each scenario starts its own ``perfd aggregator`` (loopback, a temp state dir) and drives it with
real gRPC agents (the transport's AgentClient) from this process:

- ``retain``: 1,500 step records with a 100 KB field each under ``--retain-mib 16``: the RSS before,
  once ingested, and after the housekeeping has given the evicted records' memory back (a trim after
  the last evictions); the allocator's bytes in use then. The tests assert the evictions by bytes.
- ``slow-readers``: 2,400 events of 250 KB (cut at the edge), then 30 HTTP clients that ask for
  ``/api/events?limit=1000`` and never read: the RSS before and while they wait.
- ``hang-events``: 1,000 ``nccl_hang`` events of 200 KB for one job (kept whole, bounded in bytes per
  job): the RSS and the bytes in use before and after.
- ``series-flood``: the series cap (1,000) full, then two rounds of 2 × 50,000 refused series, the
  streams closed: the RSS after each round and the second round's cost per refused series (the first
  pays a fixed cost: the allocator's arenas, gRPC's buffers).
- ``job-flood``: 50,000 job names from one client (past its quota every name is refused): the RSS
  growth and one ``/metrics`` scrape's size and time.
- ``trace-bomb``: no aggregator. A 1 GiB trace of JSON whitespace as gzip members and as xz streams
  (each a few MB), read by ``perfd analyze trace`` and by the trace reader the agent's captures use
  (``read_chrome_trace``), each in a process of its own: that process's peak RSS (wait4's rusage of it
  alone) and how the read ended (refused at the inflation cap).

These are the machine's figures (glibc's arenas, the kernel's accounting, the load beside the run),
printed, never asserted; the tests assert what perfd holds (counts, bytes by its own accounting).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import lzma
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.soak_bench import Aggregator, rss_bytes, stats  # noqa: E402
from perfd.aggregator.retention import TRIM_EVERY_S  # noqa: E402
from perfd.core import limits as L  # noqa: E402
from perfd.core.model import Sample, StepRecord  # noqa: E402
from perfd.transport.client import AgentClient  # noqa: E402

SCENARIOS = ("retain", "slow-readers", "hang-events", "series-flood", "job-flood", "trace-bomb")
BOMB_HEAD, BOMB_TAIL, MIB = b'{"traceEvents": [', b"]}", 1 << 20


def _mb(n: float | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def _wait(ok: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, KeyError):
            if got := ok():
                return got
        time.sleep(0.2)
    raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")


async def _send(target: str, agent: str, batches: list[dict[str, Any]], jobs: list[str]) -> None:
    """One agent: Hello naming ``jobs``, the batches (submit's keyword arguments), all acknowledged."""
    c = AgentClient(target, agent, jobs=jobs)
    task = asyncio.create_task(c.run())
    try:
        for b in batches:
            c.submit(**b)
            if c.spool.pending_count() >= 8 and not await c.flush(60):
                raise RuntimeError("batches not acknowledged")
        if not await c.flush(120):
            raise RuntimeError("batches not acknowledged")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        c.table.clear()  # this process's own definitions: not the aggregator's


def _in_use(port: int) -> int | None:
    v = stats(port)["process"].get("malloc_in_use_bytes")
    return None if v is None else int(v)


def retain(agg: Aggregator) -> dict[str, Any]:
    n, per_batch, field_kb = 1500, 50, 100
    pid = _pid(agg)
    before = rss_bytes(pid)
    t0 = time.time()
    big = "v" * (field_kb * 1000)
    batches = [{"steps": [StepRecord(job="fat", iteration=i, rank="last", end_time=t0 + i * 0.1,
                                     step_time_ms=100.0, fields={"note": big + str(i)})
                          for i in range(k, k + per_batch)]} for k in range(1, n + 1, per_batch)]
    asyncio.run(_send(f"127.0.0.1:{agg.grpc_port}", "fat-agent", batches, ["fat"]))
    _wait(lambda: stats(agg.http_port)["step_records_ingested"] >= n, 60, "every record ingested")
    peak = rss_bytes(pid)
    trims = _wait(lambda: stats(agg.http_port)["transport"]["memory_trims"] or None, 3 * TRIM_EVERY_S,
                  "a trim")
    time.sleep(TRIM_EVERY_S + 1)  # a trim after the last evictions, where the first came during them
    st = stats(agg.http_port)
    return {"records": n, "field_kb": field_kb, "retain_mib": 16,
            "evicted_for_bytes": st["iterations_evicted_retention_bytes"], "rss_mb_before": _mb(before),
            "rss_mb_ingested": _mb(peak), "rss_mb_after_trim": _mb(rss_bytes(pid)),
            "trims": st["transport"]["memory_trims"], "trims_at_first_look": trims,
            "malloc_in_use_mb": _mb(st["process"].get("malloc_in_use_bytes"))}


def slow_readers(agg: Aggregator) -> dict[str, Any]:
    n, size_kb, per_batch, clients = 2400, 250, 50, 30
    pid = _pid(agg)
    blob = "z" * (size_kb * 1000 - 200)
    batches = [{"events": [{"kind": "xid", "severity": "warning", "job": "big", "time": time.time(),
                            "text": f"event {k + i}", "payload": {"blob": blob}} for i in range(per_batch)]}
               for k in range(0, n, per_batch)]
    asyncio.run(_send(f"127.0.0.1:{agg.grpc_port}", "noisy", batches, ["big"]))
    _wait(lambda: stats(agg.http_port)["events_ingested"] >= n, 60, "every event ingested")
    before = rss_bytes(pid)
    socks = []
    for _ in range(clients):
        s = socket.create_connection(("127.0.0.1", agg.http_port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /api/events?limit=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    time.sleep(2.0)  # the answers are built and wait on their sockets
    during = rss_bytes(pid)
    for s in socks:
        s.close()
    return {"events": n, "event_kb": size_kb, "clients_not_reading": clients, "rss_mb_before": _mb(before),
            "rss_mb_during": _mb(during), "rss_mb_growth": _mb(during - before)}


def hang_events(agg: Aggregator) -> dict[str, Any]:
    n, size_kb, per_batch = 1000, 200, 40
    pid = _pid(agg)
    before, in_use_before = rss_bytes(pid), _in_use(agg.http_port)
    blob = "h" * (size_kb * 1000 - 300)
    batches = [{"events": [{"kind": "nccl_hang", "severity": "critical", "job": "hung", "time": time.time(),
                            "text": f"hang {k + i}", "payload": {"ranks_not_joined": [1], "blob": blob}}
                           for i in range(per_batch)]} for k in range(0, n, per_batch)]
    asyncio.run(_send(f"127.0.0.1:{agg.grpc_port}", "hang-agent", batches, ["hung"]))
    st = _wait(lambda: (s := stats(agg.http_port))["events_ingested"] >= n and s, 60, "every event ingested")
    after, in_use_after = rss_bytes(pid), _in_use(agg.http_port)
    grew = None if in_use_before is None or in_use_after is None else in_use_after - in_use_before
    return {"events": n, "event_kb": size_kb, "held": st["collectives"]["hang_events_held"],
            "rss_mb_before": _mb(before), "rss_mb_after": _mb(after), "rss_mb_growth": _mb(after - before),
            "malloc_in_use_mb_growth": _mb(grew)}


def _samples(agent: str, n: int, t: float) -> list[Sample]:
    return [Sample("perfd_gpu_power_watts", float(i), t, {"node": agent, "gpu": str(i % 8),
                                                           "uuid": f"GPU-{agent}-{i:08d}"}) for i in range(n)]


def series_flood(agg: Aggregator, agents: int = 2) -> dict[str, Any]:
    pid, target = _pid(agg), f"127.0.0.1:{agg.grpc_port}"

    async def flood(names: list[str], n: int) -> None:
        for a in names:
            await _send(target, a, [{"samples": _samples(a, n, time.time())}], [])

    asyncio.run(flood(["held"], 1_000))
    rss = [rss_bytes(pid)]
    for r in range(2):
        asyncio.run(flood([f"round{r}-{k}" for k in range(agents)], L.MAX_SERIES_PER_AGENT))
        time.sleep(1.0)
        rss.append(rss_bytes(pid))
    per_round = agents * L.MAX_SERIES_PER_AGENT
    return {"series_cap": 1000, "refused_per_round": per_round, "rss_mb": [_mb(x) for x in rss],
            "first_round_mb": _mb(rss[1] - rss[0]),
            "kb_per_refused_series_second_round": round((rss[2] - rss[1]) / 1024 / per_round, 4)}


def job_flood(agg: Aggregator, n_jobs: int = 50_000) -> dict[str, Any]:
    pid = _pid(agg)
    before = rss_bytes(pid)
    batches = [{"steps": [StepRecord(job=f"job-{j:06d}", iteration=1, step_time_ms=1.0)
                          for j in range(i, i + 1000)]} for i in range(0, n_jobs, 1000)]
    asyncio.run(_send(f"127.0.0.1:{agg.grpc_port}", "flooder", batches, []))
    after = rss_bytes(pid)
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{agg.http_port}/metrics", timeout=60) as r:
        body = r.read()
    scrape_s = time.monotonic() - t0
    held = len(json.loads(urllib.request.urlopen(f"http://127.0.0.1:{agg.http_port}/api/jobs",
                                                 timeout=60).read())["jobs"])
    return {"job_names_sent": n_jobs, "jobs_held": held, "rss_mb_before": _mb(before),
            "rss_mb_growth": _mb(after - before), "metrics_bytes": len(body), "scrape_s": round(scrape_s, 3)}


def _bomb(path: Path, kind: str, total: int = 1 << 30) -> Path:
    """``{"traceEvents": [`` ``total`` bytes of whitespace ``]}``, in 16 MiB members compressed once."""
    pack: Callable[[bytes], bytes] = ((lambda b: gzip.compress(b, 6)) if kind == "gzip"
                                      else (lambda b: lzma.compress(b, preset=1)))
    pad = b" " * (16 * MIB)
    one = pack(pad)
    with path.open("wb") as f:
        f.write(pack(BOMB_HEAD))
        for _ in range(total // len(pad)):
            f.write(one)
        f.write(pack(BOMB_TAIL))
    return path


# Run in the measured process itself and read at its exit: its own peak (VmHWM), not the moments
# between fork and exec when the child is still a copy of this process.
MEASURED = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    print(f"PEAK_KB {kb}", file=sys.stderr, flush=True)
atexit.register(_peak)
code, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
exec(compile(code, "<measured>", "exec"), {"__name__": "__main__"})
"""
ANALYZE = "import sys; from perfd.app.cli import main; sys.exit(main(sys.argv[1:]))"
READER = """
import sys
from perfd.capture.chrome_trace import read_chrome_trace
from perfd.capture.trace_input import TraceRefused
try:
    read_chrome_trace(sys.argv[1])
except TraceRefused as e:
    print(f"refused: {e}")
    sys.exit(1)
"""


def _peak_of(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` with ``args`` in a Python process of its own: its exit status, its last line of
    output and its peak RSS."""
    p = subprocess.run([sys.executable, "-c", MEASURED, code, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    err = p.stderr.splitlines()
    peak = next((int(x.split()[1]) for x in reversed(err) if x.startswith("PEAK_KB ")), None)
    said = [x for x in (p.stdout.splitlines() + err) if not x.startswith("PEAK_KB ")]
    return {"exit": p.returncode, "said": (said or [""])[-1][:160],
            "peak_rss_mb": None if peak is None else round(peak / 1024, 1)}


def trace_bomb(d: Path) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for kind in ("gzip", "xz"):
        path = _bomb(d / f"bomb.json.{kind}", kind)
        got[kind] = {"file_mb": _mb(path.stat().st_size), "inflates_to_mb": 1024,
                     "analyze_trace": _peak_of(ANALYZE, "analyze", "trace", str(path)),
                     "reader": _peak_of(READER, str(path))}
        path.unlink()
    # A 0.2 MB gzip of 3.99 M small objects and one 90 MB ASCII string ending in an escape that widens it
    # (129.9 MB of text, inside both caps; a build once took 1.53 GB reading it).
    combo = d / "combo.json.gz"
    combo.write_bytes(gzip.compress(BOMB_HEAD + b'{"a":1.5},' * 3_990_000 + b'{"name":"' + b"a" * 90_000_000
                                    + b'\\ud83d\\ude00"}' + BOMB_TAIL, 1))
    got["widening_escape"] = {"file_mb": _mb(combo.stat().st_size),
                              "analyze_trace": _peak_of(ANALYZE, "analyze", "trace", str(combo))}
    combo.unlink()
    return got


def _pid(agg: Aggregator) -> int:
    assert agg.proc is not None
    return agg.proc.pid


RUNS: dict[str, tuple[Callable[[Aggregator], dict[str, Any]], list[str]]] = {
    "retain": (retain, ["--retain-mib", "16"]),
    "slow-readers": (slow_readers, ["--rules-interval", "0.5", "--state-dir", "{state}"]),
    "hang-events": (hang_events, ["--rules-interval", "0.5", "--state-max-mib", "32",
                                  "--state-dir", "{state}"]),
    "series-flood": (series_flood, ["--max-series", "1000"]),
    "job-flood": (job_flood, []),
}


def run(name: str, out: Path) -> dict[str, Any]:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    if name == "trace-bomb":
        return trace_bomb(d)
    fn, args = RUNS[name]
    agg = Aggregator(d, ["--no-rules", *(a.replace("{state}", str(d / "state")) for a in args)])
    agg.start()
    try:
        return fn(agg)
    finally:
        agg.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="perfd bench memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=",".join(SCENARIOS),
                    help="comma-separated, of: " + ", ".join(SCENARIOS) + " (default: all)")
    ap.add_argument("--out", help="folder for the aggregators' state and output (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    chosen = [s.strip() for s in a.scenario.split(",") if s.strip()]
    if not chosen or any(s not in SCENARIOS for s in chosen):
        ap.error(f"--scenario: of {', '.join(SCENARIOS)}")
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="perfd-memory-"))
    results: dict[str, Any] = {}
    for s in chosen:
        results[s] = run(s, out)
        if not a.json:
            print(f"{s}: " + ", ".join(f"{k} {v}" for k, v in results[s].items()), flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
