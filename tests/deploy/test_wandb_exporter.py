"""W&B export: a real offline run written by the exporter, read back from its .wandb file.

The reader is W&B's own offline one (`wandb leet inspect --json RUN.wandb`, shipped with the
wandb package; no server, no network): every history row, the run's config and the capture
artifact are compared with the analysis they came from.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.run.run_summary import JobBlock, JobLayout, RunSummary
from perfd.analytics.steps.goodput import Goodput
from perfd.analytics.steps.iteration import IterationResult
from perfd.collectors.megatron import parse_file
from perfd.core import catalog
from perfd.exporters.wandb import (
    WandbExporter,
    budget_metrics,
    capture_rows,
    goodput_metrics,
    iteration_metrics,
    node_metrics,
    summary_metrics,
)
from perfd.report.bottleneck_text import class_reason
from perfd.report.row_json import run_json
from tests.cli_main import perfd
from tests.inproc import pipeline

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
DP2_LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"  # per-rank timers, no PP


def _analysis(path: Path, job: str) -> RunAnalysis:
    parsed = parse_file(path, job=job)
    return analyze_run(parsed.job_info, parsed.records, gpu_name="NVIDIA H200")


@functools.cache
def _demo_summary() -> RunSummary:
    return _analysis(DEMO_LOG, "summary").summary


def _summary(**kw: Any) -> RunSummary:
    """A run summary holding only the class, the steady count and what ``kw`` gives."""
    bare: dict[str, Any] = {"medians": {}, "goodput": None, "step_budget": None,
                            "steady_first_iteration": None, "steady_last_iteration": None}
    return dataclasses.replace(_demo_summary(), **{**bare, **kw})


def _its(*iterations: int, **values: Any) -> list[IterationResult]:
    return [IterationResult(iteration=i, **values) for i in iterations]


def _expected(it: dict[str, Any]) -> dict[str, float]:
    out = {}
    for m in catalog.job_metrics(catalog.WANDB):
        v = it.get(m.attr or "")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[m.name] = float(v) * m.scale
    for rank, ratio in (it.get("straggler_rank_compute_ratio") or {}).items():
        out[f"perfd_job_rank_compute_ratio/rank={rank}"] = float(ratio)
    return out


# ---- pure parts (no wandb needed) --------------------------------------------------------------

class _FakeRun:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.summary: dict[str, Any] = {}
        self.config_updates: list[dict[str, Any]] = []
        self.config = self
        self.dir = "/nowhere/files"

    def update(self, cfg: dict[str, Any], allow_val_change: bool = False) -> None:
        self.config_updates.append(cfg)

    def log(self, values: dict[str, float], step: int, commit: bool | None = None) -> None:
        assert commit is True  # each row goes out when written, never held for the next
        self.rows.append((step, values))

    def finish(self) -> None:
        pass


class _FakeWandb:
    def __init__(self) -> None:
        self.runs: list[_FakeRun] = []

    def Settings(self, **kw: Any) -> dict[str, Any]:  # wandb's name
        return kw

    def init(self, **kw: Any) -> _FakeRun:
        run = _FakeRun()
        self.runs.append(run)
        return run


def test_absent_values_are_not_logged_and_ranks_are_sections():
    it = IterationResult(iteration=7, step_time_ms=250.0, mfu=None, lm_loss=float("nan"),
                         tflops_check_ok=True, straggler_rank_compute_ratio={3: 1.2})
    assert iteration_metrics(it) == {"perfd_job_iteration": 7.0, "perfd_job_step_time_seconds": 0.25,
                                     "perfd_job_rank_compute_ratio/rank=3": 1.2}
    summary = _summary(medians={"mfu": 0.4, "data_share": None})
    assert summary_metrics(summary) == {
        "steady/perfd_job_mfu_ratio": 0.4, "bottleneck": summary.bottleneck.cls.value,
        "bottleneck_reason": class_reason(summary.bottleneck), "n_steady": summary.n_steady}


def test_goodput_goes_to_the_summary_and_the_newest_row():
    gp = Goodput(wall_s=10.0, parts={"training": 7.0, "incident": 1.0, "startup": 2.0}, start_time=0.0,
                 end_time=10.0, runs=1)
    assert goodput_metrics(gp) == {
        "perfd_job_goodput_ratio": 0.7, "perfd_job_time_seconds_total/kind=training": 7.0,
        "perfd_job_time_seconds_total/kind=incident": 1.0, "perfd_job_time_seconds_total/kind=startup": 2.0}
    summary = _summary(goodput=gp)
    assert summary_metrics(summary) == {**goodput_metrics(gp), "bottleneck": summary.bottleneck.cls.value,
                                        "bottleneck_reason": class_reason(summary.bottleneck),
                                        "n_steady": summary.n_steady}
    fake = _FakeWandb()
    ex = WandbExporter("p", wandb_module=fake)
    ex.log_analysis("j", JobBlock(), _its(1, 2, step_time_ms=100.0), summary)
    (_s1, r1), (_s2, r2) = fake.runs[0].rows
    assert "perfd_job_goodput_ratio" not in r1 and r2["perfd_job_goodput_ratio"] == 0.7
    assert fake.runs[0].summary["perfd_job_time_seconds_total/kind=incident"] == 1.0


def test_each_iteration_is_logged_once_in_order():
    fake = _FakeWandb()
    ex = WandbExporter("p", wandb_module=fake)
    its = [IterationResult(iteration=i, step_time_ms=100.0 + i) for i in (1, 2, 3)]
    block = JobBlock()
    assert ex.log_analysis("j", block, its[:2]) == 2
    assert ex.log_analysis("j", block, list(reversed(its))) == 1
    assert ex.log_analysis("j", block, its) == 0
    late = IterationResult(iteration=2, step_time_ms=999.0)  # older than the last logged: steps go forward
    assert ex.log_analysis("j", block, [late]) == 0
    assert [s for s, _ in fake.runs[0].rows] == [1, 2, 3]
    # Job info learned later updates the run's config, once.
    tp2 = JobBlock(layout=JobLayout(tp=2))
    ex.log_analysis("j", tp2, [])
    ex.log_analysis("j", tp2, [])
    assert [u["layout"]["tp"] for u in fake.runs[0].config_updates] == [2]
    assert len(fake.runs) == 1 and ex.last_step("j") == 3


def test_rows_carry_the_iteration_time_and_the_newest_the_gpu_values():
    fake = _FakeWandb()
    ex = WandbExporter("p", wandb_module=fake)
    its = [IterationResult(iteration=i, step_time_ms=100.0, end_time=1_800_000_000.0 + i) for i in (1, 2)]
    gpus = node_metrics({"rank=0": {"perfd_gpu_sm_util_ratio": 0.46, "perfd_gpu_power_watts": 650.0,
                                    "perfd_gpu_ecc_errors_total": 0.0}})
    assert gpus == {"perfd_gpu_sm_util_ratio/rank=0": 0.46, "perfd_gpu_power_watts/rank=0": 650.0}
    ex.log_analysis("j", JobBlock(), its, latest_extra=gpus)
    (_s1, r1), (_s2, r2) = fake.runs[0].rows
    assert r1["_timestamp"] == 1_800_000_001.0 and "perfd_gpu_sm_util_ratio/rank=0" not in r1
    assert r2["_timestamp"] == 1_800_000_002.0 and r2["perfd_gpu_power_watts/rank=0"] == 650.0


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        WandbExporter("p", mode="cloud")


# ---- a real offline run ------------------------------------------------------------------------

def _read_offline_run(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the run's transaction log, through W&B's own offline reader."""
    files = sorted(run_dir.glob("run-*.wandb"))
    assert len(files) == 1, f"expected one run-*.wandb in {run_dir}: {files}"
    wandb_cli = Path(sys.executable).parent / "wandb"
    # TMPDIR: the wandb CLI writes its debug-cli.<user>.log there; in the test's folder, not in /tmp.
    res = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(files[0])],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env={**os.environ, "TMPDIR": str(run_dir.parent)})
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    wandb = pytest.importorskip("wandb", reason="wandb is the optional extra perfd[wandb] (in the dev extra)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                     ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    yield tmp_path
    # wandb.init in this process started its service (wandb-core), which stays for the life of the
    # process otherwise: the leftover-process guard named it at the end of a full run
    wandb.teardown()


@pytest.mark.slow
def test_offline_run_reads_back_equal_to_the_analysis(wandb_env: Path):
    typed = {"gpt-demo": _analysis(DEMO_LOG, "gpt-demo"), "dp2": _analysis(DP2_LOG, "dp2")}
    demo_its, dp2_its = list(typed["gpt-demo"].iterations), list(typed["dp2"].iterations)
    demo, dp2 = run_json(typed["gpt-demo"]), run_json(typed["dp2"])
    assert len(demo["iterations"]) > 20
    ex = WandbExporter("perfd-test", mode="offline", directory=str(wandb_env / "runs"))
    # The aggregator calls this every few seconds with the analysis so far: half, then all, twice.
    half = len(demo["iterations"]) // 2
    block, summary = typed["gpt-demo"].job, typed["gpt-demo"].summary
    assert ex.log_analysis("gpt-demo", block, demo_its[:half]) == half
    assert ex.log_analysis("gpt-demo", block, demo_its, summary) == len(demo["iterations"]) - half
    assert ex.log_analysis("gpt-demo", block, demo_its, summary) == 0
    assert ex.log_analysis("dp2", typed["dp2"].job, dp2_its, typed["dp2"].summary) == len(dp2["iterations"])
    capture = {"id": "cap-0001", "job": "gpt-demo", "tool": "nsys", "status": "finished", "ranks": [1],
               "steps": 3, "result": {"iterations": [30, 32], "breakdown": {"compute": 0.71, "idle": 0.2}}}
    assert ex.log_capture("gpt-demo", capture) == "capture-cap-0001"
    assert ex.log_capture("gpt-demo", capture) is None  # attached once
    run_dirs = {job: Path(d) for job in ("gpt-demo", "dp2") if (d := ex.run_dir(job))}
    ex.finish()

    for job, analysis in (("gpt-demo", demo), ("dp2", dp2)):
        records = _read_offline_run(run_dirs[job])
        run = next(r["run"] for r in records if r["type"] == "run")
        assert run["display_name"] == job and run["project"] == "perfd-test"
        config = run["config"]["update"]
        assert config["job"] == job
        assert config["layout"] == analysis["job"]["layout"]
        assert config["model"] == analysis["job"]["model"]
        assert config["gpu"]["name"] == "NVIDIA H200"
        history = [r["history"]["item"] for r in records if r["type"] == "history"]
        steps = [h["_step"] for h in history]
        assert steps == [it["iteration"] for it in analysis["iterations"]], "each iteration once, in order"
        for n, (h, it) in enumerate(zip(history, analysis["iterations"], strict=True)):
            logged = {k: v for k, v in h.items() if not k.startswith("_")}
            # the newest row of each log_analysis call also carries the job's goodput so far and its
            # step budget (one key per part: seconds per step and share)
            goodput = {k: logged.pop(k) for k in list(logged) if k.startswith(("perfd_job_goodput",
                                                                              "perfd_job_time_seconds"))}
            budget = {k: logged.pop(k) for k in list(logged) if k.startswith("perfd_job_step_budget")}
            assert logged == _expected(it), f"{job} iteration {it['iteration']}"
            if n == len(history) - 1:
                assert goodput == goodput_metrics(typed[job].summary.goodput) and goodput
                assert budget == budget_metrics(typed[job].summary.step_budget) and budget
                parts = {p["part"]: p for p in analysis["summary"]["step_budget"]["parts"]}
                assert budget[f"perfd_job_step_budget_seconds/part={next(iter(parts))}"] == \
                    next(iter(parts.values()))["ms"] / 1e3
                assert abs(sum(v for k, v in budget.items() if "ratio" in k) - 1.0) < 1e-9
            assert h["_timestamp"] == it["end_time"], "the row's time is the iteration's own"
        summaries: dict[str, Any] = {}
        for r in records:
            if r["type"] == "summary":
                summaries.update(r["summary"].get("update") or {})
        medians = analysis["summary"]["medians"]
        assert medians["mfu"] is not None
        assert summaries["steady/perfd_job_mfu_ratio"] == medians["mfu"]
        assert summaries["bottleneck"] == analysis["summary"]["bottleneck"]

    # What the fixtures exercise: per-rank ratios (dp2), and metrics absent for a job (no PP in dp2).
    dp2_keys = {k for it in dp2["iterations"] for k in _expected(it)}
    assert any(k.startswith("perfd_job_rank_compute_ratio/rank=") for k in dp2_keys)
    assert "perfd_job_pp_stage_idle_max_ratio" not in dp2_keys
    assert "perfd_job_pp_stage_idle_max_ratio" in {k for it in demo["iterations"] for k in _expected(it)}

    # The capture: an artifact of the run, with the report as a table and the raw JSON.
    records = _read_offline_run(run_dirs["gpt-demo"])
    arts = [r["artifact"] for r in records if r["type"] == "artifact"]
    assert [(a["name"], a["type"]) for a in arts] == [("capture-cap-0001", "perfd-capture")]
    entries = {e["path"]: Path(e["local_path"]) for e in arts[0]["manifest"]["contents"]}
    assert set(entries) == {"capture.json", "report.table.json"}
    for p in entries.values():  # staged under our directory, not in a home directory
        assert str(p).startswith(str(wandb_env)), p
    assert json.loads(entries["capture.json"].read_text()) == capture
    table = json.loads(entries["report.table.json"].read_text())
    assert table["columns"] == ["key", "value"]
    assert table["data"] == capture_rows(capture)
    assert ["result.breakdown.compute", "0.71"] in table["data"]


@pytest.mark.slow
def test_attaches_to_the_training_scripts_own_run(wandb_env: Path) -> None:
    """`perfd launch --wandb-run-id` exports WANDB_RUN_ID (+ WANDB_RESUME=allow) to the job; the
    training script's wandb.init takes it, and perfd's export joins the same run id with its keys
    under perfd/ against perfd/iteration (never step=, which belongs to the script). Offline, the two
    writers leave two transaction logs of one run id (`wandb sync` uploads both into that run)."""
    rid = "trainrun42"
    script = ("import wandb\nrun = wandb.init(project='perfd-test')\n"
              "[run.log({'loss': 1.0 / (i + 1)}, step=i) for i in range(1, 4)]\n"
              "print(run.id)\nrun.finish()\n")
    env = {**os.environ, "WANDB_RUN_ID": rid, "WANDB_RESUME": "allow",
           "WANDB_DIR": str(wandb_env / "train")}
    (wandb_env / "train").mkdir()
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == rid, proc.stderr[-2000:]

    typed = _analysis(DEMO_LOG, "gpt-demo")
    demo = run_json(typed)
    # what the launch manifest gives the agent, the agent the job info
    block = dataclasses.replace(typed.job, wandb_run_id=rid)
    ex = WandbExporter("perfd-test", mode="offline", directory=str(wandb_env / "perfd"))
    assert ex.log_analysis("gpt-demo", block, list(typed.iterations), typed.summary) == len(typed.iterations)
    run_dir = Path(ex.run_dir("gpt-demo") or "")
    ex.finish()
    assert run_dir.name.endswith(f"-{rid}")
    trained = list((wandb_env / "train").rglob(f"run-{rid}.wandb"))
    assert len(trained) == 1, "the training script's own run under the same id"
    records = _read_offline_run(run_dir)
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_id"] == rid
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["perfd/iteration"] for h in history] == [float(it["iteration"]) for it in demo["iterations"]]
    first = {k: v for k, v in history[0].items() if not k.startswith("_") and k != "perfd/iteration"}
    assert first and all(k.startswith("perfd/") for k in first)
    assert first == {f"perfd/{k}": v for k, v in _expected(demo["iterations"][0]).items()}


# ---- in the aggregator ---------------------------------------------------------------------------

def test_every_row_carries_the_gpu_values_of_when_its_iteration_arrived() -> None:
    """The aggregator's W&B task (once GPU keys on 3 of 40 rows, the newest of each round): the
    job steps in three stretches, its GPU's power differs in each, the task samples between them as
    its run loop does, and one export round then writes every iteration with the power of its own
    stretch; iterations that arrived after the last sample get the values of the round."""
    from perfd.aggregator.state import AggregatorState
    from perfd.aggregator.wandb_sync import WandbSync

    st = AggregatorState(gpu_override="NVIDIA H200", min_recompute_s=0.0)
    parsed = parse_file(DEMO_LOG, job="gpt")
    st.hello("n1/gpt", ["gpt"])
    st.ingest_job_info("n1/gpt", "gpt", parsed.job_info)
    st.ingest_events("n1/node", [{"kind": "gpu_processes", "labels": {"node": "n1", "gpu": "0"},
                                  "payload": [{"pid": 7, "rank": 0, "world_size": 2, "job": "gpt"}]}])
    power = ("perfd_gpu_power_watts", (("gpu", "0"), ("node", "n1")))
    records = sorted(parsed.records, key=lambda r: r.iteration)
    thirds = [records[: len(records) // 3], records[len(records) // 3: 2 * len(records) // 3],
              records[2 * len(records) // 3:]]
    fake = _FakeWandb()
    sync = WandbSync(st, WandbExporter("p", wandb_module=fake))
    watts = (300.0, 500.0, 700.0)
    for n, (part, w) in enumerate(zip(thirds, watts, strict=True)):
        st.ingest_samples("n1/node", {1: power}, [1], [n + 1], [w])
        st.ingest_steps("n1/gpt", part)
        if n < 2:
            sync.sample_gpus()  # the run loop samples while the job steps; the last stretch: not yet
    sync.sample_gpus()
    st.ingest_samples("n1/node", {1: power}, [1], [9], [900.0])  # the values at the export round
    assert sync.sync_once(force=True) > 0
    rows = dict(fake.runs[0].rows)
    key = "perfd_gpu_power_watts/rank=0"
    assert all(key in values for values in rows.values()), "every row has the GPU's keys"
    by_stretch = [{rows[r.iteration][key] for r in part if r.iteration in rows} for part in thirds]
    assert by_stretch == [{300.0}, {500.0}, {700.0}]
    # Steps after the last sample: the values of the round.
    # (their lines say the run goes on: past the log's train-iters they would be refused, jobs.py)
    last = records[-1].iteration
    st.ingest_steps("n1/gpt", [dataclasses.replace(records[-1], iteration=last + k, train_iters=last + 10)
                               for k in (1, 2)])
    assert sync.sync_once(force=True) == 2
    assert [v[key] for _s, v in fake.runs[0].rows[-2:]] == [900.0, 900.0]


def test_an_unwritable_wandb_directory_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--wandb-project under a working directory W&B cannot write (the chart's read-only root
    filesystem; here a file where the runs' folder would go, which stops root too): exit 2 at start
    with one line naming the directory and --wandb-dir, never a traceback per export round. With
    --state-dir the runs go under it, and the aggregator starts. The refusals by the CLI's main() in
    the test's process (were one not refused, its start raises instead of serving); the start a
    pipeline() (tests/inproc.py) with the same arguments."""
    pytest.importorskip("wandb", reason="wandb is the optional extra perfd[wandb] (in the dev extra)")
    from perfd.aggregator.daemon import Aggregator

    (tmp_path / "perfd-wandb").write_text("in the way\n")
    monkeypatch.chdir(tmp_path)
    args = ("aggregator", "--grpc-port", "0", "--http-port", "0", "--no-rules", "--wandb-project", "p")
    with monkeypatch.context() as m:
        async def no_start(self: Aggregator) -> None:
            raise AssertionError("the aggregator started: no refusal")

        m.setattr(Aggregator, "start", no_start)
        r = perfd(capsys, *args)
        assert r.returncode == 2, r.stderr
        assert f"cannot write W&B runs under {tmp_path / 'perfd-wandb'}" in r.stderr
        assert "--wandb-dir DIR" in r.stderr and "Traceback" not in r.stderr
        r = perfd(capsys, *args, "--wandb-dir", tmp_path / "perfd-wandb" / "sub")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    with pipeline(tmp_path, *args[1:], "--state-dir", tmp_path / "state") as p:
        assert p.json("/api/jobs")["jobs"] == [] and (tmp_path / "state" / "wandb").is_dir()
