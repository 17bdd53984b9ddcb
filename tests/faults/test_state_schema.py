"""State written by one build and read by another (issue 56: a downgrade read 29 of 40 iterations of
a newer build's state and said nothing; an old agent logged ``resume:unreadable 'position'`` and read
its log again from the start).

A real aggregator (``--state-dir``) and a real agent (``--state-dir``, ``--spool-dir``) take a
Megatron-LM log of 40 iterations and stop; the aggregator's state file carries this build's schema
and a restart reads all 40 back. Then each file is made a future build's (the schema, or the
checkpoint's format, one higher): this build refuses it at start-up, exit 2 and one line that says
why, and leaves the file byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from perfd.agent.checkpoints import FORMAT
from perfd.aggregator.state_schema import SCHEMA_VERSION, schema_of
from tests.faults.test_network_faults import JOB, _megatron_lines
from tests.procs import Procs, free_port, http_get, start_agent, start_aggregator, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
N = 40


def _iterations(base: str) -> list[int]:
    its = json.loads(http_get(f"{base}/api/jobs/{JOB}/iterations?sources=0"))["iterations"]
    return [int(it["iteration"]) for it in its]


def _files(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` (relative name) -> the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _perfd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfd.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.e2e
def test_a_newer_builds_state_is_refused_and_left_untouched(tmp_path: Path) -> None:
    head, lines = _megatron_lines(N)
    log = tmp_path / "train.log"
    log.write_text(head + "".join(lines))
    agg_state, agent_state = tmp_path / "agg-state", tmp_path / "agent-state"
    out = tmp_path / "out"
    out.mkdir()
    with Procs(out) as procs:
        grpc, _, base = start_aggregator(procs, "--no-rules", "--state-dir", agg_state)
        start_agent(procs, grpc, "--job", JOB, "--megatron-log", log, "--host", "off", "--node", "n1",
                    "--spool-dir", tmp_path / "spool", "--state-dir", agent_state, nvml="off")
        assert wait_for(lambda: _iterations(base) == list(range(1, N + 1)), 60, f"{N} iterations")
    store = agg_state / "state.sqlite3"
    assert schema_of(store) == SCHEMA_VERSION
    (checkpoint,) = agent_state.glob("*.checkpoint.json")
    assert json.loads(checkpoint.read_text())["format"] == FORMAT

    # This build reads its own state back: every iteration.
    with Procs(out) as procs:
        _, _, base = start_aggregator(procs, "--no-rules", "--state-dir", agg_state, name="again")
        assert wait_for(lambda: _iterations(base) == list(range(1, N + 1)), 30, "the state read back")

    # A future build's state: schema + 1 (what it would write), then this build starts on it.
    db = sqlite3.connect(str(store))
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = _files(agg_state)
    r = _perfd("aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules",
               "--state-dir", str(agg_state))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"schema {SCHEMA_VERSION + 1}, written by a newer perfd" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _files(agg_state) == before, "the newer state was written to"
    assert schema_of(store) == SCHEMA_VERSION + 1

    # The agent's resume position of a future format: refused the same way, not read as a bare one.
    doc = json.loads(checkpoint.read_text())
    checkpoint.write_text(json.dumps({**doc, "format": FORMAT + 1}))
    before = _files(agent_state)
    r = _perfd("agent", "--job", JOB, "--megatron-log", str(log), "--nvml", "off", "--host", "off",
               "--metrics-port", str(free_port()), "--state-dir", str(agent_state))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"checkpoint of format {FORMAT + 1}, written by a newer perfd" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "resume:unreadable" not in r.stdout + r.stderr
    assert _files(agent_state) == before, "the newer checkpoint was written to"
