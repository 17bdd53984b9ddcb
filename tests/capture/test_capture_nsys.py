"""nsys SQLite exports: a database with the real schema subset, checked against plain SQL sums."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from perfd.capture import binaries
from perfd.capture.analysis import TraceEmpty
from perfd.capture.binaries import NsysNotFoundError, find_nsys
from perfd.capture.nsys_sqlite import (
    NsysExportError,
    analyze_nsys,
    direct_sql_check,
    export_sqlite,
    read_nsys_sqlite,
)

# Column subsets of `nsys export --type sqlite` (same table and column names).
SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER, blockX INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL,
    bytes INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER,
    color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
"""

HOST = 1 << 56  # nsys puts a host id above the pid bits


def gpid(pid: int, tid: int = 0) -> int:
    return HOST | (pid << 24) | tid


class Db:
    def __init__(self, path: Path, schema: str = SCHEMA) -> None:
        self.con = sqlite3.connect(path)
        self.con.executescript(schema)
        self.strings: dict[str, int] = {}

    def sid(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[s], s))
        return self.strings[s]

    def kernel(self, dev: int, stream: int, start: int, end: int, name: str, pid: int = 100) -> None:
        self.con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
                         "globalPid, demangledName, shortName) VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
                         (start, end, dev, stream, gpid(pid), self.sid(name + "(args)"), self.sid(name)))

    def close(self) -> None:
        self.con.commit()
        self.con.close()


def build_capture(path: Path, seed: int = 3) -> None:
    """Device 0: one stream (kernels never overlap). Device 1: three streams, overlapping."""
    rng = random.Random(seed)
    db = Db(path)
    t = 1_000_000_000
    for i in range(400):
        t += rng.randint(0, 20_000)
        dur = rng.randint(1_000, 300_000)
        name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if i % 7 == 0 else rng.choice(["gemm", "softmax"])
        db.kernel(0, 7, t, t + dur, name, pid=100)
        t += dur
    for stream in (7, 20, 21):
        t = 1_000_000_000
        for _ in range(200):
            t += rng.randint(0, 50_000)
            dur = rng.randint(1_000, 200_000)
            name = {7: "gemm", 20: "ncclDevKernel_SendRecv", 21: "ncclDevKernel_AllGather_RING_LL"}[stream]
            db.kernel(1, stream, t, t + dur, name, pid=200)
            t += dur
    db.con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 1, 7, 0, ?, 4096, 1)",
                       [(1_000_000_000 - 5_000, 1_000_000_000 - 1_000, 0, gpid(100)),
                        (1_000_050_000, 1_000_060_000, 1, gpid(200))])
    db.con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET "
                   "VALUES (1000055000, 1000065000, 1, 1, 7, 0, ?, 0, 64)", (gpid(200),))
    nvtx = [
        (1_000_000_000, 1_010_000_000, 59, "forward", None, gpid(100, 5)),
        (1_010_000_000, 1_030_000_000, 59, None, db.sid("backward"), gpid(100, 5)),
        (1_000_000_000, 1_002_000_000, 59, "forward", None, gpid(200, 9)),
        (1_000_500_000, None, 34, "a mark", None, gpid(100, 5)),  # marks have no end
    ]
    db.con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, globalTid) "
                       "VALUES (?, ?, ?, ?, ?, ?)", nvtx)
    db.close()


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    p = tmp_path / "cap.sqlite"
    build_capture(p)
    return p


def plain_sql(path: Path, sql: str) -> list[tuple[int, ...]]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_single_stream_device_matches_a_direct_sql_sum(capture: Path) -> None:
    a = analyze_nsys(capture)
    d0 = a.device(0)
    [(busy_ns,)] = plain_sql(capture, "SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                      "WHERE deviceId = 0")
    [(nccl_ns,)] = plain_sql(capture, "SELECT SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                      "JOIN StringIds s ON s.id = k.shortName "
                                      "WHERE k.deviceId = 0 AND s.value LIKE '%nccl%'")
    [(last,)] = plain_sql(capture, "SELECT MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0")
    assert d0.kernel_ms == pytest.approx(busy_ns / 1e6, rel=1e-12)
    assert d0.busy_ms >= d0.kernel_ms  # busy also counts the device's copies and sets
    assert d0.comm_ms == pytest.approx(nccl_ns / 1e6, rel=1e-12)
    assert d0.compute_ms == pytest.approx((busy_ns - nccl_ns) / 1e6, rel=1e-12)
    # One stream: nothing overlaps the NCCL kernels, all of their time is exposed.
    assert d0.comm_exposed_ms == pytest.approx(d0.comm_ms) and d0.overlap_ratio == pytest.approx(0.0)
    # The span starts at the memcpy that ran before the first kernel.
    assert d0.span_ms == pytest.approx((last - (1_000_000_000 - 5_000)) / 1e6)
    assert d0.idle_ms == pytest.approx(d0.span_ms - d0.busy_ms)
    assert d0.memcpy_ms == pytest.approx(0.004)
    assert d0.sendrecv_ms == 0


def test_analysis_matches_direct_sql_check(capture: Path) -> None:
    a = analyze_nsys(capture)
    check = direct_sql_check(capture)["devices"]
    assert isinstance(check, dict)
    for d in a.devices:
        c = check[d.device]
        assert d.busy_ms == pytest.approx(c["busy_union_ms"], rel=1e-9)  # kernels, copies and sets
        assert d.kernel_ms == pytest.approx(c["kernel_union_ms"], rel=1e-9)
        assert d.comm_ms == pytest.approx(c["nccl_union_ms"], rel=1e-9)
        assert d.kernel_count == c["kernel_count"]
    c0 = check[0]
    assert c0["kernel_union_ms"] == pytest.approx(c0["kernel_sum_ms"])  # single stream: union == sum
    assert list(c0["streams"]) == [7]
    c1 = check[1]
    assert sorted(c1["streams"]) == [7, 20, 21]
    assert c1["kernel_union_ms"] < c1["kernel_sum_ms"]  # streams overlap on device 1
    d1 = a.device(1)
    assert 0 < d1.comm_exposed_ms < d1.comm_ms
    assert d1.overlap_ratio is not None and 0 < d1.overlap_ratio < 1
    # SendRecv is one stream: its union is its sum.
    assert d1.sendrecv_ms == pytest.approx(c1["streams"][20]["kernel_sum_ms"])
    assert d1.memcpy_ms == pytest.approx(0.015)  # memcpy [50, 60) µs ∪ memset [55, 65) µs


def test_names_nvtx_and_pids(capture: Path) -> None:
    data = read_nsys_sqlite(capture)
    assert {k.name for k in data.kernels} >= {"gemm", "ncclDevKernel_SendRecv"}
    assert {k.pid for k in data.kernels} == {100, 200}
    assert sorted((r.name, r.pid or 0) for r in data.nvtx) == [
        ("backward", 100), ("forward", 100), ("forward", 200)]
    a = analyze_nsys(capture)
    assert {n.name: n.total_ms for n in a.device(0).nvtx} == {"forward": 10.0, "backward": 20.0}
    assert {n.name: n.total_ms for n in a.device(1).nvtx} == {"forward": 2.0}
    top = a.device(1).top_kernels
    assert {t.name for t in top} == {"gemm", "ncclDevKernel_SendRecv", "ncclDevKernel_AllGather_RING_LL"}
    json.dumps(a.to_json())  # plain JSON


def test_missing_tables(tmp_path: Path) -> None:
    p = tmp_path / "kernels_only.sqlite"
    db = Db(p, "\n".join(s + ";" for s in SCHEMA.split(";")[:2]))
    db.kernel(0, 7, 0, 1_000_000, "gemm")
    db.kernel(0, 7, 2_000_000, 3_000_000, "ncclDevKernel_AllReduce")
    db.close()
    a = analyze_nsys(p)
    d = a.device(0)
    assert (d.busy_ms, d.comm_ms, d.memcpy_ms, d.nvtx) == (2.0, 1.0, 0.0, ())
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    # no table at all: nothing to analyse, refused (as an empty Kineto window is); the SQL check says none
    with pytest.raises(TraceEmpty, match="recorded nothing"):
        analyze_nsys(empty)
    assert direct_sql_check(empty) == {"devices": {}}


def test_no_string_table(tmp_path: Path) -> None:
    p = tmp_path / "nostrings.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
                "shortName INTEGER)")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 10, 0, 42)")
    con.commit()
    con.close()
    [k] = read_nsys_sqlite(p).kernels
    assert (k.name, k.stream, k.pid) == ("42", None, None)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_nsys_sqlite(tmp_path / "nope.sqlite")


# --- nsys export ------------------------------------------------------------------------------
def fake_nsys(tmp_path: Path, source: Path, exit_code: int = 0) -> Path:
    """A stand-in nsys that records its argv and 'exports' by copying a prepared database."""
    script = tmp_path / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, shutil, sys\n"
        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"if {exit_code}: sys.stderr.write('boom'); sys.exit({exit_code})\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n"
        f"shutil.copy({str(source)!r}, out)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_report_is_exported_with_an_argument_list(tmp_path: Path, capture: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_nsys(tmp_path, capture)
    monkeypatch.setenv("PERFD_NSYS", str(exe))
    rep = tmp_path / "run 1.nsys-rep"  # a space: proves no shell is involved
    rep.write_bytes(b"report")
    a = analyze_nsys(rep)
    argv = json.loads((tmp_path / "argv.json").read_text())
    out = tmp_path / "run 1.sqlite"
    assert argv == ["export", "--type", "sqlite", "--force-overwrite=true", "-o", str(out), str(rep)]
    assert a.source == str(rep) and a.device(0).busy_ms > 0
    # An up-to-date export is reused, not exported again.
    (tmp_path / "argv.json").unlink()
    analyze_nsys(rep)
    assert not (tmp_path / "argv.json").exists()


def test_export_failure_and_missing_nsys(tmp_path: Path, capture: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_nsys(tmp_path, capture, exit_code=3)
    with pytest.raises(NsysExportError, match="exited 3: boom"):
        export_sqlite(tmp_path / "x.nsys-rep", nsys=str(exe))
    monkeypatch.setenv("PERFD_NSYS", str(tmp_path / "missing"))
    with pytest.raises(NsysNotFoundError, match="PERFD_NSYS"):
        find_nsys()
    monkeypatch.delenv("PERFD_NSYS")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(binaries, "NSYS_FALLBACK", str(tmp_path / "none" / "nsys"))
    with pytest.raises(NsysNotFoundError, match="nsys not found"):
        find_nsys()
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert find_nsys() == str(exe)
