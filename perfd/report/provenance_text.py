"""Each provenance code's sentence (perfd.analytics.steps.provenance.Code), declared once, here:
the analytics return codes and numbers, and the English is made only where it is shown — the
report's metric sources, the JSON rows' legend (perfd.report.row_json), a finding that quotes a
metric's absence. A template is ``str.format`` over the code's arguments, positional: a nested
:class:`Cited` is its own sentence, a tuple of names is joined by commas, a record's provenance is
its text. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfd.analytics.steps.provenance import Arg, Cited, Code
from perfd.core.model import Provenance

TEMPLATE: dict[Code, str] = {
    # The record itself, the log's own figures.
    Code.RECORD: "{0}",
    Code.STEP_TIME: "{0}: step time",
    Code.LOSS: "{0}: loss",
    Code.QUOTED: "{0}",
    Code.STRAGGLER_LINE: "megatron: straggler detector line (MnRtt/MxRtt)",
    Code.NO_STRAGGLER_LINE: "{0}: {1}",
    # Throughput and MFU.
    Code.THROUGHPUT: "analytics:FLOPs/(step s·1e12·world={0}); {1}",
    Code.THROUGHPUT_LOGGED: "{0}:logged throughput per GPU (perfd's formula unavailable: {1})",
    Code.MFU: "analytics:model TFLOP/s per GPU ÷ {0}",
    # Shares of the step from timers.
    Code.TIMER_SHARE: "{0}:timer {1} ({2}) {3:g} ms ÷ step time {4:g} ms; {5}",
    Code.COMM_PER_RANK: "{0}:per-rank Σ({1}) on worst rank {2}: {3:.2f} ms ÷ step {4:g} ms; {5}",
    Code.COMM_ONE_MAX: "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms; {4}",
    Code.COMM_SUM_OF_MAX: "{0}:Σ max across ranks({1}) = {2:.2f} ms ÷ step {3:g} ms (maxima may come "
        "from different ranks: upper bound); {4}",
    # The pipeline.
    Code.NO_BUBBLE: "analytics:pp=1: no pipeline bubble",
    Code.BUBBLE_1F1B: "analytics:1F1B (p-1)/(m+p-1) = {0}/({1}+{0})",
    Code.BUBBLE_INTERLEAVED: "analytics:interleaved 1F1B (p-1)/(v·m+p-1) = {0}/({1}·{2}+{0})",
    Code.IDLE_RANK_MAX: "megatron:per-rank timers: rank {0} idle = 1 − (forward-compute + backward-compute)"
        " / forward-backward = 1 − {1:.2f}/{2:.2f}; {3}",
    Code.IDLE_RANK_MIN: "megatron:per-rank timers: rank {0} idle = 1 − {1:.2f}/{2:.2f}; {3}",
    Code.IDLE_LIGHTER: "megatron:1 − (forward-compute min {0:g} + backward-compute min {1:g}) / "
        "forward-backward max {2:g}; {3}",
    Code.IDLE_HEAVIER: "megatron:1 − (forward-compute max {0:g} + backward-compute max {1:g}) / "
        "forward-backward max {2:g}; {3}",
    Code.IMBALANCE: "analytics:max stage idle − analytic bubble: attributed to stage imbalance",
    Code.MINMAX_PAIRING: "inference: min forward paired with min backward (lighter stage), max with max "
        "(heavier stage); minmax timers do not say which rank holds which value",
    # Absent: why.
    Code.UNKNOWN: "unknown",
    Code.WHY: "{0}",
    # A step source's reasons (perfd.analytics.steps.vocabulary.Vocabulary).
    Code.NO_OWN_THROUGHPUT: "the source states no throughput of its own",
    Code.NO_STRAGGLER_PER_RANK: "no straggler line: the per-rank step records only",
    Code.OUTSIDE_IN_STEP: "the source's step time covers the whole iteration",
    Code.MEGATRON_NO_DATA_TIMER: "no batch-generator timer (needs --timing-log-level >= 1)",
    Code.MEGATRON_NO_COMM_TIMERS: "no communication timers in the log (needs --timing-log-level >= 1; p2p "
        "timers need level 2)",
    Code.MEGATRON_NO_THROUGHPUT: "not in the log (needs --log-throughput)",
    Code.MEGATRON_NO_STRAGGLER: "timers only (no straggler line; needs --log-straggler)",
    Code.HOOK_NO_DATA_WAIT: "the step hook reported no data wait (iterate the loader through "
        "hook.loader(...), or call hook.data_ready() once the batch is in)",
    Code.HOOK_NO_COMM: "the step hook does not time communication: the total share comes from the Flight "
        "Recorder (perfd launch --flight-recorder --fr-timing)",
    Code.HOOK_NO_OUTSIDE: "no time between the steps measured (the first step of a series, or a hook older "
        "than the step period)",
    Code.TORCHTITAN_NO_DATA: "torchtitan's log line has no data-loading time (only its TensorBoard/W&B "
        "metrics do): add the perfd step hook for it",
    Code.TORCHTITAN_NO_COMM: "torchtitan's log does not time communication: the total share comes from the "
        "Flight Recorder (perfd launch --flight-recorder --fr-timing)",
    Code.TORCHTITAN_NO_THROUGHPUT: "no tflops on the step line",
    Code.TORCHTITAN_NO_STRAGGLER: "no straggler line: per-rank step lines ([rankN]: prefix) only",
    Code.NO_LOSS: "no loss on this iteration (a NaN loss removes the field)",
    Code.MISSING: "missing {0}",
    Code.MISSING_NOTED: "missing {0}; {1}",
    Code.NON_POSITIVE: "non-positive step time {0} ms or world {1}",
    Code.NO_STEP_TIME: "step time absent",
    Code.NO_TIMERS: "no {0} timers present",
    Code.FLOPS_UNKNOWN: "model FLOPs unknown",
    Code.THROUGHPUT_UNKNOWN: "throughput unknown",
    Code.PEAK_UNKNOWN: "peak TFLOP/s unknown",
    Code.PP_UNKNOWN: "pipeline-parallel size unknown",
    Code.MICROBATCHES_UNKNOWN: "micro-batches per iteration unknown",
    Code.NO_STAGES: "pp=1: no pipeline stages",
    Code.NO_STAGE_TIMERS: "forward-backward / forward-compute / backward-compute timers absent (needs "
        "--timing-log-level >= 1)",
    Code.MAX_ONLY: "max-only timers (--timing-log-option max): per-stage idle needs min and max (minmax) "
        "or per-rank values (all)",
    Code.FB_ZERO: "forward-backward timer is zero",
    Code.IMBALANCE_INPUTS: "needs the measured stage idle and the analytic bubble",
    # Where a peak comes from.
    Code.FROM_GPU_TABLE: "gpus:{0}",
    Code.FROM_CONFIG: "config:{0}",
    Code.PEAK_TABLE: "peak table: {0} {1} {2:g} TFLOP/s ({3})",
    Code.PEAK_OVERRIDE: "peak_tflops={0:g} (explicit override)",
    Code.PEAK_VALUE: "peak {0:g}",
    Code.BANDWIDTH_TABLE: "bandwidth table: {0} {1:g} TB/s ({2})",
    Code.BANDWIDTH_OVERRIDE: "peak_bandwidth={0:g} B/s (override)",
    # Why there is no peak.
    Code.PEAK_NOT_POSITIVE: "configured peak {0} TFLOP/s is not positive",
    Code.PEAK_NO_GPU: "GPU name unknown; give the GPU (--gpu NAME, as NVML names it) or its peak "
        "(--peak-tflops N) to get MFU",
    Code.PEAK_GPU_UNLISTED: "GPU {0!r} not in the peak table; give the GPU (--gpu NAME, as NVML names it) or "
        "its peak (--peak-tflops N) to get MFU",
    Code.PEAK_NO_DTYPE: "training dtype unknown (give --dtype, e.g. bf16)",
    Code.PEAK_DTYPE_UNRECOGNISED: "dtype {0!r} not recognised (--dtype takes one of {1})",
    Code.PEAK_NO_FIGURE: "no {0} peak known for {1}",
    Code.PEAK_CPU_ONLY: "the job computes on CPUs (no CUDA in its processes): MFU is measured against a "
        "GPU's peak; --peak-tflops gives one for its CPUs",
    Code.BANDWIDTH_NOT_POSITIVE: "configured bandwidth {0} is not positive",
    Code.BANDWIDTH_NO_GPU: "GPU name unknown; give --gpu or the peak bandwidth",
    Code.BANDWIDTH_GPU_UNLISTED: "GPU {0!r} not in the bandwidth table; give the peak bandwidth in config",
    # Serving.
    Code.SG_LOG: "sglang-log:{0}",
    Code.SG_METRICS: "sglang-metrics:{0} ({1})",
    Code.SG_ANALYTICS: "analytics:{0}",
    Code.SG_CONFIG: "config:{0}",
    Code.SG_PER_GROUP_ONE: "{0} over {1}",
    Code.SG_PER_GROUP_SUM: "{0} over {1}, summed over {2} DP groups",
    Code.SG_PER_GROUP_MEAN: "{0} over {1}, averaged over {2} DP groups",
    Code.SG_NO_LINES: "no lines",
    Code.SG_ONE_LINE: "1 line (log line {0})",
    Code.SG_LINES: "{0} line(s), log lines {1}–{2}",
    Code.SG_GEN_TPUT: "mean of 'gen throughput (token/s)'",
    Code.SG_INPUT_TPUT: "mean of 'input throughput (token/s)'",
    Code.SG_INPUT_FROM_SPAN: "Σ '#new-token' of prefill lines after the first line ÷ the lines' time span",
    Code.SG_RUNNING: "mean of '#running-req' (decode lines, else prefill lines)",
    Code.SG_QUEUE: "mean of '#queue-req'",
    Code.SG_QUEUE_SLOPE: "least-squares slope of '#queue-req' over time",
    Code.SG_KV_USAGE: "mean of 'token usage' (hybrid models: the fuller pool)",
    Code.SG_HIT_TOKENS: "Σ'#cached-token' ÷ Σ('#new-token' + '#cached-token')",
    Code.SG_LAST_HIT_RATE: "last 'cache hit rate' (SGLang ≤ 0.4: cumulative since start)",
    Code.SG_HIT_BATCHES: "share of prefill lines with '#cached-token' > 0",
    Code.SG_CUDA_GRAPH: "share of decode lines with 'cuda graph: True'",
    Code.SG_ACCEPT_LEN: "mean of 'accept len'",
    Code.SG_BATCH_FILL: "running requests ÷ max_running_requests={0} (start-up line)",
    Code.SG_GAUGE: "{0}, {1} of {2} series (lowest TP/PP rank kept)",
    Code.SG_GAUGE_NOTED: "{0}, {1} of {2} series (lowest TP/PP rank kept); {3}",
    Code.SG_HIT_GAUGE_CAVEAT: "last prefill batch only; decode logs set 0",
    Code.SG_OVER_SECONDS: "{0} over {1:.1f} s",
    Code.SG_RATE: "rate of {0}",
    Code.SG_RATE_MINUS: "rate of {0} − rate of {1} (computed, not cached)",
    Code.SG_RATE_WITH_CACHED: "rate of {0} (includes cached prompt tokens: no cached_tokens_total)",
    Code.SG_HIT_COUNTERS: "Δ sglang:cached_tokens_total ÷ Δ sglang:prompt_tokens_total over {0:.1f} s",
    Code.SG_QUANTILE: "histogram_quantile({0:g}) of {1}: {2}, {3} series summed by le, {4:g} observations, "
        "linear interpolation within the bucket (as Prometheus)",
    Code.SG_QUANTILE_RESETS: "{0}; {1} series reset between scrapes (counted from the reset)",
    Code.SG_QUANTILE_LEFT_OUT: "{0}; {1} series with other bucket bounds left out",
    Code.SG_BUCKETS_DELTA: "Δ of cumulative buckets between two scrapes {0:.1f} s apart",
    Code.SG_BUCKETS_LIFETIME: "cumulative buckets since the server started (one scrape only)",
    Code.SG_MFU: "{0} × {1} ({2}) ÷ ({3} GPUs × peak; {4})",
    Code.SG_MBU: "per GPU (weights {0:.3g} B [{1}] + '#token' × {2:.3g} B/token [{3}]) × steps/s ('gen "
        "throughput' ÷ ('#running-req' × tokens per step)) ÷ {4:g} TB/s [{5}], mean over {6}",
    Code.SG_KV_INFERRED: "{0}; KV tokens = token usage × max_total_num_tokens (inferred)",
    Code.SG_WEIGHT_BYTES: "weight_bytes={0:g}",
    Code.SG_PARAMS_QUANT: "params={0:g} × 1 B (quantization {1})",
    Code.SG_PARAMS_DTYPE: "params={0:g} × {1:g} B ({2}, {3})",
    Code.SG_DTYPE_CONFIG: "config dtype",
    Code.SG_DTYPE_SERVER_ARGS: "server_args dtype",
    Code.SG_DTYPE_LOAD_WEIGHT: "'Load weight end' dtype",
    Code.SG_KV_BYTES: "kv_bytes_per_token={0:g}",
    Code.SG_KV_FORMULA: "2 × {0} layers × {1} KV heads × {2} head dim × {3:g} B ({4})",
    Code.SG_KV_DTYPE_MODEL: "KV dtype = model dtype {0}",
    Code.SG_KV_DTYPE_GIVEN: "KV dtype {0}",
    Code.SG_KV_REPLICATED: "{0} × {1:g} (KV heads replicated)",
    Code.SG_PER_GPU: "{0} ÷ {1} GPUs",
    Code.SG_WEIGHTS_LOGGED: "'Load weight end' mem usage={0:.2f} GB per GPU",
    Code.SG_KV_LOGGED: "'KV Cache is allocated' {0:.2f} GB ÷ {1} tokens per GPU",
    Code.SG_FLOPS_PER_TOKEN: "2 × {0}={1:g} FLOPs per token",
    Code.SG_GPUS_CONFIG: "config gpus={0} over {1} DP group(s)",
    Code.SG_GPUS_TP_PP: "TP={0} × PP={1} per DP group",
    Code.SG_WINDOW: "{0} batch lines over {1:.0f} s",
    Code.SG_WINDOW_NO_SPAN: "{0} batch lines (no time span)",
    Code.SG_NO_BATCH_LINES: "no batch lines",
    Code.SG_BOTH: "{0}; {1}",
    Code.SG_TPUT_ABSENT: "{0} absent: {1}",
    Code.SG_NO_GEN_TPUT: "no decode lines with 'gen throughput' and no sglang:generation_tokens_total rate",
    Code.SG_NO_INPUT_TPUT: "no 'input throughput' logged, prefill lines without a time span, and no token "
        "counters",
    Code.SG_NO_RUNNING: "no '#running-req' in the log and no sglang:num_running_reqs",
    Code.SG_NO_QUEUE: "no '#queue-req' in the log and no sglang:num_queue_reqs",
    Code.SG_QUEUE_POINTS: "queue growth needs ≥ {0} timestamped lines with '#queue-req'",
    Code.SG_NO_KV_USAGE: "no 'token usage' in the log and no sglang:token_usage",
    Code.SG_NO_MRR: "max_running_requests unknown (start-up line not in the log)",
    Code.SG_NO_RUNNING_FOR_FILL: "running requests absent",
    Code.SG_NO_HIT: "no prefill lines with '#cached-token' and no cached/prompt token counters",
    Code.SG_NO_HIT_BATCHES: "no prefill lines with '#cached-token'",
    Code.SG_NO_CUDA_GRAPH: "decode lines print no 'cuda graph' (SGLang < 0.4.9) or no decode lines",
    Code.SG_NO_ACCEPT_LEN: "no speculative decoding ('accept len') logged",
    Code.SG_NO_SCRAPE: "no /metrics scrape ({0} comes only from SGLang --enable-metrics)",
    Code.SG_TWO_SCRAPES: "needs two scrapes: percentiles are over the window between them",
    Code.SG_NOT_EXPOSED: "{0} not exposed by {1}",
    Code.SG_NO_OBSERVATIONS: "no observations",
    Code.SG_NO_OBSERVATIONS_OF: "no {0} observations in the window",
    Code.SG_NO_MBU_LINES: "no decode lines with 'gen throughput', '#running-req' > 0 and KV tokens in use",
    Code.SG_QUANT_UNKNOWN: "quantization {0!r}: bytes per weight unknown; give weight_bytes",
    Code.SG_NO_WEIGHT_DTYPE: "weight bytes: {0}",
    Code.SG_DTYPE_UNKNOWN: "dtype unknown (server_args dtype 'auto' or absent): give the model dtype",
    Code.SG_KV_MISSING: "KV bytes per token: {0} unknown",
    Code.SG_WEIGHTS_PER_GPU_UNKNOWN: "weights per GPU: {0}",
    Code.SG_KV_PER_GPU_UNKNOWN: "KV per GPU: {0}",
    Code.SG_WEIGHTS_UNKNOWN: "weight bytes unknown: give --model-params (or the log's 'Load weight end ... "
        "mem usage' line)",
    Code.SG_KV_UNKNOWN: "KV bytes per token unknown: give layers, KV heads, head dim (or "
        "--kv-bytes-per-token), or keep the log's 'KV Cache is allocated' line",
    Code.SG_PARAMS_UNKNOWN: "model parameter count unknown (--model-params)",
    Code.SG_GPUS_UNKNOWN: "GPUs per DP group unknown",
    Code.SG_TP_UNKNOWN: "tensor-parallel size unknown (no server_args line; give --tp or --gpus)",
    Code.SG_DP_ATTENTION: "DP attention shares the TP GPUs between DP groups: give --gpus",
    Code.SG_PEAK_FLOPS_UNKNOWN: "peak FLOP/s unknown",
    Code.SG_PEAK_BANDWIDTH_UNKNOWN: "peak bandwidth unknown",
    # Notes of the straggler check.
    Code.RTT_BETWEEN_STAGES: "rtt spread > {0:g}× between rank {1} (stage {2}) and rank {3} (stage {4}): "
        "stage imbalance, not a straggler",
    Code.RTT_STAGES_UNKNOWN: "rtt spread > {0:g}× but the ranks' pipeline stages are unknown",
    Code.SPREAD_WITH_PP: "compute timer spread with pp>1 reflects stage imbalance, not stragglers",
    Code.PER_RANK_NO_PP: "per-rank timers: pipeline size unknown, ranks not compared",
    Code.PER_RANK_NO_STAGE: "per-rank timers: pipeline stage of ranks unknown, not compared",
    Code.PER_RANK_INSTEAD: "per-rank timers present: compared per rank instead of the min/max spread",
    # Why a row is out of the steady state.
    Code.WARMUP_ROWS: "warm-up (first {0} records)",
    Code.CAPTURED: "disturbed by a perfd capture",
    Code.NO_STEP: "no step time",
    Code.ARMED_STEP: "armed: its rank runs under a profiler (perfd ncu-exec): the profiler's step, not the "
        "job's",
    Code.OUTLIER_STEP: "step {0:g} ms > {1:g}× the steady {2:.4g} ms a step",
    Code.IN_INCIDENT: "incident {0}",
    Code.IN_CAPTURE: "perfd capture ({0})",
    Code.IN_PAUSE: "the loop's own pause at a cadence ({0})",
    # How the FLOPs count was made, or why there is none.
    Code.FLOPS_NOTES: "{0}; {1}",
    Code.FLOPS_MLA: "multi-latent attention: perfd's formula does not model MLA yet",
    Code.FLOPS_MOE_FFN_FALLBACK: "moe_ffn_hidden_size unset: Megatron uses ffn_hidden_size",
    Code.FLOPS_VERSION_UNKNOWN: "Megatron-Core version unknown: assumed current (>=0.12, causal-halved "
        "attention)",
    Code.FLOPS_VERSION_UNPARSEABLE: "Megatron-Core version unparseable ({0!r}): assumed current (>=0.12, "
        "causal-halved attention)",
    Code.FLOPS_LAYERS_OUT_OF_BOUNDS: "num_layers {0} outside [{1}, {2}]",
    Code.FLOPS_MOE_FREQ_NOT_POSITIVE: "moe_layer_freq {0} is not positive",
    Code.FLOPS_MOE_PATTERN_LENGTH: "moe_layer_freq pattern has {0} entries, num_layers is {1}",
    Code.FLOPS_6N_NO_ATTENTION: "6·N·tokens ignores the attention-score FLOPs: it reads low for long "
        "sequences",
    Code.FLOPS_FORMULA_UNAVAILABLE: "Megatron formula unavailable (missing: {0})",
    Code.FLOPS_TOKENS_NO_SPEC: "tokens_per_step known, but no model spec to count FLOPs per token (StepHook "
        "flops_per_step=, or model= with the model's shape)",
    # Where the training dtype comes from.
    Code.DTYPE_ARGUMENT: "argument",
    Code.DTYPE_MODEL_SPEC: "model spec",
    Code.DTYPE_FLAG: "arguments: {0}",
    Code.DTYPE_NO_FLAG: "arguments: neither bf16 nor fp16",
}


def _shown(a: Arg) -> object:
    if isinstance(a, Cited):
        return text(a)
    if isinstance(a, tuple):
        return ", ".join(a)
    if isinstance(a, Provenance):
        return str(a)
    return a


def text(c: Cited) -> str:
    """The sentence alone: a source's detail, an absence's reason (as another sentence quotes it)."""
    return TEMPLATE[c.code].format(*map(_shown, c.args))


def line(c: Cited) -> str:
    """The sentence as a metric's source reads: ``absent: why``, or the source with its caveat."""
    if c.absent:
        return f"absent: {text(c)}"
    out = text(c)
    return f"{out} [{TEMPLATE[c.caveat]}]" if c.caveat is not None else out


def lines(sources: Mapping[str, Cited]) -> dict[str, str]:
    """Every metric's source as it reads (the legend, the report)."""
    return {k: line(c) for k, c in sources.items()}
