"""One malformed event must not take the aggregator down, now or at its next start (issue 54 item 1).

The issue's attack: any client (its Hello naming a job of its own) sends
``{"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"}, "payload": [{"rank": 0, "job": "victim"}]}``
— a process entry without a ``pid``. Rank placement raised ``KeyError: 'pid'`` on every tick: /metrics
and every job endpoint answered 500, stall checks failed, and since the event was journalled, a
restart on the same ``--state-dir`` exited 1.

Here: the real aggregator with a state dir (in the test's process, tests/inproc.py; its restart a second
start on the same state), the victim's host and the attacker as
real gRPC agents (the transport's own AgentClient). The malformed entry is refused at the edge and
counted (``malformed_event``); every endpoint answers 200; a restart on the same state starts. A
second test writes the event into a journal the way the journal always wrote accepted batches
(perfd.aggregator.durable.Journal, ``kept=None``) and starts the real aggregator on it.
"""

from __future__ import annotations

import logging
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.durable import Journal
from perfd.aggregator.state_store import StateStore
from perfd.model import StepRecord
from perfd.transport.client import AgentClient
from perfd.transport.codec import encode_batch
from perfd.transport.series import SeriesTable
from tests.faults.streams import streaming
from tests.inproc import pipeline
from tests.procs import get_json, http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
JOB = "victim"
ATTACK: dict[str, Any] = {"kind": "gpu_processes", "labels": {"node": "n", "gpu": "0"},
          "payload": [{"rank": 0, "job": JOB}]}
# A few more of the same sort: entries of the wrong type where the aggregator reads a number.
MORE: list[dict[str, Any]] = [
    {"kind": "gpu_processes", "labels": {"node": "n", "gpu": "1"},
     "payload": [{"pid": "not-a-pid", "rank": 1, "job": JOB}, {"pid": 7, "rank": "one", "job": JOB}]},
    {"kind": "rank_processes", "job": "theirs", "time": 0.0, "text": "",
     "payload": {"job": "theirs", "ranks": [{"rank": 0}, {"pid": 3, "rank": None}]}},
    {"kind": "job_phase", "job": "theirs", "time": 0.0, "text": "",
     "payload": {"job": "theirs", "phase": "checkpoint", "state": "begin", "iteration": "soon"}},
]


def _endpoints(base: str) -> dict[str, int]:
    """Every GET path of the aggregator and what it answered."""
    paths = ["/metrics", "/healthz", "/api/stats", "/api/jobs", "/api/events", "/api/captures",
             *(f"/api/jobs/{JOB}/{p}" for p in ("summary", "iterations", "incidents", "gpus"))]
    out = {}
    for p in paths:
        try:
            with urllib.request.urlopen(base + p, timeout=10) as r:
                out[p] = r.status
        except urllib.error.HTTPError as e:
            out[p] = e.code
    return out


def _refused(base: str, reason: str) -> float:
    m = re.search(rf'^perfd_aggregator_refused_total\{{reason="{reason}"\}} (\S+)$',
                  http_get(f"{base}/metrics").decode(), re.M)
    return float(m.group(1)) if m else 0.0


async def _attack(target: str) -> None:
    host = AgentClient(target, "host-agent", jobs=[JOB])
    attacker = AgentClient(target, "attacker", jobs=["theirs"])
    async with streaming(host) as h, streaming(attacker) as a:
        t0 = time.time()
        h.submit(steps=[StepRecord(job=JOB, iteration=i, rank="last", end_time=t0 - 3 + i * 0.1,
                                   step_time_ms=100.0) for i in range(1, 31)])
        assert await h.flush(30)
        a.submit(events=[ATTACK, *MORE])
        assert await a.flush(30)


def _all_ok(base: str) -> dict[str, int]:
    got = _endpoints(base)
    assert all(code == 200 for code in got.values()), got
    return got


# An exception no one caught in one of the aggregator's threads fails the test, as it would have been a
# traceback in the aggregator process' output.
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_one_malformed_event_takes_no_endpoint_down_and_no_restart(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    args = ("--no-rules", "--rules-interval", "0.5", "--state-dir", state)
    caplog.set_level(logging.WARNING)  # the aggregator's log, as `perfd aggregator` writes it
    with pipeline(tmp_path, *args) as p:
        base = p.base
        p.call(_attack(p.target), "the host's and the attacker's batches", 120)
        time.sleep(2.0)  # several refresh and rules ticks over what arrived
        _all_ok(base)
        # The entry, both entries of the second list, the two rank entries, the phase.
        assert _refused(base, "malformed_event") == 6.0
    out = caplog.text
    assert "Traceback" not in out, out[-3000:]
    assert "refused (malformed_event)" in out and "pid" in out
    # The same state again: it starts, and answers.
    with pipeline(tmp_path, *args) as p:
        base = p.base
        p.wait(lambda: _all_ok(base), 20, "every endpoint 200 after the restart")
        job = p.wait(lambda: get_json(f"{base}/api/jobs/{JOB}/iterations")["iterations"], 20,
                     "the victim's iterations back")
        assert len(job) == 30


def test_a_journal_holding_a_malformed_event_restarts(tmp_path: Path) -> None:
    """The journal as the aggregator wrote it before the edge refused such events: a batch kept
    whole (``kept=None``) with the issue's event among good ones. A restart skips and counts it."""
    state = tmp_path / "state"
    store = StateStore(str(state))
    table = SeriesTable()
    t0 = time.time()
    good = StepRecord(job=JOB, iteration=1, rank="last", end_time=t0, step_time_ms=100.0)
    b = encode_batch("host-agent", 1, [], [good], [ATTACK, *MORE], table)
    j = Journal(store)
    j.hello("host-agent", [JOB])
    j.batch("host-agent", b)
    j.seq("host-agent", "e", 1)
    assert j.commit()
    store.close()
    with pipeline(tmp_path, "--no-rules", "--rules-interval", "0.5", "--state-dir", state) as p:
        base = p.base
        time.sleep(2.0)
        _all_ok(base)
        assert [it["iteration"] for it in get_json(f"{base}/api/jobs/{JOB}/iterations")["iterations"]] == [1]
        assert _refused(base, "malformed_event") == 6.0
