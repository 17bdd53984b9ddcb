"""End to end on loopback, the Megatron-LM way: no step hook, the step windows come from the job's
iteration lines, whose log stamps are whole seconds.

The launch runs a stand-in Megatron job that replays the recorded 2×H200 Flight Recorder run shifted to
now: it prints an iteration line at each step boundary of the recording, as it happens, then writes the
shifted dumps where the launch told it to. The agent (`perfd agent --launch-manifest`) tails the log
with the launch's line-times sidecar (perfd.core.linetimes) and reads the dumps; the aggregator maps the
collectives to iterations. The launch, the agent and the aggregator run in the test's process
(tests/inlaunch.py, tests/inproc.py); the job is a process. Checked: the iteration end times are the
lines' print times (not their one-second stamps), and the aggregator's per-iteration shares equal an
in-process analysis of the same records and step records.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.collectives.collective_analysis import analyze_collectives
from perfd.app.launcher import LaunchOptions
from perfd.collectors.megatron.collector import MegatronCollector
from perfd.collectors.nccl.flight_recorder import FlightRecorderTracker, load_dump_bytes, parse_dump
from perfd.core.manifest import load_manifest
from tests.collectives.collective_helpers import FIXTURES
from tests.inlaunch import InLaunch
from tests.inproc import Pipeline, pipeline
from tests.procs import http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STAND_IN = r"""
import itertools, os, pickle, sys, time
fixtures, out = sys.argv[1], sys.argv[2]
dumps = {(i, r): pickle.load(open(os.path.join(fixtures, f"dump{i:02d}_rank{r}"), "rb"))
         for i in range(4) for r in (0, 1)}
created = sorted({e["time_created_ns"] for (i, r), d in dumps.items() if r == 0
                  for e in d["entries"] if e.get("time_created_ns")})
# Step boundaries of the recording: 50 ms into every pause of more than 100 ms between collectives.
bounds = [a + 50_000_000 for a, b in itertools.pairwise(created) if b - a > 100_000_000]
shift = time.time_ns() + 1_000_000_000 - created[0]  # the recording, replayed from 1 s from now
with open(os.path.join(out, "intended.txt"), "w") as fh:
    fh.write("\n".join(str(b + shift) for b in bounds))
for k, b in enumerate(bounds, start=1):
    time.sleep(max(0.0, (b + shift - time.time_ns()) / 1e9))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f" [{stamp}] iteration {k:8d}/{len(bounds):8d} | consumed samples: {8 * k:10d} | "
          "elapsed time per iteration (ms): 200.0 | learning rate: 1.000000E-04 | global batch size:     8 | "
          "lm loss: 1.000000E+01 | loss scale: 1.0 | number of skipped iterations:   0 | "
          "number of nan iterations:   0 |", flush=True)
dump = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
for i in range(4):  # what the ranks' monitor threads write when the agent asks
    for r in (0, 1):
        d = dumps[(i, r)]
        for e in d["entries"]:
            for key in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
                if e.get(key):
                    e[key] += shift
        data = pickle.dumps(d)
        with open(os.path.join(out, f"shifted{i:02d}_rank{r}"), "wb") as fh:
            fh.write(data)
        with open(dump + str(r) + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(dump + str(r) + ".tmp", dump + str(r))
    time.sleep(1.6)  # the agent reads every 0.5 s: each dump is seen
print("stand-in training done", flush=True)
"""


def _records(out: Path) -> list[Any]:
    tr = FlightRecorderTracker("meg")
    recs = []
    for i in range(4):
        for rank in (0, 1):
            p = out / f"shifted{i:02d}_rank{rank}"
            recs += tr.update(parse_dump(load_dump_bytes(p.read_bytes()), rank, "meg", str(p)))
    return recs  # no flush(): the agent, still running, has not given up on pending entries either


def test_megatron_windows_from_line_times(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    out = tmp_path / "out"
    out.mkdir()
    run = tmp_path / "run"
    job = [sys.executable, str(script), str(FIXTURES / "timing"), str(out)]
    launch = InLaunch(LaunchOptions(job, job="meg", run_dir=str(run), flight_recorder=str(tmp_path / "fr"),
                                    agent_socket=str(tmp_path / "hook.sock"), env={"PYTHONUNBUFFERED": "1"}),
                      tmp_path / "launch.out")
    try:
        with pipeline(tmp_path, "--no-rules") as p:
            launch.start()
            manifest = launch.manifest_written()
            cfg = tmp_path / "agent.yaml"
            cfg.write_text("batch_interval_s: 0.2\ncollectors:\n  nccl:\n    flight_recorder:\n"
                           "      interval_s: 0.5\n      read_existing: true\n"
                           "  megatron:\n    flush_after_s: 0.5\n")
            p.agent("--config", cfg, "--launch-manifest", manifest, "--nvml", "off", "--host",
                    "off", "--metrics-port", "-1", "--node", "n1")
            assert launch.wait(60) == 0, launch.output()[-2000:]
            _check(p, tmp_path, run, out)
    finally:
        launch.stop()


def _check(p: Pipeline, tmp_path: Path, run: Path, out: Path) -> None:
    # The step records as the agent makes them: the same collector over the same files.
    manifest = load_manifest(run / "launch.json")
    col = MegatronCollector({**manifest["collectors"]["megatron"], "job": "meg"})
    col.probe()
    col.start()
    steps = col.flush(0.0).steps
    intended = [int(x) / 1e9 for x in (out / "intended.txt").read_text().split()]
    assert [s.iteration for s in steps] == list(range(1, len(intended) + 1))
    ends = [s.end_time or 0.0 for s in steps]
    # Each end time is the line's print time: after the boundary it was printed at, and close
    # to it (the median lateness allows a loaded machine); the log's own stamps are whole
    # seconds and would put several iterations in one second.
    assert all(e >= b for e, b in zip(ends, intended, strict=True))
    assert statistics.median(e - b for e, b in zip(ends, intended, strict=True)) < 0.05
    # In order; distinct but for lines a starved reader took in one read (the launch stamps a
    # read, and a loaded 2-core machine can hold it back past the next boundary).
    assert all(b >= a for a, b in itertools.pairwise(ends))
    assert len(set(ends)) >= len(ends) - 2
    assert len({int(e) for e in ends}) < len(ends)  # several iterations share a second

    want = analyze_collectives("meg", _records(out), steps).to_json()
    url = f"{p.base}/api/jobs/meg/summary"

    def caught_up() -> Any:
        c = json.loads(http_get(url)).get("collectives") or {}
        n = len(c.get("iterations", []))
        return c if n >= len(want["iterations"]) and c.get("records", 0) >= want["records"] else None

    def held() -> Any:  # what the aggregator holds so far: the wait goes on while it grows
        c = json.loads(http_get(url)).get("collectives") or {}
        return c.get("records"), len(c.get("iterations", []))

    try:
        # 30 s without a new record (a loaded machine delivered 198 of 248 in 30 s, still arriving)
        got = p.wait(caught_up, 30, "the aggregator's collective analysis", progress=held)
    except AssertionError:
        c = json.loads(http_get(url)).get("collectives") or {}
        pytest.fail(f"aggregator never caught up: want {len(want['iterations'])} iterations, "
                    f"{want['records']} records; got {len(c.get('iterations', []))}, {c.get('records')}: "
                    f"{json.dumps(c.get('summary'))}\n" + (tmp_path / "launch.out").read_text()[-2000:])
    assert got["method"]["name"] == want["method"]["name"] == "step_windows"
    # 12 of the 28 windows: the recording's dumps miss some sequence numbers between them, and a
    # window with a gap is left out (rather than counted short).
    assert len(want["iterations"]) >= 10
    shares = {it["iteration"]: it["share_by_rank"] for it in got["iterations"]}
    assert shares == {it["iteration"]: pytest.approx(it["share_by_rank"]) for it in want["iterations"]}
    assert got["summary"]["comm_total_share"] == pytest.approx(want["summary"]["comm_total_share"])
