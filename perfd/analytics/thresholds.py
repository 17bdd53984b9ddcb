"""The diagnosis playbook's thresholds (docs/design.md §2 "Diagnosis playbook"), declared once. Pure data.

The findings (``findings.py``, ``serving_findings.py``), the bottleneck class (``bottleneck.py``) and
the stragglers (``stragglers.py``) read ``.value`` from here. The rule packs that encode the same
playbook elsewhere — ``rules/default.yaml``, ``rules/serving.yaml`` (perfd's own rules, which also
trigger captures) and ``deploy/prometheus/perfd.rules.yml`` (Alertmanager; ``deploy/k8s`` renders its
PrometheusRule from it) — are hand-written YAML with prose that quotes the numbers, so they are
*checked* against this module rather than generated: ``tests/test_thresholds.py`` finds each rule
named in ``rules`` below and fails when its comparison or its ``for:`` differs from the value here.

Values are in base units: ratios in [0, 1], seconds. Each says why (``why``) and where docs/design.md
defines it (``design``). Where the rule packs hold the same value for a different time, the
difference is written next to the value (``RuleRef.note``).
"""

from __future__ import annotations

from perfd.core import shared_thresholds as _shared
from perfd.core.shared_thresholds import RuleRef, Threshold

# Why perfd's own rules wait 5 minutes and most Alertmanager alerts 10-15 (data loading's 2: its note
# says why): a perfd rule's action is a capture, which must catch the problem while it happens (its
# cooldown and hourly cap bound the cost); an alert reaches a person, who should only hear of a state
# that persisted.
_PAGE_LATER = ("deliberate: the alert pages a person, so it waits for a state that persisted; "
               "perfd's own rule fires after 5m because its action is a capture, which must catch "
               "the problem while it happens (cooldown and max_per_hour bound the cost)")


_D2 = "docs/design.md §2 Diagnosis playbook"

# --- training: MFU grades -----------------------------------------------------------------------------
MFU_SEVERE = Threshold(
    0.30, "below 30% of peak the cause is usually communication (TP across nodes) or data loading",
    "docs/design.md §2 MFU (grades)",
    (RuleRef("default", "mfu_severe", "mfu", "<", "5m"),
     RuleRef("prometheus", "PerfdJobMFULow", "job_name:perfd_job_mfu_ratio:avg_over_time_10m", "<",
             "15m", _PAGE_LATER)))
MFU_GOOD = Threshold(0.40, "30-40% is communication overhead; 40-50% is normal for large models",
                     "docs/design.md §2 MFU (grades)")
MFU_EXCELLENT = Threshold(0.50, "above 50% only kernel-level work (fusions, FP8) remains",
                          "docs/design.md §2 MFU (grades)")
MFU_POSSIBLE = Threshold(1.0, "no job runs faster than its GPU's peak: an MFU above 100% means the peak is "
                              "wrong (a --dtype or --peak-tflops that is not the job's), and it is never "
                              "graded", "docs/design.md §2 MFU")

# --- training: shares of the step ---------------------------------------------------------------------
DATA_BOUND_SHARE = Threshold(
    0.20, "the batch generator taking a fifth of the step is a data-loading bottleneck",
    "docs/design.md §2 Data-loading share",
    (RuleRef("default", "data_loading_bottleneck", "data_share", ">", "5m"),
     RuleRef("prometheus", "PerfdJobDataLoadingHigh",
             "job_name:perfd_job_data_loading_ratio:avg_over_time_2m", ">", "2m",
             "sooner than perfd's own rule (5m): the data wait is measured on every step, so a "
             "2-minute average held 2 minutes is already a state that persisted (one disturbed step "
             "cannot lift it over the threshold: deploy/prometheus/perfd.rules.yml), and a data-loading "
             "stall costs every step until someone acts")))
DATA_HEALTHY_SHARE = Threshold(0.05, "a healthy input pipeline costs under 5% of the step",
                               "docs/design.md §2 Data-loading share")
OUTSIDE_STEP_SHARE = Threshold(
    0.20, "host work between the steps that no step names (the hook's outside-step) taking a fifth of the "
    "step is as costly as a data-loading bottleneck, and its cause is as unknown to perfd",
    "docs/design.md §2 Data-loading share")
COMM_BOUND_SHARE = Threshold(
    0.30, "exposed (not overlapped) communication above 30% of the step dominates it", _D2,
    (RuleRef("default", "comm_exposed_high", "comm_exposed", ">", "5m"),
     RuleRef("prometheus", "PerfdJobExposedCommHigh",
             "job_name:perfd_job_comm_exposed_ratio:avg_over_time_10m", ">", "10m", _PAGE_LATER)))
GRAD_SYNC_SHARE = Threshold(
    0.20, "exposed DP gradient sync above 20%: overlap it with backward or accumulate more", _D2,
    (RuleRef("default", "dp_allreduce_high", "comm_exposed_dp", ">", "5m"),
     RuleRef("prometheus", "PerfdJobDataParallelSyncHigh",
             "job_name:perfd_job_comm_exposed_dp_ratio:avg_over_time_10m", ">", "10m", _PAGE_LATER)))
PIPELINE_BOUND_SHARE = Threshold(
    0.15, "a stage idling more than 15% of forward-backward: bubble or stage imbalance", _D2,
    (RuleRef("default", "pp_stage_idle_high", "pp_idle_max", ">", "5m"),
     RuleRef("prometheus", "PerfdJobPipelineIdleHigh",
             "job_name:perfd_job_pp_stage_idle_max_ratio:avg_over_time_10m", ">", "10m", _PAGE_LATER)))
BUBBLE_TARGET = Threshold(0.05, "the micro-batch count recommended brings the analytic bubble to 5%",
                          "docs/design.md §2 Pipeline bubble")
PP_BUBBLE_HIGH = Threshold(0.10, "an analytic bubble above 10% is worth more micro-batches",
                           "docs/design.md §2 Pipeline bubble")
PP_IDLE_HIGH = Threshold(0.20, "a stage idling 20% without imbalance is a bubble to report",
                         "docs/design.md §2 Pipeline bubble")
PP_IMBALANCE_MIN = Threshold(0.05, "imbalance under 5 points is noise next to the bubble",
                             "docs/design.md §2 Pipeline bubble")
PP_WAIT_SHARE = Threshold(0.05, "exposed p2p above 5% of the step is pipeline waiting worth naming",
                          "docs/design.md §2 Communication share")
JITTER_CV = Threshold(0.10, "step times varying more than 10% (CV) point at host-side gaps", _D2)
# A jitter's slow steps in phase with a period (perfd.analytics.steps.beat): a timer-driven process.
BEAT_SLOW_STEP_EXCESS = Threshold(
    0.25, "a step 25% over what its work predicts is a slow one: on the H100 a timer's hits made the "
    "varlen loop's steps 10-45 ms long against 18-56 ms, where its other steps stayed within 5%", _D2)
BEAT_MIN_SLOW_STEPS = Threshold(8, "fewer slow steps than this show no period worth naming", _D2)
BEAT_RAYLEIGH = Threshold(
    15.0, "n·R² of the slow steps' phases at the best trial period: random times give about Exp(1), "
    "so the best of the few hundred periods tried passes 15 by chance less than once in 10,000; the "
    "H100's timer-hit loop gave 24.6 (44 steps, R 0.75)", _D2)

# --- training: stragglers ----------------------------------------------------------------------------
STRAGGLER_RATIO = Threshold(
    1.1, "a rank more than 1.1x its peers makes every collective wait for it", "docs/design.md §2 Stragglers",
    (RuleRef("default", "straggler_persistent", "perfd_job_rank_compute_ratio", ">", "5m"),
     RuleRef("prometheus", "PerfdRankStraggler",
             "job_name_rank:perfd_job_rank_compute_ratio:avg_over_time_10m", ">", "10m", _PAGE_LATER),
     RuleRef("prometheus", "PerfdJobStragglerSpread",
             "job_name:perfd_job_straggler_rtt_spread_times:avg_over_time_10m", ">", "10m", _PAGE_LATER)))
STRAGGLER_PERSISTENT_FRACTION = Threshold(
    0.5, "flagged in half of the steady iterations is persistent, not a one-off",
    "docs/design.md §2 Stragglers")

# --- GPM classes (ratios), from the H200 measurements in docs/design.md §2: a bf16 matmul loop shows tensor
# util 0.94 / DRAM 0.18, a device copy loop tensor 0 / DRAM 0.88, tiny kernels NVML util 0.34 with SM
# util 0.0004.
_GPM = "docs/design.md §2 Bottleneck class, §3 GPM"

GPM_TENSOR_BUSY = Threshold(0.5, "tensor pipes busy half the time: compute-bound", _GPM)
GPM_DRAM_BUSY = Threshold(0.5, "DRAM bandwidth half used: memory-bound", _GPM)
GPM_SM_BUSY = Threshold(0.8, "SMs busy without tensor/DRAM saturation: CUDA-core bound", _GPM)
GPM_SM_STARVED = Threshold(0.2, "SMs mostly idle while kernels are resident: launch overhead", _GPM)
GPM_NVML_ACTIVE = Threshold(0.2, "NVML util (a kernel resident) above which the GPU counts as used", _GPM)
GPM_IDLE = Threshold(0.05, "below 5% on NVML and SM the GPU is idle, no class applies", _GPM)

# --- training: the class from compute's share and MFU (perfd.analytics.breakdown.diagnosis)
# ------------------------
COMPUTE_FILLS_STEP = Threshold(0.8, "data, exposed communication and pipeline idle leave 80% of the step "
                                    "to compute: what the GPU does with it decides the class", _D2)
LOW_MFU = Threshold(0.40, "below the 'good' grade, compute filling the step is slow kernels or a host too "
                    "slow to launch them: the timers alone do not call it compute-bound",
                    "docs/design.md §2 MFU (grades)")
GPU_ALWAYS_BUSY = Threshold(0.8, "a kernel resident at least 80% of the time (NVML): the GPU always has "
                            "work, so a low MFU with compute filling the step is the kernels' own "
                            "(kernel efficiency), not the host's launches", _GPM)
GPM_TENSOR_LOW = Threshold(0.3, "tensor cores mostly idle while the SMs work: not GEMM-bound work", _GPM)

# --- incidents (perfd.analytics.incidents.detect) -----------------------------------------------------------
_INC = "docs/design.md §2 Stragglers; §4 (an incident's time lost)"
STEADY_WINDOW_STEPS = Threshold(
    8, "steps are read over windows of 8: the time per step over a window is stable whatever the pattern "
    "inside it (a two-worker DataLoader's alternating waits, a slower step every few, up to 4 workers' "
    "periods twice over), and a departure shows within half a window of where it starts", _INC)
STEP_FACTOR = Threshold(1.2, "a window of steps 20% above the steady time per step starts an incident", _INC)
INCIDENT_MIN_COST_STEPS = Threshold(2.0, "an incident costs at least two steady steps; smaller departures "
                                         "are jitter (counted in the summary, not listed)", _INC)
INCIDENT_MIN_COST_S = Threshold(1.0, "... and at least a second: on a 40 ms step two steps are noise", _INC)
INCIDENT_MERGE_FRACTION = Threshold(
    0.25, "two stretches with the same cause merge across a gap up to a quarter of the shorter one's "
    "length (a lasting shift is one incident; a lone noisy step does not stretch a long one)", _INC)
EXPLAINS_SHARE = Threshold(0.5, "a part of the step (data wait, exposed communication) that grew by half "
                                "of the slowdown or more (its median step, or the cost it lost) explains it; "
                                "a contiguous run of a stretch's steps it explains, and not the rest, is an "
                                "incident of its own (perfd.analytics.incidents.split)",
                           _INC)
AFTER_CAPTURE_PACE = Threshold(
    1.1, "an incident that begins after perfd's capture is the capture's where the steps between them stayed "
    "10% or more above their pace before it (a Kineto trace without TEARDOWN_CUPTI=1: +24% to +30% on "
    "host-bound jobs, under 1% with it; docs/evidence/kineto_teardown_h200)", _INC)
# --- a loop's own pauses at a cadence (perfd.analytics.incidents.cadence) -------------------------------
_CAD = "perfd/analytics/incidents/cadence.py (a loop's own pauses at a cadence; docs/design.md §2 has none)"
PAUSE_MAX_STEPS = Threshold(
    2, "a pause between two steps lies in the period of the step after it (two where the loop's phase and "
    "the hook's period straddle it): a longer slow stretch is a slowdown, never the loop's own pause", _CAD)
CADENCE_MIN_EVERY = Threshold(
    10, "a pause recurring every fewer steps is part of the step pattern (the rolling windows read it as the "
    "steps' own time and open no incident): a cadence is every 10 steps or more", _CAD)
CADENCE_SIZE_FACTOR = Threshold(
    3.0, "the pauses of one cadence are the same work (an evaluation, a checkpoint save): each within 3x of "
    "the others' median (a disk or a cache makes them vary that much; a one-off hang on the cadence's step "
    "does not)", _CAD)
PAUSE_WRITES_BPS = _shared.PAUSE_WRITES_BPS  # collectors/ranks reports a rank writing at once too
PAUSE_GPU_BUSY = Threshold(
    0.5, "a GPU running kernels half the time or more while no step ends is evaluating (forward passes "
    "between the steps); a save copies the state off the GPU in a fraction of that", _CAD)
# --- lasting shifts (perfd.analytics.steps.changepoint)
# -------------------------------------------------------
_CP = "perfd/analytics/steps/changepoint.py (a lasting shift of the step time; docs/design.md §2 has none)"
CHANGE_POINT_MIN_STEPS = Threshold(
    20.0, "a slowdown that has lasted 20 steps (and a tenth of the window) to the end of the run is a "
          "change point, its cost counted against the level before it until the user takes the new "
          "level as the new normal; shorter, it is an incident (the level after is STEP_FACTOR above)", _CP)
CHANGE_POINT_LEVEL_SHARE = Threshold(
    0.8, "a level: 80% of the steps after the change point above the midpoint of the two levels, and "
         "80% of those before it below (a few spikes are not a shift)", _CP)

# --- capture timelines (perfd.capture.analysis, perfd.analytics.advice.capture_findings)
# ---------------------
SHORT_GAP_S = Threshold(
    0.001, "an idle gap between GPU activities shorter than 1 ms is the host issuing work (launch/dispatch "
    "overhead); a longer one is the host waiting (a sync, data)",
    "docs/design.md §2 Bottleneck class (a capture's timeline)")
SYNC_REFILLED_LEAD_S = Threshold(
    50e-6, "a synchronisation's knock-on (the host refilling the queue it drained, the device waiting on "
    "each launch) is charged to it until a gap's next kernel was launched this long before the gap began: "
    "the queue is full again (nanoGPT on an H200: the host 7 µs ahead once while refilling, then 90 µs and "
    "more, 1-17 ms in its steady state)",
    "docs/design.md §2 Bottleneck class (a capture's timeline)")
SHORT_GAPS_DOMINATE = Threshold(0.5, "half the idle in short gaps: the host issues work slower than the GPU "
                                     "runs it (launch-bound), not a host wait",
                                "docs/design.md §2 Bottleneck class (a capture's timeline)")
# --- step budget (perfd.analytics.breakdown.budget, budget_findings)
# ------------------------------------------
_BUDGET = "docs/design.md §2 Bottleneck class; perfd/analytics/breakdown/budget.py"
BUDGET_PART_NAMED = Threshold(0.01, "a part holding 1% of the step or more is named in a finding, with its "
                                    "ms", _BUDGET)
BUDGET_PART_REMEDY = Threshold(0.03, "a part holding 3% of the step or more gets its remedy, with the "
                                     "expected gain: below that a change is within a step's jitter", _BUDGET)
BUDGET_PART_WARN = Threshold(0.10, "a part holding a tenth of the step is worth a warning", _BUDGET)
GEMM_EFFICIENT = Threshold(0.6, "GEMMs running the model's FLOPs at 60% of the measured matmul ceiling or "
                                "more are efficient: the time to win is elsewhere (a large bf16 matmul "
                                "reaches ~790 of 989 TFLOP/s on an H100/H200: docs/design.md §2)", _BUDGET)
REMEDY_MIN_GAIN = Threshold(
    0.01, "a remedy is listed when the middle of its expected gain is 1% of the step or more: smaller "
    "changes "
    "hide in the run-to-run spread of a steady step (0.5–1% between two runs of one H100 Megatron-LM job, "
    "docs/evidence/remedies_h100)", _BUDGET)
CAPTURE_SLOWDOWN = Threshold(
    0.10, "a capture whose steps ran 10% or more above the steady step says so beside its budget: its idle "
    "parts hold the profiler's own cost (Kineto with Python stacks: +16% on an H100 Megatron-LM job, "
    "without: "
    "+3%; docs/evidence/remedies_h100)", _BUDGET)
CAPTURE_OTHER_JOB_STEP = Threshold(
    2.0, "a capture whose steps run more than twice the job's steady step (or under CAPTURE_FASTER_STEP of "
    "it) is not read as the profiler's cost: the most a timeline capture added here was +29% (Kineto on "
    "a launch-bound H100 Megatron-LM job, docs/evidence/ncu_answer_h100) and +16% with Python stacks; "
    "past twice, the capture is of another job or run (perfd.analytics.breakdown.capture_match)", _BUDGET)
CAPTURE_FASTER_STEP = Threshold(
    0.75, "a profiler never makes steps faster: captured steps under 75% of the job's steady step (a "
    "steady step's run-to-run spread is 0.5-1%, its jitter a few %) are another job's", _BUDGET)
LAUNCH_GAPS_FOR_GRAPHS = Threshold(
    0.15, "CUDA graphs are suggested only where short launch gaps hold 15% of the step or more: replaying "
    "costs input copies and breaks at syncs, and on an H100 Megatron-LM job with 6% of launch gaps they made "
    "the step 2% slower (docs/evidence/remedies_h100)", _BUDGET)
WINDOW_CUT = Threshold(
    0.25, "a part whose time at the capture window's edges is a quarter or more below what as many complete "
    "steps hold was cut by the window (Kineto's iteration-aligned window stops once the last step's host "
    "call returns: on an H100 Megatron-LM trace the third optimizer step kept 5.5 of its 21 ms)", _BUDGET)
WINDOW_CUT_MIN_MS = Threshold(
    1.0, "a part under 1 ms a step is not checked for a cut window: its edges move by more than that with "
    "where a kernel falls", _BUDGET)
MEMORY_HEADROOM = Threshold(
    0.9, "a remedy that costs memory (a larger micro-batch) is suggested only when the job's estimated peak "
    "stays within 90% of the GPU's memory (docs/design.md §2: healthy use is 80–90% of HBM)", _BUDGET)
CLASS_MIXED_MARGIN = Threshold(
    0.10, "a step budget names one class when that class's parts hold 10 points of the step more than any "
    "other's; closer than that the job is \"mixed\" and the shares say how "
    "(perfd.analytics.breakdown.budget)",
    "docs/design.md §2 Bottleneck class")

# --- Nsight Compute speed of light (perfd.analytics.breakdown.ncu_kernels: a kernel's class)
# -----------------------------
# NVIDIA's own SOLBottleneck rule (Nsight Compute sections/SpeedOfLight.py: latency_bound_threshold 60,
# no_bound_threshold 80, balanced_threshold 10), so perfd's class of a kernel says what ncu's report does.
_NCU = ("perfd/analytics/breakdown/ncu_kernels.py (NVIDIA's SOLBottleneck rule of Nsight Compute; "
        "docs/design.md has none)")
SOL_LATENCY = Threshold(0.60, "neither the SM pipelines nor the memory system reach 60% of their peak: "
                              "the kernel waits (latency: stalls, a small grid, low occupancy)", _NCU)
SOL_HIGH = Threshold(0.80, "a unit past 80% of its peak bounds the kernel whatever the other does", _NCU)
SOL_BALANCED_MARGIN = Threshold(0.10, "under the high bar, SM and memory within 10 points of each other "
                                      "are balanced: both must shrink to speed the kernel up", _NCU)
MIN_GRADE_STEPS = Threshold(
    5, "a grade (the MFU band, the bottleneck class, step jitter) is read over at least 5 steady steps: "
    "the warm-up takes the first 3 of a short log, and a median or a coefficient of variation over fewer "
    "than 5 steps is one step's value (a 4-iteration log was graded from 1 steady step); fewer, and the "
    "figure is shown with its count but not graded",
    "perfd/analytics/run/run_figures.py (docs/design.md has none; ARMING_MIN_STEPS's count)")
ARMING_MIN_STEPS = Threshold(
    5, "the cost of arming ncu on a rank is a median of at least 5 armed steps against at least 5 of the "
    "reference (its unarmed ranks, its own steps before it was armed): fewer, and one slow step decides it",
    "perfd/analytics/run/arming.py (docs/design.md has none)")
NCU_FUSION_DRAM = Threshold(
    0.60, "a pointwise or normalisation kernel moving DRAM at 60% of its peak or more is near what such a "
    "kernel reaches (NVIDIA's latency bar, SOL_LATENCY): a faster kernel gains little, only fewer bytes "
    "moved (fusing it into its neighbours) does", _NCU)
NCU_TENSOR_IDLE = Threshold(
    0.10, "a pointwise kernel ncu's rule calls compute-bound while its tensor pipes run under 10% does no "
    "matrix math: its SM work is issue slots and integer index arithmetic (a masked_fill at SM 65%, "
    "memory 36%, tensor 4% on the H100)", _NCU)
NCU_OCCUPANCY_CAP = Threshold(
    0.5, "a kernel without matrix math whose registers or shared memory cap its theoretical occupancy at "
    "half the SM's warps or less cannot hide its memory and dependency latencies, whatever ncu's rule reads "
    "of its SM: latency-bound (a softmax register-capped at 37.5% on the H100)", _NCU)
NCU_CLASS_COVERAGE = Threshold(
    0.5, "an Nsight Compute capture's rows decide the job's class (no timeline) only when the kernels "
    "they profiled hold at least half of the step's compute time: fewer, and the class would be the "
    "profiled kernels', not the step's", _NCU)

# --- GPU evidence (perfd.analytics.incidents.attribution)
# ------------------------------------------------------
STEADY_PRESENT = Threshold(0.5, "GPU evidence seen in half the rank's steady-state sightings is its normal "
                                "state (a GPU always at its power cap): it explains no incident",
                           "docs/design.md §2 Who is to blame")
STEADY_MARGIN = Threshold(
    0.15, "a host condition seen in steady state too (a shared machine's CPUs always contended) still "
    "explains an incident when it got worse by this much (a ratio's points: the rank waited for a CPU 80% "
    "of the time against 50% in steady state); GPU evidence is present or not, with no margin",
    "docs/design.md §2 Who is to blame")
CLOCK_DROP_RATIO = Threshold(0.95, "an SM clock 5% below the job's median GPU is a clock drop",
                             "docs/design.md §2 Stragglers (root-cause hints)")
HOT_DELTA_C = Threshold(10.0, "10 C above the job's median GPU is running hot",
                        "docs/design.md §2 Stragglers (root-cause hints)")
POWER_AT_LIMIT = Threshold(0.9, "sw_power_cap counts as a power cap only with the GPU drawing 90% of its "
                                "limit or more; NVML raises the flag for a moment far below it",
                           "docs/design.md §2 Stragglers (root-cause hints)")

# --- serving (docs/design.md §2 serving playbook) ----------------------------------------------------------
_S2 = "docs/design.md §2 Diagnosis playbook (serving)"


def _alert(name: str) -> str:
    """The operand of the serving alerts in deploy/prometheus/perfd.rules.yml."""
    return f"max by (job_name) (perfd_serving_{name})"


ITL_TAIL_RATIO = Threshold(3.0, "P99 inter-token latency above 3x the P50: decode is interrupted by "
                                "prefill chunks", _S2,
                           (RuleRef("serving", "serving_itl_tail", "itl_p99", ">", "5m"),
                            RuleRef("prometheus", "PerfdServingITLTail", _alert("itl_p99_seconds"), ">",
                                    "5m")))
TTFT_P99_HIGH_S = Threshold(2.0, "P99 time to first token above 2 s: long prefills or queueing", _S2,
                            (RuleRef("serving", "serving_ttft_high", "ttft_p99", ">", "5m"),
                             RuleRef("prometheus", "PerfdServingTTFTHigh", _alert("ttft_p99_seconds"), ">",
                                     "5m")))
PREFIX_HIT_LOW = Threshold(0.30, "under 30% of prompt tokens from the radix cache ...", _S2,
                           (RuleRef("serving", "serving_prefix_hit_low", "prefix_hit", "<", "10m"),
                            RuleRef("prometheus", "PerfdServingPrefixCacheHitLow",
                                    _alert("prefix_cache_hit_ratio"), "<", "10m")))
PREFIX_REUSE_BATCHES = Threshold(
    0.50, "... while half the prefill batches reuse a prefix: sharing the schedule misses", _S2,
    (RuleRef("serving", "serving_prefix_hit_low", "prefix_hit_batches", ">=", "10m"),
     RuleRef("prometheus", "PerfdServingPrefixCacheHitLow", _alert("prefix_cache_hit_batches_ratio"), ">=",
             "10m")))
KV_NEAR_FULL = Threshold(0.95, "KV pool 95% full: admissions wait, requests get retracted", _S2,
                         (RuleRef("serving", "serving_kv_near_full", "kv_usage", ">", "2m"),
                          RuleRef("prometheus", "PerfdServingKVCacheNearFull",
                                  _alert("kv_cache_usage_ratio"), ">", "2m")))
KV_LOW = Threshold(0.20, "KV pool under 20% used while requests queue: memory is not the limit", _S2,
                   (RuleRef("serving", "serving_kv_low_while_queued", "kv_usage", "<", "5m"),
                    RuleRef("prometheus", "PerfdServingKVCacheIdleWhileQueued",
                            _alert("kv_cache_usage_ratio"), "<", "5m")))
QUEUE_GROWTH_PER_S = Threshold(0.1, "queue growing by more than 6 requests a minute ...", _S2,
                               (RuleRef("serving", "serving_queue_growing_small_batch", "queue_growth",
                                        ">", "5m"),
                                RuleRef("prometheus", "PerfdServingQueueGrowing",
                                        _alert("queue_growth_requests_per_second"), ">", "5m")))
BATCH_SMALL = Threshold(0.50, "... while the running batch is under half of max_running_requests", _S2,
                        (RuleRef("serving", "serving_queue_growing_small_batch", "batch_fill", "<",
                                 "5m"),
                         RuleRef("prometheus", "PerfdServingQueueGrowing", _alert("batch_fill_ratio"),
                                 "<", "5m")))
CUDA_GRAPH_LOW = Threshold(0.90, "more than 10% of decode batches run eagerly (launch overhead)", _S2,
                           (RuleRef("serving", "serving_cuda_graph_low", "cuda_graph", "<", "10m"),))


# --- liveness ---------------------------------------------------------------------------------------
JOB_STALLED = Threshold(
    0.0, "any time stalled is a hang: a live stall (perfd.analytics.incidents.stall, seen within ~10 s with "
    "its "
    "corroboration, never during an announced save or evaluation) or past the stale limit "
    "(perfd.analytics.steps.liveness: 10 median steps, at least 60 s) with the job's processes alive; the "
    "minute of for: rides out an unannounced checkpoint or evaluation pass",
    "docs/design.md §2 Diagnosis playbook (hangs)",
    (RuleRef("default", "job_stalled", "stalled_seconds", ">", "1m",
             "the Prometheus alert PerfdJobStalled waits the same minute on perfd_job_state_info"),))

# --- goodput (perfd.analytics.steps.goodput) ---------------------------------------------------------------
_GP = "perfd/analytics/steps/goodput.py (perfd's own definition of goodput; docs/design.md §2 has none)"
GOODPUT_STALL_STEPS = Threshold(
    5.0, "time between two logged steps that neither the steps, a checkpoint save nor an evaluation "
    "explain is a stall once it exceeds five median steps (less is logging and host overhead)", _GP)
GOODPUT_STALL_FLOOR_S = Threshold(
    5.0, "... and at least 5 s: on a 40 ms step, five steps are a garbage-collection pause", _GP)


# --- perfd itself ------------------------------------------------------------------------------------
STATE_NEAR_CAP = Threshold(
    0.9, "the aggregator's --state-dir journal at 90% of --state-max-mib: past the cap the oldest "
    "journalled batches are pruned and a restart replays no more of them; for 15 minutes, so that a "
    "burst the pruning absorbs says nothing",
    "docs/design.md §4 Targets (an aggregator restart loses no acknowledged data)",
    (RuleRef("prometheus", "PerfdAggregatorStateNearCap",
             "perfd_aggregator_state_held_bytes / perfd_aggregator_state_max_bytes", ">", "15m"),))

ENGINE_ROOT_LAG_P99_S = Threshold(
    10.0, "the engine's root making iterations whole over 10 s after their last rank's step ended (p99 of "
    "the newest 1,000), for 10 minutes: four times the worst p99 measured (2.5 s, 100k ranks on a "
    "saturated 2-core VM), so only a root or shards falling behind, not a shard's takeover (its "
    "partitions' iterations wait the lease TTL and the ack wait, 16 s, for a few iterations)",
    "docs/scale.md Sizing (lag p50 / p99)",
    (RuleRef("prometheus", "PerfdEngineRootLagHigh",
             'perfd_engine_root_completion_lag_p99_seconds', ">", "10m"),))

ENGINE_STREAM_NEAR_LIMIT = Threshold(
    0.8, "an engine stream holding 80% of its byte limit, for 10 minutes: past the limit the engine lets "
    "the oldest messages go — on the nodes stream, node messages no shard took yet (shards down or behind); "
    "on the partials, records and events streams, the history a new root replays — so this says before the "
    "loss what PerfdEngineMessagesSkipped counts after it; 10 minutes, as a burst the shards absorb says "
    "nothing",
    "docs/scale.md, the engine's failure model (nothing lost, nothing doubled)",
    (RuleRef("prometheus", "PerfdEngineStreamNearLimit",
             "perfd_engine_stream_bytes / perfd_engine_stream_limit_bytes", ">", "10m"),))


def all_thresholds() -> dict[str, Threshold]:
    """Every threshold of perfd by name, this module's and perfd.core.shared_thresholds' (for the consistency
    test and the docs)."""
    return {**{k: v for k, v in globals().items() if isinstance(v, Threshold)}, **_shared.all_thresholds()}
