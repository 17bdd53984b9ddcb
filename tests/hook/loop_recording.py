"""A hooked loop's run, as a test read it, kept as a recording: the step records and job records the
agent's hook collector read (each record in its wire encoding, the job info in its JSON), beside what
the loop timed itself and the machine's load as it ran. The verdicts on a live loop read the machine's
load as much as the loop's; read from a recording made on a quiet machine they read the loop only. The
live loop stays in the suite for what its path proves (every step in, the job record's flags)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json
from perfd.transport.gen import perfd_pb2 as pb
from perfd.transport.record_codec import step_from_pb, step_to_pb

DATA = Path(__file__).resolve().parents[1] / "data" / "hook"


def save(path: Path, run: dict[str, Any]) -> None:
    """``run``: ``records`` (StepRecords), ``job_info`` (job -> JobInfo), the rest JSON (a dict keyed by
    step keeps its keys as strings: :func:`load` gives ints back for the keys ``steps_keyed`` names)."""
    hexes = []
    for r in sorted(run["records"], key=lambda r: (r.iteration, r.rank)):
        m = pb.StepRecord()
        step_to_pb(r, m)
        hexes.append(m.SerializeToString().hex())
    rest = {k: v for k, v in run.items() if k not in ("records", "job_info")}
    keyed = sorted(k for k, v in rest.items()
                   if isinstance(v, dict) and v and all(isinstance(i, int) for i in v))
    with gzip.open(path, "wt") as f:
        json.dump({"records": hexes, "job_info": {j: job_info_to_json(i) for j, i in run["job_info"].items()},
                   "steps_keyed": keyed, **rest}, f)


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        d = json.load(f)
    out: dict[str, Any] = {k: v for k, v in d.items() if k not in ("records", "job_info", "steps_keyed")}
    for k in d["steps_keyed"]:
        out[k] = {int(i): v for i, v in d[k].items()}
    out["records"] = [step_from_pb(pb.StepRecord.FromString(bytes.fromhex(h))) for h in d["records"]]
    out["job_info"] = {j: job_info_from_json(t) for j, t in d["job_info"].items()}
    return out
