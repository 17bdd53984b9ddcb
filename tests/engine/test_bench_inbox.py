"""``perfd bench inbox``: a stream read a message a turn (the root's way) against an inbox, beside a
busy loop, on a real nats-server; bad arguments refused with exit 2. The command by the CLI's own entry
point, in the test's process (tests/cli_main.py); nats-server is the bench's own process."""

from __future__ import annotations

import json

import pytest

from tests.cli_main import perfd
from tests.engine.engine_driver import need_nats_server


def test_it_reads_every_message_both_ways_and_says_how_fast(capsys: pytest.CaptureFixture[str]) -> None:
    need_nats_server()
    proc = perfd(capsys, "bench", "inbox", "--messages", "600", "--busy-ms", "0,5", "--rounds", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {(r["mode"], r["busy_ms"]) for r in res["runs"]} == {
        ("next_msg", 0.0), ("inbox", 0.0), ("next_msg", 5.0), ("inbox", 5.0)}
    assert all(r["msgs_per_s"] > 0 for r in res["runs"])
    assert set(res["median_msgs_per_s"]) == {"next_msg@0ms", "inbox@0ms", "next_msg@5ms", "inbox@5ms"}


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--messages", "0"], ["--busy-ms", "x"], ["--busy-ms", "-1"], ["--rounds", "0"]):
        proc = perfd(capsys, "bench", "inbox", *args)
        assert proc.returncode == 2 and "perfd bench inbox:" in proc.stderr, (args, proc.stderr)
