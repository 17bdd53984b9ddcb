"""``perfd bench inbox``: a stream read a message a turn (the root's way) against an inbox, beside a
busy loop, on a real nats-server; bad arguments refused with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.engine.engine_driver import need_nats_server

ROOT = Path(__file__).resolve().parents[2]


def test_it_reads_every_message_both_ways_and_says_how_fast() -> None:
    need_nats_server()
    proc = subprocess.run([sys.executable, "-m", "perfd.cli", "bench", "inbox", "--messages", "600",
                           "--busy-ms", "0,5", "--rounds", "1", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {(r["mode"], r["busy_ms"]) for r in res["runs"]} == {
        ("next_msg", 0.0), ("inbox", 0.0), ("next_msg", 5.0), ("inbox", 5.0)}
    assert all(r["msgs_per_s"] > 0 for r in res["runs"])
    assert set(res["median_msgs_per_s"]) == {"next_msg@0ms", "inbox@0ms", "next_msg@5ms", "inbox@5ms"}


def test_bad_arguments_are_refused() -> None:
    for args in (["--messages", "0"], ["--busy-ms", "x"], ["--busy-ms", "-1"], ["--rounds", "0"]):
        proc = subprocess.run([sys.executable, "-m", "perfd.cli", "bench", "inbox", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "perfd bench inbox:" in proc.stderr, (args, proc.stderr)
