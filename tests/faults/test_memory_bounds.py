"""What one client can make a long-lived aggregator hold in memory (issue 36 items 3 and 4): a real
``perfd aggregator`` process, real gRPC agents (the transport's own AgentClient) and real HTTP
clients on loopback. Each figure printed (``FIGURES``) is recorded in docs/reliability.md.

- ``--retain-mib`` counts a step record's raw key/value fields: 1,500 records with a 100 KB field
  each, under a 16 MiB cap, evict by bytes and leave the RSS near where it was once the aggregator
  has given the evicted records' memory back (before: 0 evicted, RSS +197 MB in the issue's probe);
- large events are cut to their kept size with the excess counted, the event log is bounded by
  bytes, ``/api/events`` answers in pages, and clients that never read an answer hold at most the
  server's output bound.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.retention import TRIM_EVERY_S
from perfd.model import StepRecord
from tests.faults.streams import send_batches
from tests.procs import NOT_YET, Procs, WaitTimeout, get_json, http_get, run_env, start_aggregator, wait_for

pytestmark = pytest.mark.slow


def rss_mb(pid: int) -> float:
    """The process's resident set (VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def aggregator_pid(procs: Procs) -> int:
    return next(p.pid for name, _role, p in procs.procs if name == "aggregator")



@pytest.mark.e2e  # the aggregator's own resident memory: a process of its own
def test_retain_mib_counts_the_raw_fields_of_step_records(tmp_path: Path) -> None:
    n, per_batch, field_kb = 1500, 50, 100
    with Procs(tmp_path, run_env()) as procs:
        grpc, _http, base = start_aggregator(procs, "--retain-mib", "16", "--no-rules")
        pid = aggregator_pid(procs)
        before = rss_mb(pid)
        t0 = time.time()
        big = "v" * (field_kb * 1000)
        batches = [{"steps": [StepRecord(job="fat", iteration=i, rank="last", end_time=t0 + i * 0.1,
                                         step_time_ms=100.0, fields={"note": big + str(i)})
                              for i in range(k, k + per_batch)]}
                   for k in range(1, n + 1, per_batch)]
        asyncio.run(send_batches(f"127.0.0.1:{grpc}", "fat-agent", batches, ["fat"]))
        wait_for(lambda: get_json(base + "/api/stats")["step_records_ingested"] >= n, 30,
                 "every record ingested", ignore=NOT_YET)
        peak = rss_mb(pid)
        # The byte evictions free ~130 MB inside the allocator's arenas; the housekeeping gives it back
        # (memory.trim) at most every TRIM_EVERY_S, so a trim during the ingest is followed by one after
        # the last evictions. The RSS is awaited back near where it was, the last reading in the failure.
        readings: list[float] = []

        def trimmed() -> dict[str, Any] | None:
            s = get_json(base + "/api/stats")
            readings.append(rss_mb(pid))
            return s if s["transport"]["memory_trims"] >= 1 and readings[-1] - before < 60 else None

        try:
            st = wait_for(trimmed, 3 * TRIM_EVERY_S, "the aggregator's RSS back within 60 MB after its trim",
                          ignore=NOT_YET)
        except WaitTimeout as e:
            pytest.fail(f"{e}: RSS {before:.0f} MB before, last read {readings[-3:]} MB")
        after = readings[-1]
        in_use_mb = st["process"]["malloc_in_use_bytes"] / 1e6
        held = get_json(base + "/api/jobs")["jobs"][0]["iterations_seen"]
        print(f"FIGURES retain-mib: {n} records with a {field_kb} KB field under --retain-mib 16: "
              f"{st['iterations_evicted_retention_bytes']} evicted for bytes, {held} held; "
              f"aggregator RSS {before:.0f} -> {peak:.0f} MB when ingested -> {after:.0f} MB after the trim; "
              f"C allocator in use {in_use_mb:.0f} MB")
        # 16 MiB holds ~160 such records: the rest left by bytes.
        assert st["iterations_evicted_retention_bytes"] >= n - 200
        assert held <= 170
        # What the records hold: the 16 MiB cap and the aggregator's own ~11 MB (150 MB were sent).
        assert in_use_mb < 50, f"the C allocator holds {in_use_mb:.0f} MB in use"


def _raw_get(port: int, path: str) -> socket.socket:
    """A client that sends its request and then never reads the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


@pytest.mark.e2e  # the aggregator's own resident memory: a process of its own
def test_large_events_are_cut_the_log_is_paged_and_slow_readers_hold_little(tmp_path: Path) -> None:
    n, size_kb, per_batch = 2400, 250, 50
    with Procs(tmp_path, run_env()) as procs:
        grpc, http, base = start_aggregator(procs, "--no-rules", "--rules-interval", "0.5",
                                            "--state-dir", str(tmp_path / "state"))
        pid = aggregator_pid(procs)
        state_before = sum(f.stat().st_size for f in (tmp_path / "state").iterdir())
        blob = "z" * (size_kb * 1000 - 200)
        batches = [{"events": [{"kind": "xid", "severity": "warning", "job": "big", "time": time.time(),
                                "text": f"event {k + i}", "payload": {"blob": blob}}
                               for i in range(per_batch)]} for k in range(0, n, per_batch)]
        asyncio.run(send_batches(f"127.0.0.1:{grpc}", "noisy", batches, ["big"]))
        stats = wait_for(lambda: (s := get_json(base + "/api/stats"))["events_ingested"] >= n and s, 60,
                         "every event ingested", ignore=NOT_YET)
        time.sleep(1.5)  # a rules tick or two: the events document written
        state_after = sum(f.stat().st_size for f in (tmp_path / "state").iterdir())
        page = http_get(base + "/api/events")
        first = json.loads(page)
        # Paging from the start walks every event held, each once, in order.
        seen: list[int] = []
        cursor, pages = 0, 0
        while True:
            got = get_json(f"{base}/api/events?cursor={cursor}&limit=1000")
            seen += [e["seq"] for e in got["events"]]
            pages += 1
            cursor = got["next_cursor"]
            if not got["more"]:
                break
        log_stats = stats["event_log"]
        t = stats["transport"]
        before = rss_mb(pid)
        slow = [_raw_get(http, "/api/events?limit=1000") for _ in range(30)]
        time.sleep(2.0)  # the answers are built and wait on their sockets
        during = rss_mb(pid)
        probe = get_json(base + "/api/stats")  # the server still answers meanwhile
        for s in slow:
            s.close()
        print(f"FIGURES large events: {n} events of {size_kb} KB: state dir {state_before / 1e6:.1f} -> "
              f"{state_after / 1e6:.1f} MB; {t['refused_event_cut']} cut "
              f"({t['event_bytes_cut'] / 1e6:.0f} MB cut before the journal); event log "
              f"{log_stats['held']} events, {log_stats['bytes'] / 1e6:.1f} MB; "
              f"GET /api/events {len(page) / 1e3:.0f} KB ({len(first['events'])} events); "
              f"{len(seen)} events in {pages} pages from cursor 0; 30 clients not reading "
              f"/api/events?limit=1000: RSS {before:.0f} -> {during:.0f} MB")
        assert t["refused_event_cut"] == n
        assert state_after - state_before < 50e6  # before: +390 MB for these events
        assert log_stats["bytes"] <= 16 << 20
        assert len(page) < 1.5e6  # before: 50 MB
        assert seen == sorted(set(seen)) and len(seen) == log_stats["held"]
        assert during - before < 150, f"RSS grew {during - before:.0f} MB with 30 clients not reading"
        assert probe["events_ingested"] >= n
