"""Step boundaries finer than the log's stamps: `perfd launch` notes when each line arrived
(perfd.core.linetimes), LogTail reports each line's newline offset, and the Megatron collector takes an
iteration's end time from there."""

from __future__ import annotations

import io
import itertools
import sys
import textwrap
import time
from pathlib import Path

from perfd.app.launcher import LaunchOptions, run_launch
from perfd.collectors.megatron.collector import MegatronCollector
from perfd.collectors.megatron.tail import LogTail
from perfd.core.linetimes import LineTimes, format_record, sidecar_path
from perfd.core.manifest import load_manifest

PY = sys.executable


def test_line_times_reader(tmp_path: Path) -> None:
    p = tmp_path / "out.log.times"
    lt = LineTimes(p)
    assert lt.time_for(0) is None  # no sidecar yet: unknown, not zero
    p.write_bytes(format_record(10, 1_000_000_000) + format_record(25, 2_000_000_000) + b"40 3000")
    assert lt.time_for(0) == 1.0 and lt.time_for(9) == 1.0  # newline at 9: arrived with the first read
    assert lt.time_for(10) == 2.0 and lt.time_for(24) == 2.0
    assert lt.time_for(30) is None  # the record for it is torn (no newline yet): not read
    with p.open("ab") as fh:
        fh.write(b"000000\nnot a record\n")
    assert lt.time_for(30) == 3.0 and lt.errors == {"malformed_record": 1}
    assert lt.time_for(None) is None


def test_line_times_prune_and_restart(tmp_path: Path) -> None:
    p = tmp_path / "x.times"
    p.write_bytes(b"".join(format_record(10 * (i + 1), i * 10**9) for i in range(10)))
    lt = LineTimes(p, max_records=4)
    assert lt.time_for(95) == 9.0
    assert lt.time_for(5) is None  # its record was pruned: unknown rather than a wrong time
    with p.open("ab") as fh:
        fh.write(format_record(7, 50 * 10**9))  # a new log written over: offsets start again
    assert lt.time_for(200) is None and lt.errors == {"offset_went_back": 1}
    assert lt.time_for(3) == 50.0


def test_tail_reports_newline_offsets(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"ab\ncdef\npart")
    t = LogTail(f)
    assert t.read_lines_at() == [("ab", 2), ("cdef", 7)]
    with f.open("ab") as fh:
        fh.write(b"ial\n\nz\n")
    assert t.read_lines_at() == [("partial", 15), ("", 16), ("z", 18)]
    data = f.read_bytes()
    assert [data[i] for i in (2, 7, 15, 16, 18)] == [ord("\n")] * 5


def test_launch_writes_line_times_and_the_collector_uses_them(tmp_path: Path) -> None:
    # Five iteration lines printed within about a second: the log stamps them all to the same
    # second (or two), the sidecar to when each was printed.
    code = textwrap.dedent("""
        import time
        for i in range(1, 6):
            t = time.time_ns()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t / 1e9))
            print(f"[{stamp}] iteration {i}/ 5 | consumed samples: {i * 8} | printed ns: {t} |"
                  f" elapsed time per iteration (ms): 100.0 | lm loss: 1.0E+01 |")
            print("noise line without a step")
            time.sleep(0.1)
        """)
    run = tmp_path / "run"
    term, err = io.BytesIO(), io.StringIO()
    opts = LaunchOptions(command=[PY, "-c", code], job="lt", run_dir=str(run))
    rc = run_launch(opts, terminal=term, err=err)
    launched = time.time()  # every line arrived before the launch returned
    assert rc == 0, err.getvalue()
    log = run / "output.log"
    m = load_manifest(run / "launch.json")
    assert m["collectors"]["megatron"]["line_times"] == str(sidecar_path(log))
    records = [ln.split() for ln in sidecar_path(log).read_text().splitlines()]
    ends = [int(r[0]) for r in records]
    assert ends == sorted(ends) and ends[-1] == log.stat().st_size
    col = MegatronCollector(m["collectors"]["megatron"] | {"job": "lt", "flush_after_s": 0})
    col.probe()
    col.start()
    steps = col.flush(0.0).steps
    assert [s.iteration for s in steps] == [1, 2, 3, 4, 5]
    for s in steps:
        printed = int(s.fields["printed ns"]) / 1e9
        # The line's arrival: after its print, before the launch ended (not when the collector read it).
        assert s.end_time is not None and printed <= s.end_time <= launched
    ends_t = [s.end_time or 0.0 for s in steps]
    assert all(b > a for a, b in itertools.pairwise(ends_t))  # distinct, ordered
    assert col.parser.counts.get("end_times_from_line_arrival") == 5


def test_without_line_times_the_log_stamp_is_used(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("[2026-11-21 10:00:01] iteration 1/ 5 | elapsed time per iteration (ms): 100.0 |\n")
    col = MegatronCollector({"path": str(log), "line_times": str(tmp_path / "absent.times")})
    col.probe()
    col.start()
    (s,) = col.flush(0.0).steps
    assert s.end_time is not None and s.end_time % 1 == 0  # the log's own one-second stamp
