"""No peer overwrites another's step records, and no worse copy replaces a good one.

The attack of the issue: a gRPC client says ``Hello(jobs=["victim"])`` — which makes it a host of
the job — and sends step records for iterations of the running job (it replaced 50 of 50, and
``not_host`` refused none). Here against the real aggregator on loopback (in the test's process,
tests/inproc.py); what the job holds is read back through the HTTP API, the refusals through /metrics.
The figures printed are recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.collectors.megatron import parse_file
from perfd.core import events
from perfd.core import limits as L
from perfd.core.model import StepRecord
from tests.inproc import Pipeline, pipeline
from tests.procs import http_get

ROOT = Path(__file__).resolve().parents[2]
DP2 = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
N = 50


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[Pipeline]:
    with pipeline(tmp_path, "--no-rules") as p:
        yield p


def _send(p: Pipeline, agent: str, job: str, steps: list[StepRecord]) -> None:
    p.send(agent, [{"steps": steps}], [job])


def _held(base: str, job: str) -> dict[int, float | None]:
    doc = json.loads(http_get(f"{base}/api/jobs/{job}/iterations"))
    return {it["iteration"]: it.get("step_time_ms") for it in doc["iterations"]}


def _refused(base: str, reason: str) -> float | None:
    line = re.escape(f'perfd_aggregator_refused_total{{reason="{reason}"}}')
    m = re.search(rf"^{line} ([0-9.e+-]+)$", http_get(f"{base}/metrics").decode(), re.M)
    return float(m.group(1)) if m else None


@pytest.mark.slow
def test_a_peer_saying_it_hosts_the_job_cannot_overwrite_its_iterations(aggregator: Pipeline) -> None:
    p = aggregator
    base = p.base
    _send(p, "node-a", "victim", [StepRecord(job="victim", iteration=i, step_time_ms=100.0)
                                       for i in range(1, N + 1)])
    before = p.wait(lambda: len(_held(base, "victim")) == N and _held(base, "victim"), 30, "job held")
    # The intruder: another agent id, a Hello naming the victim's job, records for its iterations
    # (and for new ones: a host named in a Hello may add iterations, never replace them).
    _send(p, "intruder", "victim", [StepRecord(job="victim", iteration=i, step_time_ms=1e6)
                                         for i in range(1, N + 11)])
    p.wait(lambda: _refused(base, L.REFUSED_STEP_CONFLICT) == N, 30, "conflicts counted")
    after = _held(base, "victim")
    replaced = sum(after[i] != before[i] for i in before)
    evs = [e for e in json.loads(http_get(f"{base}/api/events?job=victim"))["events"]
           if e["kind"] == events.STEP_CONFLICT.name]
    print(f"FIGURES step conflicts: {replaced} of {N} held iterations replaced by another agent, "
          f"{_refused(base, L.REFUSED_STEP_CONFLICT):.0f} records refused (step_conflict), "
          f"{len(evs)} event(s)")
    assert replaced == 0
    assert len(evs) == 1 and evs[0]["labels"] == {"holder": "node-a", "sender": "intruder"}
    assert "node-a" in evs[0]["text"] and "intruder" in evs[0]["text"]
    # The host itself still corrects its own records (a resend or a fuller copy replaces).
    _send(p, "node-a", "victim", [StepRecord(job="victim", iteration=1, step_time_ms=101.0)])
    p.wait(lambda: _held(base, "victim")[1] == 101.0, 30, "the host's correction")


def test_a_bit_flipped_copy_of_an_iteration_line_never_replaces_the_good_record(tmp_path: Path) -> None:
    """A copy of iteration 5's log line with two bytes flipped: the parser emits a second record
    for iteration 5 with the step time and loss absent. The good record stays; the copy is counted."""
    lines = DP2.read_text().splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if " iteration        5/" in line)
    flipped = (lines[i].replace("iteration (ms): 352.5", "iteration (ms): 3\x152.5")
               .replace("lm loss: 9.265577E+00", "lm loss: 9.2655\xb77E+00"))
    log = tmp_path / "flipped.log"
    log.write_text("".join([*lines[:i + 1], flipped, *lines[i + 1:]]))
    records = parse_file(log, job="j").records
    assert [(r.step_time_ms, r.lm_loss) for r in records if r.iteration == 5] == [(352.5, 9.265577),
                                                                                   (None, None)]
    st = AggregatorState()
    out = st.ingest_steps("node-a", records)
    (held,) = [r for r in st.step_records("j") if (r.iteration, str(r.rank)) == (5, "last")]
    assert (held.step_time_ms, held.lm_loss) == (352.5, 9.265577)
    assert out.worse == {"j": [5]} and st.stats_json()["step_records_worse_duplicates"] == 1
    # A fuller copy of the same agent still replaces (a correction, a resend).
    st.ingest_steps("node-a", [records[0]])
    assert st.stats_json()["step_records_worse_duplicates"] == 1
