"""The aggregator's side of the integrations: `perfd aggregator --wandb-project` writes each job's
iterations to an offline W&B run (the aggregator and an agent in the test's process, tests/inproc.py;
read back with W&B's own reader, a process), and the k8s collector's GPU -> pod events are joined with
the NVML series by GPU UUID."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from perfd.aggregator.state import AggregatorState
from perfd.aggregator.wandb_sync import WandbSync, gpu_labels
from perfd.analytics.incidents.attribution import place_ranks
from perfd.analytics.run.run_summary import JobBlock, RunSummary
from perfd.analytics.steps.iteration import IterationResult
from perfd.app.commands.analyze import analyze_megatron_file
from perfd.exporters.wandb import iteration_metrics
from tests.cli_main import perfd
from tests.gates import Gate, GatedLock, joined, started
from tests.inproc import pipeline

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"




def _history(run_dir: Path) -> list[dict[str, Any]]:
    (wb,) = run_dir.glob("run-*.wandb")
    # TMPDIR: the wandb CLI writes its debug-cli.<user>.log there; in the test's folder, not in /tmp.
    res = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(wb)],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env={**os.environ, "TMPDIR": str(run_dir.parent)})
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


@pytest.mark.slow
def test_aggregator_logs_each_job_to_an_offline_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    wandb = pytest.importorskip("wandb", reason="wandb is the optional extra perfd[wandb] (in the dev extra)")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR", "WANDB_MODE"):
        # the exporter puts them under --wandb-dir, in this process's environment: set first so that
        # monkeypatch puts back what was there (or nothing) after the test, then unset
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    wandb_dir = tmp_path / "wandb-runs"
    try:
        with pipeline(tmp_path, "--no-rules", "--wandb-project", "perfd-e2e", "--wandb-dir", wandb_dir,
                      "--wandb-interval", "1") as p:
            p.agent("--job", "wb-job", "--megatron-log", DEMO_LOG, "--nvml", "off", "--host", "off")

            def seen() -> bool:
                jobs = p.json("/api/jobs")["jobs"]
                return bool(jobs) and jobs[0]["iterations_seen"] == 40
            p.wait(seen, 60, "the aggregator to see 40 iterations")
            # A round of the W&B task has run once the offline run exists (the rest comes at stop).
            p.wait(lambda: list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb")), 30, "the offline run")
            p.stop_agent()
        # the aggregator's stop (the pipeline's end) made the last W&B round and run.finish()
    finally:
        # the exporter's wandb.init started W&B's service in this process: ended with the test
        wandb.teardown()

    (run_dir,) = (p for p in (wandb_dir / "wandb").glob("offline-run-*") if p.is_dir())
    history = _history(run_dir)
    _, offline = analyze_megatron_file(str(DEMO_LOG), job="wb-job")
    want = list(offline.iterations)
    assert [h["_step"] for h in history] == [it.iteration for it in want] == list(range(1, 41))
    # the job's goodput and step budget, on the newest row
    goodput = ("perfd_job_goodput_ratio", "perfd_job_time_seconds_total", "perfd_job_step_budget")
    for h, it in zip(history, want, strict=True):
        assert {k: v for k, v in h.items() if not k.startswith(("_", *goodput))} == iteration_metrics(it)
    assert 0 < history[-1]["perfd_job_goodput_ratio"] <= 1
    assert "perfd_job_mfu_ratio" not in history[-1]  # no GPU named: MFU absent, not 0
    assert history[-1]["perfd_job_step_time_seconds"] == (want[-1].step_time_ms or 0.0) * 1e-3


class _RecordingExporter:
    def __init__(self) -> None:
        self.analyses: list[tuple[str, list[int]]] = []
        self.captures: list[str] = []
        self._last: dict[str, int] = {}

    def last_step(self, job: str) -> int | None:
        return self._last.get(job)

    def log_analysis(self, job: str, block: JobBlock, iterations: Sequence[IterationResult],
                     summary: RunSummary | None = None,
                     latest_extra: dict[str, float] | None = None,
                     extra_by_step: dict[int, dict[str, float]] | None = None) -> int:
        its = [it.iteration for it in iterations]
        self.analyses.append((job, its))
        self._last[job] = max(its)
        return len(its)

    def log_capture(self, job: str, capture: dict[str, Any]) -> str:
        self.captures.append(str(capture["id"]))
        return str(capture["id"])

    def finish(self, job: str | None = None) -> None:
        pass


def test_wandb_sync_sends_only_new_iterations_and_finished_captures_once():
    from perfd.collectors.megatron import parse_file

    parsed = parse_file(DEMO_LOG, job="j")
    state = AggregatorState(min_recompute_s=0.0)
    state.ingest_job_info("a1", "j", parsed.job_info)
    state.ingest_steps("a1", parsed.records[:10])
    exporter = _RecordingExporter()
    caps = [{"id": "c1", "job": "j", "status": "started"}]
    sync = WandbSync(state, exporter, lambda: caps, interval_s=1.0)  # type: ignore[arg-type]
    assert sync.sync_once() == 10
    assert sync.sync_once() == 0 and exporter.captures == []
    state.ingest_steps("a1", parsed.records[10:])
    caps[0]["status"] = "finished"
    assert sync.sync_once() == 30
    sync.sync_once()
    assert exporter.analyses == [("j", list(range(1, 11))), ("j", list(range(11, 41)))]
    assert exporter.captures == ["c1"]


@dataclass
class _RoundInFlight:
    """A W&B task whose round on the thread named ``round`` has read the job's 10 iterations and waits,
    holding the round lock, until ``publish_gate`` lets it log them; the other 30 then arrive. Who else
    comes to the round lock is seen at ``lock_gate``; ``calls`` is what reached the exporter."""

    sync: WandbSync
    state: AggregatorState
    calls: list[str]
    publish_gate: Gate
    lock_gate: Gate
    thread: threading.Thread


def _round_in_flight() -> _RoundInFlight:
    from perfd.collectors.megatron import parse_file

    parsed = parse_file(DEMO_LOG, job="j")
    state = AggregatorState(min_recompute_s=0.0)
    state.ingest_steps("a1", parsed.records[:10])
    calls: list[str] = []

    class Exporter(_RecordingExporter):
        def log_analysis(self, job: str, block: JobBlock, iterations: Sequence[IterationResult],
                         *args: Any, **kw: Any) -> int:
            its = [it.iteration for it in iterations if (self.last_step(job) or 0) < it.iteration]
            calls.append(f"log {min(its)}-{max(its)}" if its else "log none")
            return super().log_analysis(job, block, iterations, *args, **kw)

        def finish(self, job: str | None = None) -> None:
            calls.append("finish" if job is None else f"finish {job}")

    publish_gate, lock_gate = Gate(), Gate()
    sync = WandbSync(state, Exporter(), interval_s=1.0)  # type: ignore[arg-type]
    publish = sync.sink.publish

    def gated_publish(snap: Any) -> int:
        if threading.current_thread().name == "round":
            publish_gate.pass_through()  # the round has read its snapshot: 10 iterations
        return publish(snap)

    sync.sink.publish = gated_publish  # type: ignore[method-assign,assignment]
    sync._round_lock = GatedLock(lock_gate)  # type: ignore[assignment]
    lock_gate.open("round")
    thread = started("round", sync.sync_once, {})
    publish_gate.wait_arrived("round")
    state.ingest_steps("a1", parsed.records[10:])  # more arrives meanwhile
    return _RoundInFlight(sync, state, calls, publish_gate, lock_gate, thread)


def test_wandb_stop_waits_for_the_round_in_flight_and_no_round_follows_it():
    """A round runs on a worker thread, which the stop's cancelling of its task does not end: the last
    round waits for it, the runs are finished after both, and a round begun after logs nothing. (A last
    round run beside it logged all 40 and finished the runs; the round in flight then logged to a
    finished run.)"""
    r = _round_in_flight()

    def stopping() -> None:  # the aggregator's stop: its worker threads named stop_N
        with asyncio.Runner() as runner:
            runner.get_loop().set_default_executor(ThreadPoolExecutor(1, thread_name_prefix="stop"))
            runner.run(r.sync.close())

    stop = started("stop", stopping, {})
    r.lock_gate.wait_arrived("stop_0")  # the last round comes to the round lock, held by the one in flight
    r.lock_gate.open("stop_0")
    r.publish_gate.open("round")
    joined(r.thread)
    joined(stop)
    assert r.calls == ["log 1-10", "log 11-40", "finish"]
    r.lock_gate.open("MainThread")
    assert r.sync.sync_once() == 0 and r.calls[-1] == "finish"  # a round begun after the stop: nothing


def test_a_pruned_jobs_run_is_finished_after_the_round_in_flight():
    """The job pruned while a round that read it is in flight: its run is finished after that round
    logged (finished before, the round's log made it a second run that no stop finished)."""
    r = _round_in_flight()
    prune = started("prune", lambda: r.sync.finish_job("j"), {})
    r.lock_gate.wait_arrived("prune")
    r.lock_gate.open("prune")
    r.publish_gate.open("round")
    joined(r.thread)
    joined(prune)
    assert r.calls == ["log 1-10", "finish j"]


def test_gpu_pods_join_nvml_series_by_uuid():
    state = AggregatorState()
    uuid0, uuid1 = "GPU-aaaa", "GPU-bbbb"
    defs = {1: ("perfd_gpu_memory_total_bytes", (("gpu", "0"), ("model", "NVIDIA H100"), ("node", "n1"),
                                                 ("uuid", uuid0))),
            2: ("perfd_gpu_memory_total_bytes", (("gpu", "1"), ("model", "NVIDIA H100"), ("node", "n1"),
                                                 ("uuid", uuid1)))}
    state.ingest_samples("n1", defs, [1, 2], [1, 1], [80e9, 80e9])
    pod = {"device": uuid1, "uuid": uuid1, "namespace": "ml", "pod": "train-0", "container": "trainer",
           "resource": "nvidia.com/gpu"}
    by_index = {"device": "0", "gpu": "0", "namespace": "ml", "pod": "other", "container": "c",
                "resource": "nvidia.com/gpu"}
    state.ingest_events("n1", [{"kind": "gpu_pods", "labels": {"node": "n1"}, "payload": [pod]},
                               {"kind": "gpu_pods", "labels": {"node": "n2"}, "payload": [by_index]}])
    assert state.pods_by_gpu() == {("n1", "1"): pod, ("n2", "0"): by_index}
    assert state.recent_events() == []  # state, not history
    # A newer allocation replaces the node's previous one.
    state.ingest_events("n1", [{"kind": "gpu_pods", "labels": {"node": "n1"}, "payload": []}])
    assert state.pods_by_gpu() == {("n2", "0"): by_index}


def test_wandb_project_without_wandb_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the wandb package (hidden here as an absent module) the aggregator refuses to start
    with one line and exit 2, instead of starting and logging a traceback every export round. The
    command runs by the CLI's main() in the test's process; were it not refused, its start raises
    instead of serving."""
    from perfd.aggregator.daemon import Aggregator

    async def no_start(self: Aggregator) -> None:
        raise AssertionError("the aggregator started: no refusal")

    monkeypatch.setattr(Aggregator, "start", no_start)
    monkeypatch.setitem(sys.modules, "wandb", None)
    r = perfd(capsys, "aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules",
              "--ready-file", tmp_path / "ready", "--wandb-project", "p")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("perfd aggregator: --wandb-project needs the wandb package, which is not "
                                "installed: pip install 'perfd[wandb]' (or drop --wandb-project)")
    assert not (tmp_path / "ready").exists()


class _GpuViewState:
    """gpu_view as AggregatorState gives it: rank 0's process on node-a GPU 0; GPU 1 busy with no
    process whose environment could be read; node-b GPU 0 with values and no process list."""

    def gpu_view(self, job: str) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
        procs = {("node-a", "0"): [{"pid": 10, "rank": 0, "local_rank": 0, "world_size": 1}],
                 ("node-a", "1"): [{"pid": 11, "rank": None}]}
        values = {("node-a", "0"): {"perfd_gpu_power_watts": 300.0},
                  ("node-a", "1"): {"perfd_gpu_power_watts": 120.0},
                  ("node-b", "0"): {"perfd_gpu_power_watts": 90.0}}
        return procs, values, {}


def test_wandb_gets_gpu_keys_for_gpus_without_rank_placement() -> None:
    from perfd.exporters.wandb import node_metrics

    procs, values, _ = _GpuViewState().gpu_view("j")
    assert node_metrics(gpu_labels(place_ranks(procs, job="j"), values)) == {
        "perfd_gpu_power_watts/rank=0": 300.0,
        "perfd_gpu_power_watts/node=node-a,gpu=1": 120.0,
        "perfd_gpu_power_watts/node=node-b,gpu=0": 90.0}
