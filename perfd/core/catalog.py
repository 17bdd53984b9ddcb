"""The ONE catalog of every metric perfd reports (Prometheus naming conventions).

Names: ``perfd_<domain>_<what>_<unit>``; counters end in ``_total``; ratios are in [0, 1] and end in
``_ratio``; quotients that can exceed 1 (unit "times") end in ``_times`` (older ones still end in
``_ratio``); base units (seconds, bytes, watts, joules, celsius, hertz). Labels are bounded: the job
label is ``job_name`` (Prometheus reserves ``job`` for the scrape job), then ``node``, ``gpu``
(device index), ``rank`` and a few small enums (each label and what bounds it: perfd/core/catalog_labels.py).
Pure data: exporters, docs and tests read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from perfd.core import catalog_engine as _engine

Kind = Literal["gauge", "counter", "histogram"]

JOB = ("job_name",)
# DCGM-exporter's GPU identity labels -> the perfd label whose value each repeats, so a perfd GPU
# series joins a DCGM-exporter series with on(UUID) (or on(Hostname, gpu)) as it is, no
# label_replace (docs/prometheus.md "Joining DCGM-exporter"). Added at export to every GPU series
# (perfd.exporters.prometheus): one value per GPU each, so cardinality is unchanged.
DCGM_IDENTITY: dict[str, str] = {"UUID": "uuid", "Hostname": "node"}
# camelCase, which `promtool check metrics` reports on every series that carries it: only on the
# one info series per GPU (GPU_INFO), whence group_left(modelName) brings it to any other.
DCGM_INFO_IDENTITY: dict[str, str] = {"modelName": "model"}
GPU = ("node", "gpu", "uuid", "model", "pci_bus_id", *DCGM_IDENTITY)
HOST = ("node",)
# A job's rank process on a node (collectors/ranks): bounded by the ranks the node runs.
HOST_RANK = ("node", "job_name", "rank")
AGENT = ("node",)

# Where a job metric shows besides /metrics (every catalog metric is exported by name there).
Show = Literal["summary", "report", "html", "table", "wandb"]
SUMMARY: Show = "summary"  # a steady-state median in the analysis summary
REPORT: Show = "report"  # a row of the report's Metrics part (text, rich, JSON)
HTML: Show = "html"  # a tile of the HTML report
TABLE: Show = "table"  # a column of the per-iteration text table
WANDB: Show = "wandb"  # a W&B history key (and its steady median in the run summary)
_JOB_SHOWS: frozenset[Show] = frozenset({SUMMARY, REPORT, WANDB})


@dataclass(frozen=True)
class MetricDef:
    """One metric, declared once. For a per-iteration job metric, ``attr`` names the attribute of
    the analysis' per-iteration result (perfd.analytics.run.run_analysis.IterationResult) and
    ``scale`` turns it into the catalog unit: every consumer derives its value from these two through
    :func:`in_unit`: /metrics and the rules from the run table's column, the others through
    perfd.analytics.steps.iteration.job_values (of an iteration: there, above the catalog, which names
    no type of the analytics) or :func:`median_values` (of a summary's steady medians)."""

    name: str
    kind: Kind
    unit: str  # "ratio" (a share in [0, 1]), "times" (a quotient >= 0, e.g. max/min), "seconds",
    # "bytes", "bytes_per_second", "watts", "joules", "celsius", "hertz", "tflops", "count", "info",
    # "bitmask", "iteration", "loss", "tokens", "tokens_per_second", "requests_per_second"
    description: str
    source: str
    labels: tuple[str, ...]
    attr: str | None = None
    scale: float = 1.0
    alias: str | None = None  # the short name rules may use for it
    shows: frozenset[Show] = frozenset()
    short: str | None = None  # a person's short label (table header, HTML tile)


# Liveness series the aggregator writes outside a job's analysis (named here once, used there).
JOB_STALLED_SECONDS = "perfd_job_stalled_seconds"
# The per-reason throttle flag (labelled by reason): rules and the GPU view read it by name.
GPU_THROTTLE_ACTIVE = "perfd_gpu_throttle_active"
# Goodput (perfd.analytics.steps.goodput), written from a job's analysis summary.
GOODPUT_RATIO = "perfd_job_goodput_ratio"
JOB_TIME = "perfd_job_time_seconds_total"
# The step budget (perfd.analytics.breakdown.budget), written from a job's analysis summary, one series per
# part.
STEP_BUDGET_SECONDS = "perfd_job_step_budget_seconds"
STEP_BUDGET_RATIO = "perfd_job_step_budget_ratio"
# The rank x step picture at bounded cardinality: the slowest ranks, and a histogram over all ranks.
RANK_RATIO_TOP = "perfd_job_slowest_rank_compute_times"
RANK_RATIO_RANKS = "perfd_job_rank_compute_ratio_ranks"
RANK_RATIO_BUCKETS: tuple[float, ...] = (0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.5, 2.0, math.inf)
# One info series per GPU: its identity and its job, what a DCGM-exporter series joins on(UUID).
GPU_INFO = "perfd_gpu_info"
# One info series per (job, node): where the job runs, what host series join the job on.
JOB_NODE_INFO = "perfd_job_node_info"
# Present (1) for a job that opted out of the MFU alert (perfd.core.model.JobInfo.mfu_alert is False).
# One info series per cause among a job's open incidents: what the alert on an open incident names.
JOB_INCIDENT_CAUSE_INFO = "perfd_job_incident_cause_info"
JOB_MFU_ALERT_OPT_OUT = "perfd_job_mfu_alert_opt_out_info"

# A rank process's series (collectors/ranks). The plain ones each carry one field of the rank's
# observation (perfd.core.events.RankHost): series -> field, what the collector emits and what the rules read
# at rank scope (perfd.aggregator.rule_scopes). The three after it are read otherwise.
RANK_HOST_SERIES: dict[str, str] = {
    "perfd_host_rank_cpu_cores": "cpu_cores", "perfd_host_rank_cpu_wait_ratio": "wait_ratio",
    "perfd_host_rank_allowed_cpus_busy_ratio": "allowed_busy_ratio",
    "perfd_host_rank_others_cpu_ratio": "others_ratio",
    "perfd_host_rank_children_cpu_cores": "children_cpu_cores",
    "perfd_host_rank_cpu_throttled_ratio": "throttled_ratio", "perfd_host_rank_oom_kills_total": "oom_kills"}
_RANK_SERIES = {f: n for n, f in RANK_HOST_SERIES.items()}  # field -> series, for the declarations below
RANK_ALLOWED_CPUS = "perfd_host_rank_allowed_cpus"  # len(allowed_cpus)
RANK_PRESSURE = "perfd_host_rank_pressure_ratio"  # pressure[resource], labelled resource
RANK_STATE_INFO = "perfd_host_rank_state_info"


def _m(name: str, kind: Kind, unit: str, description: str, source: str, labels: tuple[str, ...], *,
       attr: str | None = None, scale: float = 1.0, alias: str | None = None,
       shows: tuple[Show, ...] = (), hide: tuple[Show, ...] = (), short: str | None = None) -> MetricDef:
    """A job metric with ``attr`` shows in the summary, the report and W&B unless ``hide`` says not."""
    default = _JOB_SHOWS if attr and attr != "iteration" else frozenset()
    return MetricDef(name, kind, unit, description, source, labels, attr, scale, alias,
                     (frozenset(shows) | default) - frozenset(hide), short)


_MEGATRON = "collectors/megatron (iteration line, timers), collectors/hook, collectors/torchtitan"
_ANALYTICS = "perfd.analytics over the step sources (collectors/megatron, hook, torchtitan)"
_NVML = "collectors/nvml (NVML)"
_GPM = "collectors/nvml (GPM, Hopper and newer; absent elsewhere)"
_HOST = "collectors/host (psutil)"
_RANKS = "collectors/ranks (/proc/<pid>, the rank's cgroup, /proc/pressure)"
_AGENT = "perfd agent"
_AGGREGATOR = "perfd aggregator"
_SERVING = ("collectors/sglang (scheduler log lines, else /metrics) via "
            "perfd.analytics.serving.serving_analysis")
_SERVING_LOG = "collectors/sglang (scheduler log lines) via perfd.analytics.serving.serving_analysis"
_SERVING_METRICS = ("collectors/sglang (/metrics histograms, --enable-metrics) via "
                    "perfd.analytics.serving.histogram")
_SERVING_ANALYTICS = "perfd.analytics.serving.serving_analysis over collectors/sglang + model spec"
_NCCL = "collectors/nccl (Flight Recorder, NCCL Inspector) + perfd.analytics.collectives.collective_analysis"

CATALOG: tuple[MetricDef, ...] = (
    # --- job: training (per-iteration analysis; in report order) --------------------------
    _m("perfd_job_mfu_ratio", "gauge", "ratio",
       "Model FLOPs utilisation: model TFLOP/s per GPU ÷ peak dense TFLOP/s of the GPU for the dtype",
       _ANALYTICS + " + perfd.analytics.steps.gpus peak table", JOB, attr="mfu", alias="mfu",
       shows=(HTML, TABLE), short="MFU"),
    _m("perfd_job_model_tflops_per_gpu", "gauge", "tflops",
       "Achieved model TFLOP/s per GPU, perfd's FLOPs formula ÷ step time ÷ world size", _ANALYTICS, JOB,
       attr="model_tflops_per_gpu", alias="tflops", shows=(HTML, TABLE), short="model TFLOP/s per GPU"),
    _m("perfd_job_logged_tflops_per_gpu", "gauge", "tflops",
       "Framework's own throughput figure (Megatron 'throughput per GPU (TFLOP/s/GPU)', torchtitan "
       "'tflops')", _MEGATRON, JOB,
       attr="logged_tflops_per_gpu", alias="logged_tflops", shows=(TABLE,), short="logged TFLOP/s per GPU"),
    _m("perfd_job_tflops_gap_ratio", "gauge", "ratio",
       "(perfd − logged) / logged TFLOP/s per GPU; beyond 1% (torchtitan: 2%) the FLOPs model is suspect",
       _ANALYTICS, JOB,
       attr="tflops_rel_gap", alias="tflops_gap", short="TFLOP/s gap"),
    _m("perfd_job_step_time_seconds", "gauge", "seconds", "Elapsed time per iteration", _MEGATRON, JOB,
       attr="step_time_ms", scale=1e-3, alias="step_time", shows=(HTML, TABLE), short="step time"),
    _m("perfd_job_data_loading_ratio", "gauge", "ratio",
       "Data wait (Megatron's batch-generator, the step hook's data-wait; max across ranks) ÷ step; "
       "> 0.2 bottleneck, < 0.05 healthy",
       _ANALYTICS, JOB, attr="data_share", alias="data_share", shows=(HTML, TABLE), short="data loading"),
    _m("perfd_job_outside_step_ratio", "gauge", "ratio",
       "Host time between two steps that was neither a data fetch nor an announced checkpoint or evaluation "
       "(the step hook's outside-step: logging, an evaluation, a loader the hook does not see) ÷ step",
       _ANALYTICS, JOB, attr="outside_share", alias="outside_share", shows=(TABLE,),
       short="outside the step"),
    _m("perfd_job_comm_exposed_ratio", "gauge", "ratio",
       "Exposed communication ÷ step as the comm timers hold it: Σ max-across-ranks of the timers the CPU "
       "waits on, the pipeline's p2p waits included (perfd_job_comm_exposed_pp_ratio, which the step "
       "budget names pipeline wait; the gradient sync's: perfd_job_comm_exposed_dp_ratio)",
       _ANALYTICS, JOB, attr="comm_exposed_share", alias="comm_exposed", shows=(HTML, TABLE),
       short="exposed comm"),
    _m("perfd_job_comm_exposed_dp_ratio", "gauge", "ratio",
       "Exposed gradient sync (all-grads-sync, params-all-gather, finalize-grads all-reduces) ÷ step",
       _ANALYTICS, JOB, attr="comm_exposed_dp_share", alias="comm_exposed_dp", shows=(TABLE,),
       short="exposed DP comm"),
    _m("perfd_job_comm_exposed_pp_ratio", "gauge", "ratio",
       "Exposed pipeline p2p send/recv wait ÷ step (includes waiting for the peer stage)", _ANALYTICS, JOB,
       attr="comm_exposed_pp_share", alias="comm_exposed_pp", shows=(TABLE,), short="exposed PP comm"),
    _m("perfd_job_pp_bubble_analytic_ratio", "gauge", "ratio",
       "Analytic pipeline bubble (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1)", _ANALYTICS, JOB,
       attr="pp_bubble_analytic", alias="pp_bubble", shows=(HTML,), short="PP bubble (analytic)"),
    _m("perfd_job_pp_stage_idle_max_ratio", "gauge", "ratio",
       "Idle share of forward-backward of the most idle (lighter) pipeline stage", _ANALYTICS, JOB,
       attr="pp_idle_max", alias="pp_idle_max", shows=(HTML, TABLE), short="PP stage idle (max)"),
    _m("perfd_job_pp_stage_idle_min_ratio", "gauge", "ratio",
       "Idle share of forward-backward of the least idle (heavier) pipeline stage", _ANALYTICS, JOB,
       attr="pp_idle_min", alias="pp_idle_min", shows=(TABLE,), short="PP stage idle (min)"),
    _m("perfd_job_pp_imbalance_ratio", "gauge", "ratio",
       "Max stage idle − analytic bubble: the part of the bubble due to stage imbalance", _ANALYTICS, JOB,
       attr="pp_imbalance", alias="pp_imbalance", short="PP imbalance"),
    _m("perfd_job_straggler_rtt_spread_times", "gauge", "times",
       "Slowest ÷ fastest rank time (Megatron straggler detector rtt, ≥ 1); > 1.1 marks a candidate",
       _ANALYTICS, JOB, attr="straggler_rtt_ratio", alias="straggler_ratio", shows=(TABLE,),
       short="straggler spread"),
    _m("perfd_job_straggler_ratio", "gauge", "times",
       "DEPRECATED (removed in the release after 0.1): the same value as "
       "perfd_job_straggler_rtt_spread_times, under a _ratio name that does not fit values ≥ 1",
       _ANALYTICS, JOB, attr="straggler_rtt_ratio", hide=(SUMMARY, REPORT, WANDB)),
    _m("perfd_job_lm_loss", "gauge", "loss", "Language-model loss (absent on NaN-loss iterations)",
       _MEGATRON, JOB, attr="lm_loss", alias="lm_loss", short="loss"),
    _m("perfd_job_incident_lost_seconds", "gauge", "seconds",
       "Time this iteration lost against the steady time per step, while it is part of an incident (absent "
       "outside incidents; summed over an incident it is the incident's cost)",
       "perfd.analytics.incidents.detect over collectors/megatron", JOB, attr="incident_lost_ms", scale=1e-3,
       alias="incident_lost", hide=(SUMMARY, REPORT), short="lost to incident"),
    _m("perfd_job_iteration", "gauge", "iteration", "Last iteration number seen", _MEGATRON, JOB,
       attr="iteration", alias="iteration", shows=(WANDB,)),
    _m("perfd_job_comm_total_ratio", "gauge", "ratio",
       "Union of collective/p2p time ÷ step, median over ranks of each rank's median over its latest "
       "iterations (Flight Recorder durations; needs TORCH_NCCL_ENABLE_TIMING=1)", _NCCL, JOB,
       alias="comm_total"),
    _m("perfd_job_comm_total_group_ratio", "gauge", "ratio",
       "Union of one parallel group class's collective time ÷ step (group from process-group ranks "
       "and the job layout)", _NCCL, (*JOB, "group")),
    _m("perfd_job_collective_busbw_bytes_per_second", "gauge", "bytes_per_second",
       "Median achieved bus bandwidth of ops ≥ 64 MiB (nccl-tests factors; per op the member with "
       "the shortest duration)", _NCCL, (*JOB, "group", "scope")),
    _m("perfd_job_collective_busbw_link_ratio", "gauge", "ratio",
       "Achieved bus bandwidth ÷ the capability of the link the group crosses (NVLink, network)",
       _NCCL, (*JOB, "group", "scope")),
    _m("perfd_job_collective_hang_active", "gauge", "count",
       "Collectives stuck past the agents' hang threshold and not yet completed (all agents merged)",
       _NCCL, JOB),
    _m("perfd_job_collective_last_arrival_ratio", "gauge", "ratio",
       "Share of collectives (with a clear spread) where this rank had the shortest duration: the "
       "others waited for it", _NCCL, (*JOB, "rank")),
    _m("perfd_job_rank_compute_ratio", "gauge", "times",
       "A rank's forward+backward compute ÷ the median of its pipeline stage (per-rank timers)",
       _ANALYTICS, (*JOB, "rank"), alias="rank_compute_ratio"),
    _m(RANK_RATIO_TOP, "gauge", "times",
       "perfd_job_rank_compute_ratio of the job's slowest ranks only (at most limits.RANK_RATIO_TOP_K "
       "per job, always exported: bounded however many ranks the job has)", _ANALYTICS, (*JOB, "rank")),
    _m(RANK_RATIO_RANKS, "histogram", "count",
       "The job's ranks by compute ratio at the latest analysed iteration: a gauge histogram over ranks "
       "(_bucket{le} = ranks at most le; _gcount, _gsum), RANK_RATIO_BUCKETS buckets per job for any "
       "rank count (the Grafana rank heatmap)", _ANALYTICS, JOB),
    _m("perfd_job_rank_info", "gauge", "info",
       "1 per rank: the node and GPU it runs on (from the RANK in its process environment)",
       "collectors/nvml process lists", (*JOB, "rank", "node", "gpu")),
    _m(JOB_NODE_INFO, "gauge", "info",
       "1 per node the job runs on (its GPUs' processes declare the job, or its own agents run there), "
       "exported with --no-rank-series too: joins a node agent's host series, which carry no job_name, "
       "to the job (and on(node)); the dashboards' node variable",
       "collectors/nvml process lists, the job's agents", (*JOB, "node")),
    _m("perfd_job_skipped_iterations_total", "counter", "count", "Iterations skipped (loss-scale overflow)",
       _MEGATRON, JOB, alias="skipped_iterations"),
    _m("perfd_job_nan_iterations_total", "counter", "count", "Iterations with a NaN loss", _MEGATRON, JOB,
       alias="nan_iterations"),
    _m("perfd_job_incidents_total", "counter", "count",
       "Incidents opened (stretches of iterations that departed from steady state)",
       "perfd aggregator incidents over perfd.analytics.incidents.detect", JOB, alias="incidents"),
    _m("perfd_job_incident_lost_seconds_total", "counter", "seconds",
       "Seconds lost to incidents against the steady time per step (open incidents: so far)",
       "perfd aggregator incidents over perfd.analytics.incidents.detect", JOB, alias="incident_lost_total"),
    _m("perfd_job_incidents_open", "gauge", "count", "Incidents still open",
       "perfd aggregator incidents over perfd.analytics.incidents.detect", JOB, alias="incidents_open"),
    _m(JOB_INCIDENT_CAUSE_INFO, "gauge", "info",
       "1 for each cause among the job's open incidents (label cause: the kind of evidence their verdict "
       "leads with, or unexplained); absent while none is open. PerfdJobIncidentOpen pages on it",
       "perfd aggregator incidents over perfd.analytics.incidents.detect and its verdict "
       "(perfd.analytics.incidents.evidence)", (*JOB, "cause")),
    _m(GOODPUT_RATIO, "gauge", "ratio",
       "Goodput: steady training time ÷ the job's wall time since it started (perfd.analytics.steps.goodput)",
       _ANALYTICS + ", start-up timestamps and checkpoint/evaluate timers", JOB, alias="goodput"),
    _m(JOB_TIME, "counter", "seconds",
       "The job's wall time split by where it went (label kind: training, incident, profiling, redone, "
       "checkpoint, evaluation, cadence, restart, stall, startup, other); the kinds add up to the wall time",
       _ANALYTICS + ", start-up timestamps and checkpoint/evaluate timers", (*JOB, "kind"),
       alias="job_time_total"),
    _m(STEP_BUDGET_SECONDS, "gauge", "seconds",
       "Where one step's time goes: seconds per step of each part of the step budget (label part: one of "
       "perfd.analytics.breakdown.budget.Part, a closed set); the parts add up to the step. From the capture "
       "that "
       "informs the job, else the steady-state timers (compute then undivided)",
       "perfd.analytics.breakdown.budget over a capture's timeline (perfd.capture.analysis) and the step "
       "timers",
       (*JOB, "part"), alias="step_budget"),
    _m(STEP_BUDGET_RATIO, "gauge", "ratio", "The same parts as shares of the step (they add up to 1)",
       "perfd.analytics.breakdown.budget over a capture's timeline (perfd.capture.analysis) and the step "
       "timers",
       (*JOB, "part"), alias="step_budget_share"),
    _m("perfd_job_step_duration_seconds", "histogram", "seconds",
       "Distribution of step times (each iteration once: a job-level record as it arrives; one its ranks "
       "report, or the engine folds, at its slowest rank once the next begins; buckets 50 ms to 2 min): "
       "histogram_quantile(0.99, ...) gives the step-time tail", _MEGATRON, JOB),
    _m("perfd_job_last_step_timestamp_seconds", "gauge", "seconds",
       "Wall time (epoch) the job's last step record reached the aggregator; stays after the job ends",
       _AGGREGATOR, JOB, alias="last_step_timestamp"),
    _m(JOB_STALLED_SECONDS, "gauge", "seconds",
       "Seconds since the last step of a stalled job (no step past its stale limit while its rank "
       "processes are on their GPUs: hung); 0 while it runs; absent once it ended",
       _AGGREGATOR + " (perfd.analytics.steps.liveness)", JOB, alias="stalled_seconds"),
    _m("perfd_job_state_info", "gauge", "info",
       "1 for the job's liveness state (label state: running, stalled = no step while its processes are "
       "on their GPUs, ended); a stalled or ended job's derived gauges leave /metrics",
       _AGGREGATOR + " (perfd.analytics.steps.liveness)", (*JOB, "state")),
    _m(JOB_MFU_ALERT_OPT_OUT, "gauge", "info",
       "1 for a job that opted out of the MFU alert (perfd agent / perfd launch --no-mfu-alert: low MFU "
       "by design); absent for every other job. PerfdJobMFULow leaves these jobs out",
       _AGGREGATOR + " (the job's job info)", JOB),
    _m("perfd_job_bottleneck_info", "gauge", "info",
       "1 for the job's current bottleneck class (label class)", _ANALYTICS, (*JOB, "class")),
    # --- job: serving (SGLang) --------------------------------------------------------------
    _m("perfd_serving_input_throughput_tokens_per_second", "gauge", "tokens_per_second",
       "Prompt tokens computed per second (cached prefix tokens excluded), over the window",
       _SERVING, JOB, alias="input_throughput"),
    _m("perfd_serving_gen_throughput_tokens_per_second", "gauge", "tokens_per_second",
       "Generated (decode) tokens per second, over the window", _SERVING, JOB, alias="gen_throughput"),
    _m("perfd_serving_running_requests", "gauge", "count",
       "Requests in the running batch (mean over the window)", _SERVING, JOB, alias="running_requests"),
    _m("perfd_serving_queued_requests", "gauge", "count",
       "Requests waiting in the queue (mean over the window)", _SERVING, JOB, alias="queued_requests"),
    _m("perfd_serving_queue_growth_requests_per_second", "gauge", "requests_per_second",
       "Least-squares slope of the queue length over the window (> 0: the queue grows)", _SERVING_LOG, JOB,
       alias="queue_growth"),
    _m("perfd_serving_batch_fill_ratio", "gauge", "ratio",
       "Running requests ÷ max_running_requests (start-up line)", _SERVING_LOG, JOB, alias="batch_fill"),
    _m("perfd_serving_kv_cache_usage_ratio", "gauge", "ratio",
       "KV cache pool usage ('token usage'; hybrid models: the fuller pool), mean over the window",
       _SERVING, JOB, alias="kv_usage"),
    _m("perfd_serving_prefix_cache_hit_ratio", "gauge", "ratio",
       "Prompt tokens served from the prefix (radix) cache ÷ all prompt tokens, over the window",
       _SERVING, JOB, alias="prefix_hit"),
    _m("perfd_serving_prefix_cache_hit_batches_ratio", "gauge", "ratio",
       "Share of prefill batches that reused any cached prefix (do prompts share prefixes?)",
       _SERVING_LOG, JOB, alias="prefix_hit_batches"),
    _m("perfd_serving_ttft_p50_seconds", "gauge", "seconds",
       "Median time to first token over the window (Δ histogram between scrapes)", _SERVING_METRICS, JOB,
       alias="ttft_p50"),
    _m("perfd_serving_ttft_p99_seconds", "gauge", "seconds",
       "P99 time to first token over the window (Δ histogram between scrapes)", _SERVING_METRICS, JOB,
       alias="ttft_p99"),
    _m("perfd_serving_itl_p50_seconds", "gauge", "seconds",
       "Median inter-token latency over the window (inter_token_latency or time_per_output_token histogram)",
       _SERVING_METRICS, JOB, alias="itl_p50"),
    _m("perfd_serving_itl_p99_seconds", "gauge", "seconds",
       "P99 inter-token latency over the window (inter_token_latency or time_per_output_token histogram)",
       _SERVING_METRICS, JOB, alias="itl_p99"),
    _m("perfd_serving_e2e_latency_p50_seconds", "gauge", "seconds",
       "Median end-to-end request latency over the window", _SERVING_METRICS, JOB, alias="e2e_p50"),
    _m("perfd_serving_e2e_latency_p99_seconds", "gauge", "seconds",
       "P99 end-to-end request latency over the window", _SERVING_METRICS, JOB, alias="e2e_p99"),
    _m("perfd_serving_cuda_graph_ratio", "gauge", "ratio",
       "Share of logged decode batches that ran with CUDA graphs", _SERVING_LOG, JOB, alias="cuda_graph"),
    _m("perfd_serving_spec_accept_length", "gauge", "tokens",
       "Speculative decoding: mean accepted tokens per step ('accept len')", _SERVING, JOB,
       alias="spec_accept_length"),
    _m("perfd_serving_decode_mbu_ratio", "gauge", "ratio",
       "Decode memory-bandwidth utilisation: (weights + KV in use) bytes per step × steps/s ÷ peak "
       "bandwidth, per GPU", _SERVING_ANALYTICS + " + perfd.analytics.steps.gpus bandwidth table", JOB,
       alias="decode_mbu"),
    _m("perfd_serving_decode_mfu_ratio", "gauge", "ratio",
       "Decode model FLOPs utilisation: 2·N_active × generated tokens/s ÷ (GPUs × peak dense FLOP/s)",
       _SERVING_ANALYTICS + " + perfd.analytics.steps.gpus peak table", JOB, alias="decode_mfu"),
    _m("perfd_serving_prefill_mfu_ratio", "gauge", "ratio",
       "Prefill model FLOPs utilisation: 2·N_active × computed prompt tokens/s ÷ (GPUs × peak dense FLOP/s)",
       _SERVING_ANALYTICS + " + perfd.analytics.steps.gpus peak table", JOB, alias="prefill_mfu"),
    # --- GPU ------------------------------------------------------------------------------
    _m(GPU_INFO, "gauge", "info",
       "1 per GPU, labelled with its identity (DCGM-exporter's UUID, modelName, Hostname, pci_bus_id "
       "too) and job_name, the job whose processes run on it (absent when none): join DCGM-exporter "
       "series on(UUID) to put them in jobs (docs/prometheus.md)",
       _AGENT + " (perfd.core.placement over collectors/nvml)", (*GPU, *JOB, *DCGM_INFO_IDENTITY)),
    _m("perfd_gpu_utilization_ratio", "gauge", "ratio",
       "NVML utilisation: share of time a kernel was resident (not SM busy)", _NVML, GPU,
       alias="gpu_util", shows=(WANDB,)),
    _m("perfd_gpu_memory_utilization_ratio", "gauge", "ratio",
       "NVML memory-controller utilisation: share of time device memory was read or written", _NVML, GPU),
    _m("perfd_gpu_memory_used_bytes", "gauge", "bytes", "Device memory used", _NVML, GPU,
       alias="gpu_memory_used", shows=(WANDB,)),
    _m("perfd_gpu_memory_total_bytes", "gauge", "bytes", "Device memory total", _NVML, GPU,
       alias="gpu_memory_total"),
    _m("perfd_gpu_power_watts", "gauge", "watts", "Power draw", _NVML, GPU,
       alias="gpu_power", shows=(WANDB,)),
    _m("perfd_gpu_power_limit_watts", "gauge", "watts", "Enforced power limit (slow interval)", _NVML, GPU),
    _m("perfd_gpu_energy_joules_total", "counter", "joules", "Energy since driver load (slow call)",
       _NVML, GPU),
    _m("perfd_gpu_temperature_celsius", "gauge", "celsius", "GPU temperature", _NVML, GPU,
       alias="gpu_temperature", shows=(WANDB,)),
    _m("perfd_gpu_sm_clock_hertz", "gauge", "hertz", "SM clock", _NVML, GPU,
       alias="sm_clock", shows=(WANDB,)),
    _m("perfd_gpu_mem_clock_hertz", "gauge", "hertz", "Memory clock", _NVML, GPU, alias="mem_clock"),
    _m("perfd_gpu_throttle_reasons", "gauge", "bitmask",
       "Clock throttle reasons bitmask (nvmlDeviceGetCurrentClocksEventReasons)", _NVML, GPU,
       alias="throttle_reasons"),
    _m(GPU_THROTTLE_ACTIVE, "gauge", "count", "1 while a throttle reason is active, else 0",
       _NVML, (*GPU, "reason")),
    _m("perfd_gpu_ecc_errors_total", "counter", "count", "ECC errors (volatile)", _NVML, (*GPU, "type")),
    _m("perfd_gpu_xid_errors_total", "counter", "count", "XID errors seen", _NVML, GPU, alias="xid_errors"),
    _m("perfd_gpu_xid_last", "gauge", "count", "Code of the last XID error seen (present only once one "
       "was seen)", _NVML, GPU),
    _m("perfd_gpu_processes", "gauge", "count", "Compute processes on the GPU", _NVML, GPU,
       alias="gpu_processes"),
    _m("perfd_gpu_sm_util_ratio", "gauge", "ratio", "GPM SM utilisation", _GPM, GPU,
       alias="sm_util", shows=(WANDB,)),
    _m("perfd_gpu_sm_occupancy_ratio", "gauge", "ratio", "GPM SM occupancy", _GPM, GPU, alias="sm_occupancy"),
    _m("perfd_gpu_tensor_util_ratio", "gauge", "ratio", "GPM any-tensor-core utilisation", _GPM, GPU,
       alias="tensor_util", shows=(WANDB,)),
    _m("perfd_gpu_dram_bw_util_ratio", "gauge", "ratio", "GPM DRAM bandwidth utilisation", _GPM, GPU,
       alias="dram_bw_util", shows=(WANDB,)),
    _m("perfd_gpu_fp16_util_ratio", "gauge", "ratio", "GPM FP16 pipe utilisation", _GPM, GPU),
    _m("perfd_gpu_fp32_util_ratio", "gauge", "ratio", "GPM FP32 pipe utilisation", _GPM, GPU),
    _m("perfd_gpu_fp64_util_ratio", "gauge", "ratio", "GPM FP64 pipe utilisation", _GPM, GPU),
    _m("perfd_gpu_pcie_rx_bytes_per_second", "gauge", "bytes_per_second", "PCIe receive rate", _GPM, GPU),
    _m("perfd_gpu_pcie_tx_bytes_per_second", "gauge", "bytes_per_second", "PCIe transmit rate", _GPM, GPU),
    _m("perfd_gpu_nvlink_rx_bytes_per_second", "gauge", "bytes_per_second", "NVLink receive rate (all links)",
       _GPM, GPU),
    _m("perfd_gpu_nvlink_tx_bytes_per_second", "gauge", "bytes_per_second", "NVLink transmit rate (all "
       "links)", _GPM, GPU),
    # --- host -----------------------------------------------------------------------------
    _m("perfd_host_cpu_util_ratio", "gauge", "ratio", "CPU utilisation, all cores", _HOST, HOST,
       alias="host_cpu_util", shows=(WANDB,)),
    _m("perfd_host_load1", "gauge", "count", "1-minute load average", _HOST, HOST),
    _m("perfd_host_memory_used_bytes", "gauge", "bytes", "Host memory used", _HOST, HOST,
       alias="host_memory_used", shows=(WANDB,)),
    _m("perfd_host_memory_total_bytes", "gauge", "bytes", "Host memory total", _HOST, HOST),
    _m("perfd_host_net_rx_bytes_per_second", "gauge", "bytes_per_second", "Network receive rate", _HOST,
       (*HOST, "interface")),
    _m("perfd_host_net_tx_bytes_per_second", "gauge", "bytes_per_second", "Network transmit rate", _HOST,
       (*HOST, "interface")),
    _m("perfd_host_disk_read_bytes_per_second", "gauge", "bytes_per_second",
       "Disk read rate, all physical disks", _HOST, HOST),
    _m("perfd_host_disk_write_bytes_per_second", "gauge", "bytes_per_second",
       "Disk write rate, all physical disks", _HOST, HOST),
    _m("perfd_host_swap_in_bytes_per_second", "gauge", "bytes_per_second",
       "Pages swapped in, node-wide (/proc/vmstat pswpin × page size)", _RANKS, HOST),
    # --- host: a job's rank processes (collectors/ranks) ------------------------------------------
    _m(RANK_STATE_INFO, "gauge", "info",
       "1 for the rank process's state (label process_state: running, sleeping, disk_sleep, stopped, "
       "zombie, gone, other), from /proc/<pid>/stat", _RANKS, (*HOST_RANK, "process_state")),
    _m(_RANK_SERIES["cpu_cores"], "gauge", "cores",
       "CPU the rank process used, all threads: CPU seconds per second over the collect interval", _RANKS,
       HOST_RANK),
    _m(_RANK_SERIES["wait_ratio"], "gauge", "ratio",
       "Time the rank's threads waited in a run queue ÷ (running + waiting) over the interval "
       "(/proc/<pid>/task/*/schedstat): the direct measure of CPU contention; absent without schedstats",
       _RANKS, HOST_RANK, alias="rank_cpu_wait"),
    _m(RANK_ALLOWED_CPUS, "gauge", "count",
       "CPUs the rank process may run on (sched_getaffinity)", _RANKS, HOST_RANK),
    _m(_RANK_SERIES["allowed_busy_ratio"], "gauge", "ratio",
       "Busy share of the rank's allowed CPUs, every process on them (/proc/stat per CPU)", _RANKS,
       HOST_RANK),
    _m(_RANK_SERIES["others_ratio"], "gauge", "ratio",
       "Share of the rank's allowed CPUs that processes outside the job took (a scan of /proc/*/stat, run "
       "only while the rank waits for a CPU; absent otherwise)", _RANKS, HOST_RANK),
    _m(_RANK_SERIES["children_cpu_cores"], "gauge", "cores",
       "CPU the rank process's descendants used (its data-loader workers: the job's own work, never counted "
       "as other processes on the rank's CPUs): CPU seconds per second over the collect interval", _RANKS,
       HOST_RANK),
    _m(_RANK_SERIES["throttled_ratio"], "gauge", "ratio",
       "CFS periods in which the rank's cgroup was throttled by its CPU quota ÷ periods (cgroup cpu.stat; "
       "absent without a quota)", _RANKS, HOST_RANK, alias="rank_cpu_throttled"),
    _m(RANK_PRESSURE, "gauge", "ratio",
       "Pressure stall information of the rank's cgroup (the node's for the root cgroup): share of time "
       "some task stalled on the resource, over the interval; absent where the kernel has no PSI",
       _RANKS, (*HOST_RANK, "resource")),
    _m(_RANK_SERIES["oom_kills"], "counter", "count",
       "Processes the OOM killer killed in the rank's cgroup (memory.events oom_kill; v1 memory.oom_control)",
       _RANKS, HOST_RANK),
    # --- agent self-metrics ---------------------------------------------------------------
    _m("perfd_agent_collector_errors_total", "counter", "count", "Collector failures, by reason", _AGENT,
       (*AGENT, "collector", "reason")),
    _m("perfd_agent_samples_total", "counter", "count", "Samples produced", _AGENT, (*AGENT, "collector")),
    _m("perfd_agent_collect_duration_seconds", "histogram", "seconds", "Duration of one collect() call",
       _AGENT, (*AGENT, "collector")),
    _m("perfd_agent_spool_bytes", "gauge", "bytes",
       "Bytes of batches held in the spool (disk and memory) until acknowledged", _AGENT, AGENT),
    _m("perfd_agent_spool_dropped_samples_total", "counter", "count",
       "Samples dropped oldest-first beyond the spool cap", _AGENT, AGENT),
    _m("perfd_agent_send_failures_total", "counter", "count", "Failed batch sends to the aggregator",
       _AGENT, AGENT),
    _m("perfd_agent_cpu_seconds_total", "counter", "seconds", "CPU time used by the agent", _AGENT, AGENT),
    _m("perfd_agent_resident_memory_bytes", "gauge", "bytes", "Agent resident memory", _AGENT, AGENT),
    _m("perfd_agent_connected", "gauge", "count", "1 while the aggregator acknowledges the agent's stream "
       "(an acknowledgement within the ack timeout), 0 otherwise", _AGENT, AGENT),
    _m("perfd_agent_ack_timeouts_total", "counter", "count",
       "Streams the agent dropped for want of an acknowledgement (a dead or half-open link)", _AGENT, AGENT),
    _m("perfd_agent_http_refused_total", "counter", "count",
       "Connections and requests the agent's /metrics server turned away, by reason (perfd.core.limits "
       "REFUSED_HTTP_*: a deadline missed, a head too large, connections over the cap)", _AGENT,
       (*AGENT, "reason")),
    # --- aggregator self-metrics ----------------------------------------------------------
    _m("perfd_aggregator_samples_total", "counter", "count", "Samples ingested", _AGGREGATOR, ()),
    _m("perfd_aggregator_step_records_total", "counter", "count", "Step records ingested", _AGGREGATOR,
       ()),
    _m("perfd_aggregator_batches_total", "counter", "count", "Batches ingested (duplicates excluded)",
       _AGGREGATOR, ()),
    _m("perfd_aggregator_duplicate_batches_total", "counter", "count",
       "Batches received again after a reconnect and not delivered twice", _AGGREGATOR, ()),
    _m("perfd_aggregator_decode_errors_total", "counter", "count", "Batches that could not be decoded",
       _AGGREGATOR, ()),
    _m("perfd_aggregator_agents_connected", "gauge", "count",
       "Agents whose stream carried a message within the silence limit (each one acknowledged)",
       _AGGREGATOR, ()),
    _m("perfd_aggregator_event_loop_lag_seconds", "gauge", "seconds",
       "How late the aggregator's event loop ran at its last one-second tick; new agent streams are "
       "refused (reason overloaded) while it exceeds perfd.core.limits.MAX_LOOP_LAG_S, or while the loop is "
       "saturated otherwise (perfd.transport.admission.admit_stream)", _AGGREGATOR, ()),
    _m("perfd_aggregator_gc_seconds_total", "counter", "seconds",
       "Time the aggregator process spent in Python's garbage collector (its event loop stalled "
       "meanwhile); perfd.aggregator.runtime", _AGGREGATOR, ()),
    _m("perfd_aggregator_refused_total", "counter", "count",
       "What a credential check or a cap turned away, by reason (perfd.core.limits REFUSED_*)", _AGGREGATOR,
       ("reason",)),
    _m("perfd_aggregator_jobs_held", "gauge", "count",
       "Jobs held now (what --max-jobs counts: named by an open stream's Hello, or holding data not yet "
       "pruned); perfd.aggregator.retention", _AGGREGATOR, ()),
    _m("perfd_aggregator_series_held", "gauge", "count",
       "Node series definitions held now (what --max-series counts; an agent's leave when it is "
       "forgotten)", _AGGREGATOR, ()),
    _m("perfd_aggregator_state_held_bytes", "gauge", "bytes",
       "Bytes the --state-dir files take on disk now (the database, its write-ahead log and index: what "
       "--state-max-mib caps); absent without a state dir. perfd.aggregator.state_store", _AGGREGATOR, ()),
    _m("perfd_aggregator_state_max_bytes", "gauge", "bytes",
       "The --state-dir cap (--state-max-mib) in bytes: held / max is how full the journal is (the oldest "
       "batches go first past it)", _AGGREGATOR, ()),
    _m("perfd_aggregator_jobs_pruned_total", "counter", "count",
       "Jobs dropped after they ended: past --job-retention, or the one that ended first when a new job "
       "met the cap or a quota", _AGGREGATOR, ()),
    _m("perfd_aggregator_agents_forgotten_total", "counter", "count",
       "Agents forgotten after their stream stayed closed for the agent retention (their series released)",
       _AGGREGATOR, ()),
    _m("perfd_aggregator_collective_records_total", "counter", "count",
       "Collective records ingested (Flight Recorder, NCCL Inspector; on the engine path the operations "
       "the agents reduced them to)", _AGGREGATOR, ()),
    _m("perfd_aggregator_collective_records_dropped_total", "counter", "count",
       "Collective records dropped oldest-first beyond the per-job retention (reduced operations: beyond "
       "each rank's share of it)", _AGGREGATOR, ()),
    _m("perfd_aggregator_agent_dropped_samples_total", "counter", "count",
       "Samples the agents report their spools dropped (oldest first, beyond the cap)", _AGGREGATOR, ()),
    _m("perfd_aggregator_remote_write_samples_total", "counter", "count",
       "Samples a remote-write receiver accepted, by target (--remote-write)", _AGGREGATOR, ("target",)),
    _m("perfd_aggregator_remote_write_failed_requests_total", "counter", "count",
       "Remote-write requests that failed (retried on 5xx/429/no answer, dropped on other 4xx)",
       _AGGREGATOR, ("target",)),
    _m("perfd_aggregator_remote_write_dropped_samples_total", "counter", "count",
       "Samples never written: refused for good by the receiver, or the oldest beyond the pending "
       "bound while it was unreachable", _AGGREGATOR, ("target",)),
    _m("perfd_agent_captures_total", "counter", "count", "Captures run, by tool and outcome", _AGENT,
       (*AGENT, "tool", "status")),
    # --- the engine: a job's root (perfd aggregator --engine), perfd shard (perfd/core/catalog_engine.py)
    *(MetricDef(n, k, u, d, _engine.ROOT_SOURCE, lbl) for n, k, u, d, lbl in _engine.ROOT),
    *(MetricDef(n, k, u, d, _engine.SHARD_SOURCE, lbl) for n, k, u, d, lbl in _engine.SHARD),
    _m("perfd_build_info", "gauge", "info", "1, labelled with perfd's version and the Python it runs on",
       "perfd agent, perfd aggregator and perfd shard", ("version", "python")),
)

_BY_NAME: dict[str, MetricDef] = {m.name: m for m in CATALOG}


def get(name: str) -> MetricDef:
    """The definition of ``name``; raises KeyError for a name not in the catalog."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the perfd catalog") from None


def all_metrics() -> tuple[MetricDef, ...]:
    """Every metric definition, in catalog order."""
    return CATALOG


def names() -> list[str]:
    return [m.name for m in CATALOG]


# --- job metrics of the per-iteration analysis --------------------------------------------------
def job_metrics(show: Show | None = None) -> tuple[MetricDef, ...]:
    """The per-iteration job metrics (those with an ``attr``), in catalog order; with ``show``, only
    those shown there."""
    return tuple(m for m in CATALOG if m.attr and (show is None or show in m.shows))


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def in_unit(metric: MetricDef, v: object) -> float | None:
    """A job metric's value in the catalog unit from a value of its ``attr``; None when absent (never 0)."""
    return None if (n := _number(v)) is None else n * metric.scale


def median_value(metric: MetricDef, medians: Mapping[str, float | None]) -> float | None:
    """One job metric of a run summary's steady ``medians`` (keyed by the iteration result's
    attributes), in the catalog unit; None when absent (never 0)."""
    return in_unit(metric, medians.get(metric.attr)) if metric.attr is not None else None


def median_values(medians: Mapping[str, float | None], show: Show | None = None) -> dict[str, float]:
    """{catalog name: value} of every job metric present in a run summary's steady ``medians``, as
    perfd.analytics.steps.iteration.job_values maps an iteration's."""
    return {m.name: v for m in job_metrics(show) if (v := median_value(m, medians)) is not None}


def aliases() -> dict[str, str]:
    """Short alias -> catalog name, for rule expressions."""
    return {m.alias: m.name for m in CATALOG if m.alias}
