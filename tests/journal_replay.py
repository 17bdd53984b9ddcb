"""A recorded aggregator journal (``--state-dir``'s state.sqlite3: every agent batch as the aggregator
journalled it, tests/data/loops/*/state.sqlite3.xz) replayed through a fresh AggregatorState on the
replay clock, as the live aggregator took it in: each row at the time it arrived, the aggregator's
refresh (analyses, incidents, the stall watch) every ``tick_s`` between them, and its capture records
(the journal's "captures" document) known from the start, as the live coordinator knew each while it ran.

The journal keeps no samples (perfd.aggregator.durable: each batch without its samples): ``extra``
adds what a test needs beside it (NVML samples, host observations), in time order with the rows.
"""

from __future__ import annotations

import json
import lzma
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator import (
    class_inputs,
    collectives,
    gpu_views,
    hosts,
    http,
    job_analyses,
    jobs,
    nodes,
    sightings,
    snapshot,
    stalls,
    state_ingest,
    stats,
)
from perfd.aggregator.capture_records import CaptureRecord
from perfd.aggregator.state import AggregatorState
from perfd.aggregator.state_schema import HELLO
from perfd.aggregator.state_store import StateStore
from perfd.analytics.run.run_result import RunAnalysis
from perfd.core.clock import ManualClock
from perfd.core.jobinfo_json import job_info_from_json
from perfd.core.model import StepRecord
from perfd.transport.codec import DecodedBatch, decode_batch
from perfd.transport.gen import perfd_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "tests" / "data" / "loops"
CLOCKED = (class_inputs, collectives, gpu_views, hosts, http, job_analyses, jobs, nodes, sightings, snapshot,
           stalls, state_ingest, stats)


def unpack(name: str, into: Path) -> Path:
    """tests/data/loops/<name>/state.sqlite3.xz as a --state-dir under ``into``."""
    d = into / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.sqlite3").write_bytes(lzma.decompress((LOOPS / name / "state.sqlite3.xz").read_bytes()))
    return d


def own_clock(name: str) -> dict[int, float]:
    """The loop's own time per iteration (ms), as tests/data/loops/<name>/own_clock.json keeps it."""
    d = json.loads((LOOPS / name / "own_clock.json").read_text())
    return {int(k): float(v) for k, v in d["per_iter_ms"].items()}


class ReplayClock(ManualClock):
    """The replay's clock: the state's (perfd.core.clock), and any aggregator module that still reads
    ``time`` itself (a cost timing, say) set to it too, so nothing in the replay reads the wall clock."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def patch(self, mp: pytest.MonkeyPatch, modules: Sequence[types.ModuleType] = CLOCKED) -> None:
        """Set to this clock the ``time`` of each of ``modules`` that still reads it itself."""
        fake = types.SimpleNamespace(time=self.time, monotonic=self.monotonic)
        for mod in modules:
            if hasattr(mod, "time"):
                mp.setattr(mod, "time", fake)


@contextmanager
def replay_clock() -> Iterator[ReplayClock]:
    clock = ReplayClock()
    with pytest.MonkeyPatch.context() as mp:
        clock.patch(mp)
        yield clock


@dataclass
class Replayed:
    state: AggregatorState
    analysis: RunAnalysis
    summary: dict[str, Any]  # GET /api/jobs/<job> as it would answer at the end


# An edit of the journal's step records before they are taken in (a synthetic pause, say).
StepEdit = Callable[[StepRecord], StepRecord]
# ... and of its events, or of its capture records (what an agent of this version adds to one, say).
EventEdit = Callable[[dict[str, Any]], dict[str, Any]]
# Beside the journal: (time, what) with what a callable given the state (samples, events to ingest).
Extra = tuple[float, Callable[[AggregatorState], None]]


def replay(state_dir: Path, job: str, *, tick_s: float = 0.5, until: float | None = None,
           edit: StepEdit | None = None, edit_event: EventEdit | None = None,
           edit_capture: EventEdit | None = None, extra: Sequence[Extra] = (),
           tail_s: float = 30.0) -> Replayed:
    """Replay the journal at ``state_dir`` for ``job`` (up to replay time ``until``, else to its end and
    ``tail_s`` past it), refreshing every ``tick_s``."""
    store = StateStore(state_dir)
    try:
        with replay_clock() as clock:
            st = AggregatorState(min_recompute_s=0.0, clock=clock)
            st.capture_book.restore([CaptureRecord.from_json(edit_capture(dict(d)) if edit_capture else d)
                                     for d in store.get_doc("captures") or []])
            rows: list[tuple[float, int, Any]] = [(t, 0, (kind, agent, body))
                                                  for t, kind, agent, body in store.replay_timed()]
            rows += [(t, 1, fn) for t, fn in extra]
            rows.sort(key=lambda r: (r[0], r[1]))
            if until is not None:
                rows = [r for r in rows if r[0] <= until]
            tick = rows[0][0]
            for t, which, item in rows:
                while tick <= t:
                    clock.set(tick)
                    st.refresh()
                    tick += tick_s
                clock.set(t)
                if which:
                    item(st)
                    continue
                kind, agent, body = item
                if kind == HELLO:
                    st.hello(agent, json.loads(body), t)
                    continue
                _take(st, agent, decode_batch(pb.Batch.FromString(body), {}), t, job, edit, edit_event)
            end = (until if until is not None else rows[-1][0] + tail_s)
            while tick <= end:
                clock.set(tick)
                st.refresh()
                tick += tick_s
            clock.set(end)
            a = st.analysis(job, force=True)
            summary = http.job_summary(st, job)
            assert a is not None and summary is not None
            return Replayed(st, a, summary)
    finally:
        store.close()


def _take(st: AggregatorState, agent: str, b: DecodedBatch, t: float, job: str, edit: StepEdit | None,
          edit_event: EventEdit | None) -> None:
    for name, text in b.job_info_json.items():
        st.ingest_job_info(agent, name, job_info_from_json(text), t)
    if b.steps:
        st.ingest_steps(agent, [edit(r) if edit is not None and r.job == job else r for r in b.steps], t)
    if b.events:
        st.ingest_events(agent, [edit_event(dict(e)) if edit_event is not None else e for e in b.events])


Sample = tuple[str, tuple[tuple[str, str], ...]]  # a metric's name and its sorted labels


def samples(st: AggregatorState, agent: str, at: float, values: Mapping[Sample, float]) -> None:
    """NVML-like samples of ``agent`` at ``at``: (name, sorted labels) -> value (the journal keeps none)."""
    keys = list(values)
    st.ingest_samples(agent, dict(enumerate(keys)), list(range(len(keys))), [int(at * 1e9)] * len(keys),
                      [values[k] for k in keys])
