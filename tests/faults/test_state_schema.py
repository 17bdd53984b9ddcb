"""State written by one build and read by another (a downgrade once read 29 of 40 iterations of
a newer build's state and said nothing; an old agent logged ``resume:unreadable 'position'`` and read
its log again from the start).

A real aggregator (``--state-dir``) and a real agent (``--state-dir``, ``--spool-dir``), run in the
test's process (tests/inproc.py), take a Megatron-LM log of 40 iterations and stop; the aggregator's
state file carries this build's schema and a restart reads all 40 back. Then each file is made a future
build's (the schema, or the checkpoint's format, one higher): this build refuses it at start-up, exit 2
and one line that says why, and leaves the file byte for byte as it was (each command through the CLI's
main(): its return value the exit status; its stdout and stderr capfd's, its log lines caplog's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from perfd.agent.checkpoints import FORMAT
from perfd.aggregator.state_schema import SCHEMA_VERSION, schema_of
from perfd.app.cli import main
from tests.faults.test_network_faults import JOB, _megatron_lines
from tests.inproc import pipeline
from tests.procs import free_port, http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a daemon that took the file would run on
N = 40


def _iterations(base: str) -> list[int]:
    its = json.loads(http_get(f"{base}/api/jobs/{JOB}/iterations?sources=0"))["iterations"]
    return [int(it["iteration"]) for it in its]


def _files(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` (relative name) -> the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refusal(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
             *args: str) -> tuple[int, str, str]:
    """``perfd ARGS`` by the CLI's main(): its exit status, its stdout, and what the process would have
    written to stderr (what it printed, its log lines of WARNING and above)."""
    capfd.readouterr()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perfd"):
        rc = main(list(args))
    logged = [caplog.handler.format(r) for r in caplog.records if r.levelno >= logging.WARNING]
    got = capfd.readouterr()
    return rc, got.out, got.err + "".join(f"{ln}\n" for ln in logged)


def test_a_newer_builds_state_is_refused_and_left_untouched(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    head, lines = _megatron_lines(N)
    log = tmp_path / "train.log"
    log.write_text(head + "".join(lines))
    agg_state, agent_state = tmp_path / "agg-state", tmp_path / "agent-state"
    with pipeline(tmp_path, "--no-rules", "--state-dir", agg_state) as p:
        p.agent("--job", JOB, "--megatron-log", log, "--host", "off", "--node", "n1",
                "--spool-dir", tmp_path / "spool", "--state-dir", agent_state, "--nvml", "off")
        assert p.wait(lambda: _iterations(p.base) == list(range(1, N + 1)), 60, f"{N} iterations")
    store = agg_state / "state.sqlite3"
    assert schema_of(store) == SCHEMA_VERSION
    (checkpoint,) = agent_state.glob("*.checkpoint.json")
    assert json.loads(checkpoint.read_text())["format"] == FORMAT

    # This build reads its own state back: every iteration.
    with pipeline(tmp_path, "--no-rules", "--state-dir", agg_state) as p:
        assert p.wait(lambda: _iterations(p.base) == list(range(1, N + 1)), 30, "the state read back")

    # A future build's state: schema + 1 (what it would write), then this build starts on it.
    db = sqlite3.connect(str(store))
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = _files(agg_state)
    rc, out, err = _refusal(capfd, caplog, "aggregator", "--grpc-port", "0", "--http-port", "0",
                            "--no-rules", "--state-dir", str(agg_state))
    assert rc == 2, out + err
    assert f"schema {SCHEMA_VERSION + 1}, written by a newer perfd" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert _files(agg_state) == before, "the newer state was written to"
    assert schema_of(store) == SCHEMA_VERSION + 1

    # The agent's resume position of a future format: refused the same way, not read as a bare one.
    doc = json.loads(checkpoint.read_text())
    checkpoint.write_text(json.dumps({**doc, "format": FORMAT + 1}))
    before = _files(agent_state)
    rc, out, err = _refusal(capfd, caplog, "agent", "--job", JOB, "--megatron-log", str(log), "--nvml",
                            "off", "--host", "off", "--metrics-port", str(free_port()),
                            "--state-dir", str(agent_state))
    assert rc == 2, out + err
    assert f"checkpoint of format {FORMAT + 1}, written by a newer perfd" in err, err
    assert "Traceback" not in err and "resume:unreadable" not in out + err
    assert _files(agent_state) == before, "the newer checkpoint was written to"
