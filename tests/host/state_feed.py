"""What a live aggregator's state took in, recorded as it came and replayed on a manual clock.

A live scenario (real processes: a hooked loop, CPU burners, the agent reading /proc) is recorded once
on a quiet machine: each call the aggregator made into its state (hello, job info, samples, step
records, events) with the wall time it came at, the records in their wire encoding. The suite replays
the calls in order into a fresh AggregatorState whose clock is the recording's (perfd.core.clock.ManualClock),
ticking as the aggregator's refresher does every ``every_s`` of replay time (each job analysed, its stall
watched, its snapshot made): the verdicts read what the
scenario produced, not the load of the machine the suite runs on."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perfd.aggregator.state import AggregatorState
from perfd.core.clock import ManualClock
from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json
from perfd.core.model import label_set
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb


class Recorder:
    """Wraps a live state's ingest calls: each goes on as it did, and into ``entries`` with its time."""

    def __init__(self, state: AggregatorState) -> None:
        self.entries: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        hello, info, samples = state.hello, state.ingest_job_info, state.ingest_samples
        steps, evs = state.ingest_steps, state.ingest_events

        def rec(m: str, **kw: Any) -> None:
            self.entries.append({"t": time.time(), "m": m, **kw})

        def hello_(agent_id: str, jobs: Any, now: Any = None, node: Any = None,
                   capabilities: Any = None) -> None:
            rec("hello", agent=agent_id, jobs=list(jobs), node=node, capabilities=dict(capabilities or {}))
            hello(agent_id, jobs, now, node, capabilities)

        def info_(agent_id: str, job: str, i: Any, now: Any = None) -> None:
            rec("info", agent=agent_id, job=job, text=job_info_to_json(i))
            info(agent_id, job, i, now)

        def samples_(agent_id: str, defs: Any, ids: Any, ts: Any, values: Any) -> None:
            rec("samples", agent=agent_id, ids=list(ids), ts=list(ts), values=list(values),
                defs={str(k): [n, sorted(dict(ls).items())] for k, (n, ls) in defs.items()})
            samples(agent_id, defs, ids, ts, values)

        def steps_(agent_id: str, recs: Any, now: Any = None) -> Any:
            hexes = []
            for r in recs:
                m = pb.StepRecord()
                step_to_pb(r, m)
                hexes.append(m.SerializeToString().hex())
            rec("steps", agent=agent_id, records=hexes)
            return steps(agent_id, recs, now)

        def events_(agent_id: str, e: Any) -> None:
            rec("events", agent=agent_id, events=[dict(x) for x in e])
            evs(agent_id, e)

        for name, fn in (("hello", hello_), ("ingest_job_info", info_), ("ingest_samples", samples_),
                         ("ingest_steps", steps_), ("ingest_events", events_)):
            setattr(state, name, fn)  # on the instance: the daemon calls these through it

    def save(self, path: Path) -> None:
        with gzip.open(path, "wt") as f:
            f.write(json.dumps({"meta": self.meta}) + "\n")
            for e in self.entries:
                f.write(json.dumps(e, default=str) + "\n")


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(path, "rt") as f:
        lines = [json.loads(x) for x in f]
    return lines[0]["meta"], lines[1:]


def replay(entries: list[dict[str, Any]], every_s: float = 1.0) -> Iterator[tuple[float, AggregatorState]]:
    """The calls in order into a fresh state on the recording's clock; yields (time, state) after each
    refresher tick (every ``every_s``), and once more 30 s after the last call."""
    clock = ManualClock(entries[0]["t"])
    st = AggregatorState(min_recompute_s=0.0, clock=clock)
    next_analysis = entries[0]["t"] + every_s
    for e in entries:
        while e["t"] >= next_analysis:  # the refresher's ticks between the calls
            clock.set(next_analysis)
            st.refresh()  # the refresher's tick: every job analysed, its stall watched, its snapshot made
            yield next_analysis, st
            next_analysis += every_s
        clock.set(e["t"])
        m, agent = e["m"], e["agent"]
        if m == "hello":
            st.hello(agent, e["jobs"], None, e["node"], e["capabilities"])
        elif m == "info":
            st.ingest_job_info(agent, e["job"], job_info_from_json(e["text"]))
        elif m == "samples":
            defs = {int(k): (n, label_set(dict(ls))) for k, (n, ls) in e["defs"].items()}
            st.ingest_samples(agent, defs, e["ids"], e["ts"], e["values"])
        elif m == "steps":
            st.ingest_steps(agent, [step_from_pb(pb.StepRecord.FromString(bytes.fromhex(h)))
                                    for h in e["records"]])
        elif m == "events":
            st.ingest_events(agent, e["events"])
    clock.set(entries[-1]["t"] + 30.0)
    st.refresh()
    yield clock.time(), st
