"""Weights & Biases export: one W&B run per job, one history row per analysed iteration.

Knows nothing of collectors: it is handed the typed parts of a run analysis (the ``JobBlock``, the
``IterationResult`` rows, the ``RunSummary``) and logs them with ``wandb.log({...}, step=iteration)``
under the catalog's names (perfd.analytics.steps.iteration.job_values: each value through
catalog.in_unit, as the Prometheus exporter reads its column), so a W&B chart and a Prometheus query
of one metric show the same number. Rules kept here:

- an iteration is logged once per run: only iterations above the last one logged go out, in order
  (W&B steps only go forward, so a record arriving after a later iteration was logged is left out);
- an absent value (None, NaN, a bool) is not logged at all, never as 0;
- ``log_capture`` attaches a capture report as a W&B artifact (type ``perfd-capture``) holding the
  report as a ``wandb.Table`` and the raw JSON;
- every row is committed when written (the newest iteration does not wait for the next), its
  ``_timestamp`` is the iteration's own end time, and each row carries the job's GPU and host
  values as they were when its iteration arrived (``perfd_gpu_*/rank=N``, or
  ``perfd_gpu_*/node=X,gpu=I`` for a GPU no rank is placed on; the aggregator's W&B task samples
  them, perfd.aggregator.wandb_sync) for the node metrics the catalog shows in W&B;
- ``mode="offline"`` (the default) writes the run under ``directory`` and needs no server; upload
  later with ``wandb sync DIR/wandb/offline-run-*``. Without a directory: under the aggregator's
  state dir, else ./perfd-wandb (:func:`default_directory`); one that cannot be written is refused at
  start (:func:`directory_problem`), not found out at every export round.

``wandb`` is an optional dependency (``pip install 'perfd[wandb]'``), imported on first use.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.breakdown.budget import StepBudget
from perfd.analytics.breakdown.budget import metric_rows as budget_rows
from perfd.analytics.run.run_summary import JobBlock, RunSummary
from perfd.analytics.steps.goodput import Goodput
from perfd.analytics.steps.iteration import IterationResult, job_values
from perfd.core import catalog
from perfd.report.bottleneck_text import class_reason
from perfd.report.row_json import job_json

log = logging.getLogger(__name__)

RANK_RATIO = "perfd_job_rank_compute_ratio"
# Keys of the job block's JSON as served (perfd.report.row_json.job_json: its codes worded, W&B's
# config being an edge) that become the run's config (what the job is).
CONFIG_KEYS = ("framework", "framework_version", "torch_version", "layout", "model", "gpu",
               "flops_per_iteration", "flops_formula", "timing_log_option", "log_interval")
MODES = ("offline", "online", "disabled")
# In the training script's own run, perfd's keys live under this prefix, against this x axis.
ATTACHED_PREFIX = "perfd/"
ATTACHED_STEP = "perfd/iteration"


def default_directory(state_dir: str | None) -> str:
    """Where runs go without --wandb-dir: under the aggregator's state dir when it has one (written
    and kept: a volume), else ./perfd-wandb."""
    return os.path.join(state_dir, "wandb") if state_dir else os.path.join(os.getcwd(), "perfd-wandb")


def directory_problem(path: str) -> str | None:
    """Why W&B runs cannot be written under ``path`` (None: they can): it is made if missing, and a
    file is written there and removed, as W&B will (a read-only root filesystem, a file in the way)."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".perfd-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def iteration_metrics(it: IterationResult) -> dict[str, float]:
    """Catalog name -> value for one iteration; absent values are left out. Per-rank compute
    ratios become ``perfd_job_rank_compute_ratio/rank=N`` (a W&B section)."""
    out = job_values(it, catalog.WANDB)
    for rank, ratio in it.straggler_rank_compute_ratio.items():
        v = _number(ratio)
        if v is not None:
            out[f"{RANK_RATIO}/rank={rank}"] = v
    return out


def node_metrics(gpus: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{rank or node label: {catalog name: value}} -> W&B keys ``<name>/<label>`` for the node
    metrics the catalog shows in W&B (GPU utilisation, SM/tensor/DRAM, power, clocks, host CPU)."""
    shown = {m.name for m in catalog.all_metrics() if catalog.WANDB in m.shows and not m.attr}
    out: dict[str, float] = {}
    for label, values in gpus.items():
        for name, v in values.items():
            x = _number(v)
            if name in shown and x is not None:
                out[f"{name}/{label}"] = x
    return out


def goodput_metrics(gp: Goodput | None) -> dict[str, float]:
    """The job's goodput (perfd.analytics.steps.goodput) under the catalog's names: the ratio, and the
    seconds of each kind as ``perfd_job_time_seconds_total/kind=K`` (a W&B section)."""
    if gp is None:
        return {}
    out: dict[str, float] = {}
    ratio = _number(gp.ratio)
    if ratio is not None:
        out[catalog.GOODPUT_RATIO] = ratio
    for kind, secs in gp.parts.items():
        v = _number(secs)
        if v is not None:
            out[f"{catalog.JOB_TIME}/kind={kind}"] = v
    return out


def budget_metrics(budget: StepBudget | None) -> dict[str, float]:
    """The step budget (perfd.analytics.breakdown.budget) under the catalog's names, a W&B section each:
    ``perfd_job_step_budget_seconds/part=P`` and ``perfd_job_step_budget_ratio/part=P``."""
    out: dict[str, float] = {}
    for labels, name, value in budget_rows("", budget, catalog.STEP_BUDGET_SECONDS,
                                           catalog.STEP_BUDGET_RATIO):
        out[f"{name}/part={labels['part']}"] = value
    return out


def summary_metrics(summary: RunSummary) -> dict[str, Any]:
    """The run summary: steady-state medians under ``steady/<catalog name>``, the bottleneck, and
    the goodput and step budget (:func:`goodput_metrics`, :func:`budget_metrics`)."""
    out: dict[str, Any] = {**goodput_metrics(summary.goodput), **budget_metrics(summary.step_budget)}
    steady = catalog.median_values(summary.medians, catalog.WANDB)
    out.update({f"steady/{name}": v for name, v in steady.items()})
    bottleneck = summary.bottleneck
    for key, v in (("bottleneck", bottleneck.cls.value), ("bottleneck_reason", class_reason(bottleneck)),
                   ("n_steady", summary.n_steady), ("steady_first_iteration", summary.steady_first_iteration),
                   ("steady_last_iteration", summary.steady_last_iteration)):
        if v is not None:
            out[key] = v
    return out


def job_config(job: str, block: JobBlock | None) -> dict[str, Any]:
    """W&B config of a job's run: its name and what the analysis knows of layout, model and GPU
    (the block's JSON: the config is what W&B is handed). No block (a capture attached before any
    analysis): the name alone."""
    cfg: dict[str, Any] = {"job": job}
    doc = job_json(block) if block is not None else {}
    for key in CONFIG_KEYS:
        if doc.get(key) is not None:
            cfg[key] = doc[key]
    return cfg


def capture_rows(capture: Mapping[str, Any], prefix: str = "") -> list[list[str]]:
    """A capture report flattened to (key, value) rows: dotted keys, JSON text for leaves."""
    rows: list[list[str]] = []
    for key, value in capture.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows.extend(capture_rows(value, path + "."))
        else:
            rows.append([path, json.dumps(value, default=str)
                         if not isinstance(value, str) else value])
    return rows


@dataclass
class _JobRun:
    run: Any
    config: dict[str, Any]
    attached: bool = False  # the training script's own run: perfd's keys under perfd/, own x axis
    last_step: int | None = None
    logged: int = 0
    captures: set[str] = field(default_factory=set)


class WandbExporter:
    """One W&B run per job. Thread-safe: one lock around every W&B call of this exporter."""

    def __init__(self, project: str, mode: str = "offline", directory: str | None = None,
                 entity: str | None = None, wandb_module: Any = None) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb mode must be one of {MODES}, got {mode!r}")
        self.project = project
        self.mode = mode
        self.directory = os.path.abspath(directory or default_directory(None))
        self.entity = entity
        self._wandb = wandb_module
        self._runs: dict[str, _JobRun] = {}
        self._lock = threading.Lock()

    # ---- set-up --------------------------------------------------------------------------------
    def _module(self) -> Any:
        if self._wandb is None:
            os.makedirs(self.directory, exist_ok=True)
            # Everything W&B writes (artifact staging, cache, settings) stays under our directory:
            # the aggregator may run with a read-only root filesystem and no home directory.
            for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                             ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")):
                os.environ.setdefault(var, os.path.join(self.directory, sub))
            # W&B makes two temporary folders when imported (media, artifact staging), removed by
            # atexit handlers: the aggregator ends with os._exit (perfd.aggregator.daemon), which runs
            # none, so they were left in /tmp at every stop. Made under our directory instead (the
            # default temporary folder is changed for the import only).
            tmp = os.path.join(self.directory, "tmp")
            os.makedirs(tmp, exist_ok=True)
            saved, tempfile.tempdir = tempfile.tempdir, tmp
            try:
                self._wandb = importlib.import_module("wandb")
            finally:
                tempfile.tempdir = saved
        return self._wandb

    def _run(self, job: str, block: JobBlock | None) -> _JobRun:
        jr = self._runs.get(job)
        cfg = job_config(job, block)
        if jr is None:
            wandb = self._module()
            settings = wandb.Settings(mode=self.mode, silent=True, console="off", x_disable_stats=True,
                                      save_code=False, disable_git=True, x_save_requirements=False)
            rid = block.wandb_run_id if block is not None else None
            if rid:
                # The training script's run (perfd launch --wandb-run-id): join it. Its own step
                # counter belongs to the script, so perfd logs under perfd/ against its own x axis
                # (perfd/iteration) and never passes step= (W&B drops steps that go backwards).
                run = wandb.init(project=self.project, entity=self.entity, id=rid, resume="allow",
                                 dir=self.directory, reinit="create_new", settings=settings)
                run.config.update({f"perfd/{k}": v for k, v in cfg.items()}, allow_val_change=True)
                run.define_metric(ATTACHED_STEP)
                run.define_metric(f"{ATTACHED_PREFIX}*", step_metric=ATTACHED_STEP)
                jr = self._runs[job] = _JobRun(run, cfg, attached=True)
            else:
                run = wandb.init(project=self.project, entity=self.entity, name=job, dir=self.directory,
                                 config=cfg, job_type="perfd", reinit="create_new", settings=settings)
                jr = self._runs[job] = _JobRun(run, cfg)
            where = str(getattr(run, "dir", self.directory)).removesuffix("/files")
            url = getattr(run, "url", None) if self.mode == "online" else None
            log.warning("wandb: job %s -> run %s at %s%s", job, getattr(run, "id", "?"), url or where,
                        f" (upload later: wandb sync {where})" if self.mode == "offline" else "")
        elif cfg != jr.config:  # job info or the GPU name arrived after the first iterations
            jr.run.config.update({f"perfd/{k}": v for k, v in cfg.items()} if jr.attached else cfg,
                                 allow_val_change=True)
            jr.config = cfg
        return jr

    # ---- export --------------------------------------------------------------------------------
    def last_step(self, job: str) -> int | None:
        """The last iteration logged for ``job`` (None before the first)."""
        with self._lock:
            jr = self._runs.get(job)
            return jr.last_step if jr else None

    def log_analysis(self, job: str, block: JobBlock, iterations: Sequence[IterationResult],
                     summary: RunSummary | None = None,
                     latest_extra: Mapping[str, float] | None = None,
                     extra_by_step: Mapping[int, Mapping[str, float]] | None = None) -> int:
        """Log the ``iterations`` of a run analysis (its job block, rows and, optionally, summary)
        that were not logged yet, each committed as it is written (none waits for the next). Each
        row's ``_timestamp`` is the iteration's own end time where known. ``extra_by_step`` (GPU and
        host values as they were when that iteration arrived) joins each row it has an entry for;
        ``latest_extra`` (values now) the newest. Returns the rows written."""
        ordered = sorted(iterations, key=lambda x: x.iteration)
        with self._lock:
            jr = self._run(job, block)
            n = 0
            for i, it in enumerate(ordered):
                step = it.iteration
                if step < 0:
                    continue
                if jr.last_step is not None and step <= jr.last_step:
                    continue  # logged before (or older than what was: W&B steps only go forward)
                values: dict[str, float] = dict(iteration_metrics(it))
                values.update((extra_by_step or {}).get(step) or {})
                if i == len(ordered) - 1:  # the job's goodput so far, charted over its iterations
                    if summary is not None:
                        values.update(goodput_metrics(summary.goodput))
                        values.update(budget_metrics(summary.step_budget))
                    values.update(latest_extra or {})
                jr.last_step = step
                if not values:
                    continue
                end = _number(it.end_time)
                if jr.attached:
                    values = {f"{ATTACHED_PREFIX}{k}": v for k, v in values.items()}
                    values[ATTACHED_STEP] = float(step)
                    jr.run.log(values, commit=True)
                    jr.logged += 1
                    n += 1
                    continue
                if end is not None:
                    values["_timestamp"] = end  # the iteration's time, not when perfd wrote it
                jr.run.log(values, step=step, commit=True)
                jr.logged += 1
                n += 1
            if summary is not None:
                s = summary_metrics(summary)
                if s:
                    jr.run.summary.update({f"{ATTACHED_PREFIX}{k}": v for k, v in s.items()}
                                          if jr.attached else s)
            return n

    def log_capture(self, job: str, capture: Mapping[str, Any]) -> str | None:
        """Attach a capture report to the job's run as an artifact (a table of its fields and the
        raw JSON). Each capture id is attached once; returns the artifact name (None if skipped)."""
        cid = str(capture.get("id") or "")
        if not cid:
            raise ValueError("a capture report needs an 'id'")
        with self._lock:
            jr = self._run(job, None) if job not in self._runs else self._runs[job]
            if cid in jr.captures:
                return None
            wandb = self._module()
            name = "capture-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in cid)
            meta = {k: capture.get(k) for k in ("id", "job", "tool", "status", "origin", "ranks", "steps")
                    if capture.get(k) is not None}
            art = wandb.Artifact(name, type="perfd-capture", metadata=meta)
            art.add(wandb.Table(columns=["key", "value"], data=capture_rows(capture)), "report")
            with art.new_file("capture.json") as f:
                json.dump(capture, f, indent=1, default=str)
            jr.run.log_artifact(art)
            jr.captures.add(cid)
            return name

    def counters(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {j: {"logged": r.logged, "last_step": -1 if r.last_step is None else r.last_step,
                        "captures": len(r.captures)} for j, r in self._runs.items()}

    def run_dir(self, job: str) -> str | None:
        """Directory of the job's run (``.../offline-run-*`` in offline mode)."""
        with self._lock:
            jr = self._runs.get(job)
            return str(jr.run.dir).removesuffix("/files") if jr else None

    def finish(self, job: str | None = None) -> None:
        """Close the run of ``job`` (or every run): flushes it to disk."""
        with self._lock:
            for name in [job] if job is not None else list(self._runs):
                jr = self._runs.pop(name, None)
                if jr is not None:
                    try:
                        jr.run.finish()
                    except Exception:  # one run failing to close must not keep the others open
                        log.exception("wandb: finishing the run of %s failed", name)
