"""The jobs of docs/evidence/entries/30-any-pytorch-job-as-people-write-it-against-each-loop-s-own-c.md
replayed from their recordings, as the agent and the aggregator took them live
(tests/data/hook/frameworks/<job>/, made by tests/gpu/frameworks_live.py: see the README there).

For each job: the step hook's datagrams, byte for byte as the training process sent them, go through
the agent's hook collector (decoding, the sender's credentials as the kernel gave them: the recorded
pid) into the aggregator's state, in the order they were sent, beside the NVML frames of the rank's
GPU where the recording has them (their process lists attributed to the hook's rank as the agent
does: perfd.agent.hook_gpus); the aggregator analyses every 2 s of the recording's time. Then the
same checks the live script made (tests/gpu/frameworks_live.py ``check``) against the loop's own
clock in the recording: the step time within 3% and the data share within 3 points, the model
TFLOP/s within 3%, class data-bound, R1 the data loader, goodput without unexplained time; for the
data-slowdown incident one incident over the slow stretch, its cost within 15%, its cause the data
wait and its action the data loader, with the GPU's NVML samples where they were recorded.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.hook_gpus import HookGpus, hook_ranks
from perfd.aggregator import class_inputs as class_inputs_mod
from perfd.aggregator import job_analyses as job_analyses_mod
from perfd.aggregator import jobs as jobs_mod
from perfd.aggregator import sightings as sightings_mod
from perfd.aggregator import state_ingest as state_ingest_mod
from perfd.aggregator import stats as stats_mod
from perfd.aggregator.http import job_iterations, job_summary
from perfd.aggregator.state import AggregatorState
from perfd.collectors.collector import Collected
from perfd.collectors.hook import HookCollector
from perfd.collectors.hook.peers import Sender
from perfd.core import events
from tests.gpu.frameworks_live import check, own_steps
from tests.journal_replay import ReplayClock

DATA = Path(__file__).resolve().parents[1] / "data" / "hook" / "frameworks"
JOBS = sorted(p.name for p in DATA.iterdir() if (p / "meta.json").exists())
NODE = "replay-node"
ANALYSE_EVERY_S = 2.0

# up to a thousand steps each, analysed every 2 s of their time, once for every test of the module
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("frameworks_replay")]


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if path.exists():
        with gzip.open(path, "rt") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _sender(datagram: bytes) -> Sender:
    """The credentials the kernel attached live: the sending process's pid (every hook record
    carries it at the same offset: version, kind, flags, rank, pid)."""
    (pid,) = struct.unpack_from("<I", datagram, 8)
    return Sender(pid, os.getuid(), os.getgid())


def replay(job_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    meta = json.loads((job_dir / "meta.json").read_text())
    job = meta["job"]
    clock = ReplayClock()
    clock.patch(monkeypatch, (state_ingest_mod, job_analyses_mod, jobs_mod, sightings_mod, class_inputs_mod,
                              stats_mod))
    collector = HookCollector({"socket_path": str(tmp_path / "hook.sock"), "job": job})  # decodes only
    hook_gpus = HookGpus(job)
    st = AggregatorState(min_recompute_s=0.0, peak_tflops=meta.get("peak_tflops"), clock=clock)
    feed: list[tuple[float, str, Any]] = [(float(d["t"]), "hook", base64.b64decode(d["d"]))
                                          for d in _lines(job_dir / "hook.jsonl.gz")]
    frames = [fr for fr in _lines(job_dir / "nvml.jsonl.gz") if fr.get("type") == "collect"]
    feed += [(float(fr["time"]), "nvml", fr) for fr in frames]
    feed.sort(key=lambda x: x[0])
    assert feed, f"{job_dir}: nothing recorded"
    clock.set(feed[0][0])
    st.hello("agent-a", [job])
    defs: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    next_analysis = feed[0][0]
    for t, what, item in feed:
        clock.set(t)
        if what == "hook":
            out = Collected()
            collector._handle(item, "replay", _sender(item), t, out)
            for name, info in out.job_info.items():
                st.ingest_job_info("agent-a", name, info)
            if out.steps:
                st.ingest_steps("agent-a", out.steps)
            if out.events:
                st.ingest_events("agent-a", out.events)
        else:
            new: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {}
            ids, vals = [], []
            for s in item["samples"]:
                key = (s["name"], tuple(sorted({**s["labels"], "node": NODE}.items())))
                if key not in defs:
                    defs[key] = len(defs)
                    new[defs[key]] = key
                ids.append(defs[key])
                vals.append(float(s["value"]))
            st.ingest_samples("agent-a", new, ids, [int(t * 1e9)] * len(ids), vals)
            evs = [dict(e) for e in item.get("events") or [] if e["kind"] == events.GPU_PROCESSES.name]
            hook_gpus.apply(evs, hook_ranks(collector.ranks), t)  # as the agent sends them
            if evs:
                st.ingest_events("agent-a", [{**e, "labels": {**e["labels"], "node": NODE}} for e in evs])
        if t >= next_analysis:
            st.analysis(job, force=True)
            next_analysis = t + ANALYSE_EVERY_S
    clock.set(feed[-1][0] + 30.0)  # the job has ended; the aggregator refreshes once more
    st.analysis(job, force=True)
    full = job_summary(st, job)
    its = job_iterations(st, job, sources=False)
    assert full is not None and its is not None
    own = json.loads(gzip.open(job_dir / "own.json.gz", "rt").read())
    return {"meta": meta, "own": own, "full": full, "incidents": st.incidents.incidents(job),
            "iterations": its["iterations"], "collector_errors": dict(collector.errors),
            "nvml_frames": len(frames)}


@pytest.fixture(scope="module", params=JOBS)
def replayed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as m:
        got = replay(DATA / str(request.param), m, tmp_path_factory.mktemp("replay"))
    got["kind"] = got["meta"]["kind"]
    return got


def test_the_recordings_are_the_issues_jobs() -> None:
    kinds = {json.loads((DATA / j / "meta.json").read_text())["kind"] for j in JOBS}
    assert kinds == {"readme", "loader", "hf", "lightning", "incident"}


def test_every_record_is_taken_as_the_agent_took_it(replayed: dict[str, Any]) -> None:
    assert replayed["collector_errors"] == {}
    steps = own_steps(replayed["own"])
    held = {r["iteration"] for r in replayed["iterations"]}
    assert set(steps) <= held  # every step the loop timed reached the aggregator
    if replayed["meta"]["device"] == "gpu":
        assert replayed["nvml_frames"] > 0  # the GPU recordings carry the rank's NVML samples


def test_step_time_data_share_class_and_r1_are_the_loops_own(replayed: dict[str, Any]) -> None:
    c = check(replayed["kind"], replayed["own"], replayed["full"], replayed["incidents"],
              replayed["iterations"])
    failed = [k for k, v in c.items() if k.startswith("ok_") and not v]
    assert not failed, json.dumps(c, indent=1, default=str)
    assert {"ok_step_time", "ok_data_share", "ok_class", "ok_goodput_other"} <= set(c)
    if replayed["kind"] == "incident":
        assert {"ok_one_incident", "ok_edges", "ok_cost", "ok_cause_data", "ok_action_data"} <= set(c)
    else:
        assert "ok_r1" in c


def test_nvml_frames_are_placed_on_the_hooks_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The replay's GPU path, before a GPU recording is here: a real H100 NVML recording
    (tests/data/incidents/cotenant_h100) laid over the README loop's time, its process list naming the
    loop's pid (no RANK: the job runs as ``python3 train.py``). The agent's attribution places rank 0
    on that GPU, and its samples reach the job's GPU view."""
    src = DATA / "readme"
    job_dir = tmp_path / "readme"
    job_dir.mkdir()
    for name in ("hook.jsonl.gz", "own.json.gz", "meta.json"):
        (job_dir / name).write_bytes((src / name).read_bytes())
    pid = json.loads(gzip.open(src / "own.json.gz", "rt").read())["pid"]
    sent = [float(d["t"]) for d in _lines(src / "hook.jsonl.gz")]
    frames = [fr for fr in _lines(Path(__file__).resolve().parents[1] / "data" / "incidents" / "cotenant_h100"
                                  / "nvml.jsonl.gz") if fr.get("type") == "collect"]
    shift = sent[0] - float(frames[0]["time"])
    with gzip.open(job_dir / "nvml.jsonl.gz", "wt") as g:
        for fr in frames:
            if float(fr["time"]) + shift > sent[-1]:
                break
            fr["time"] = float(fr["time"]) + shift
            for e in fr.get("events") or []:
                if e["kind"] == events.GPU_PROCESSES.name:  # the loop's process, as NVML lists it
                    e["payload"] = [{"pid": pid, "name": "python3", "cmdline": "python3 train.py",
                                     "used_memory_bytes": 2 << 30, "rank": None, "local_rank": None,
                                     "world_size": None}]
            g.write(json.dumps(fr) + "\n")
    got = replay(job_dir, monkeypatch, tmp_path)
    assert got["nvml_frames"] > 10
    (row,) = got["full"]["ranks"]
    assert (row["rank"], row["node"], row["gpu"], row["pid"]) == (0, NODE, "0", pid)
    assert row["gpu_values"].get("perfd_gpu_utilization_ratio") is not None
