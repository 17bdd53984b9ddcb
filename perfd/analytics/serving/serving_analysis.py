"""Serving analytics (SGLang): job-level numbers from logged batches and ``/metrics`` scrapes. Pure.

Entry points, shared by the CLI (``perfd analyze sglang``), the collector and the aggregator so
offline and live numbers cannot drift apart:

- ``summarize(records, server, scrape, prev_scrape, spec, ...) -> ServingSummary``: every number
  as a MetricValue (value + source, or None + reason);
- ``serving_job_metrics(records_or_window, ...) -> {catalog name: value}``: only present values;
- ``ServingWindow``: a bounded, time-windowed accumulator (records + scrapes) the aggregator holds
  per job (perfd/aggregator/serving.py, from the records the SGLang collector sends);
- ``analyze_serving(...) -> ServingAnalysis``: summary + findings + recommendations (offline: all
  records at once); ``analyze_window(job, window)`` the same over a live window.

How log lines from several schedulers combine: each line belongs to the scheduler that printed it,
named by its DP tag (TP/PP/EP ranks print the same numbers, or only rank 0 prints). Per scheduler
perfd averages over the window's lines; counts and throughputs are then summed over schedulers,
ratios averaged. Sources say how many lines and schedulers a number covers.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.common import MetricValue
from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.serving import histogram as sh
from perfd.analytics.serving.spec import (
    Resolved,
    decode_bytes_per_step,
    decode_step_rate,
    gpus_per_group,
    peaks,
    resolve,
)
from perfd.model import Provenance
from perfd.serving_model import ServingModelSpec
from perfd.serving_records import MetricsSnapshot, ServerInfo, ServingRecord

# summary key -> catalog name (perfd/catalog.py, "serving" section)
CATALOG_NAMES: dict[str, str] = {
    "input_throughput": "perfd_serving_input_throughput_tokens_per_second",
    "gen_throughput": "perfd_serving_gen_throughput_tokens_per_second",
    "running_requests": "perfd_serving_running_requests",
    "queued_requests": "perfd_serving_queued_requests",
    "queue_growth": "perfd_serving_queue_growth_requests_per_second",
    "batch_fill": "perfd_serving_batch_fill_ratio",
    "kv_usage": "perfd_serving_kv_cache_usage_ratio",
    "prefix_hit": "perfd_serving_prefix_cache_hit_ratio",
    "prefix_hit_batches": "perfd_serving_prefix_cache_hit_batches_ratio",
    "ttft_p50": "perfd_serving_ttft_p50_seconds",
    "ttft_p99": "perfd_serving_ttft_p99_seconds",
    "itl_p50": "perfd_serving_itl_p50_seconds",
    "itl_p99": "perfd_serving_itl_p99_seconds",
    "e2e_p50": "perfd_serving_e2e_latency_p50_seconds",
    "e2e_p99": "perfd_serving_e2e_latency_p99_seconds",
    "cuda_graph": "perfd_serving_cuda_graph_ratio",
    "spec_accept_length": "perfd_serving_spec_accept_length",
    "decode_mbu": "perfd_serving_decode_mbu_ratio",
    "decode_mfu": "perfd_serving_decode_mfu_ratio",
    "prefill_mfu": "perfd_serving_prefill_mfu_ratio",
}

HIST_TTFT = ("sglang:time_to_first_token_seconds",)
# inter_token_latency_seconds (0.4.9+) replaced time_per_output_token_seconds (0.3.x-0.4.x)
HIST_ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
HIST_E2E = ("sglang:e2e_request_latency_seconds",)
MIN_SLOPE_POINTS = 3


@dataclass
class ServingSummary:
    values: dict[str, MetricValue]
    extras: dict[str, object] = field(default_factory=dict)  # what the efficiency figures were read from

    def value(self, key: str) -> float | None:
        mv = self.values.get(key)
        return None if mv is None else mv.value

    def job_metrics(self) -> dict[str, float]:
        """{catalog name: value} for every present, finite value."""
        out: dict[str, float] = {}
        for key, name in CATALOG_NAMES.items():
            v = self.value(key)
            if v is not None and math.isfinite(v):
                out[name] = float(v)
        return out

    def to_json(self) -> dict[str, object]:
        vals = {k: {"value": (mv.value if mv.value is None or math.isfinite(mv.value) else None),
                    "source": str(mv.source) if mv.source else None, "reason": mv.reason}
                for k, mv in self.values.items()}
        return {"values": vals, "metrics": self.job_metrics(), **self.extras}


# --- helpers ---------------------------------------------------------------------------------------

def _mean(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    try:
        return statistics.fmean(v) if v else None
    except OverflowError:  # finite values whose sum is not (a scrape past perfd.bounds): no mean
        return None


def _lines(recs: Sequence[ServingRecord]) -> str:
    if not recs:
        return "no lines"
    lo, hi = min(r.line_no for r in recs), max(r.line_no for r in recs)
    return f"{len(recs)} line(s), log lines {lo}–{hi}" if lo != hi else f"1 line (log line {lo})"


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, y); None with fewer than 3 points or no time spread."""
    if len(points) < MIN_SLOPE_POINTS:
        return None
    mt = statistics.fmean(p[0] for p in points)
    my = statistics.fmean(p[1] for p in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    if den <= 0:
        return None
    return sum((t - mt) * (y - my) for t, y in points) / den


def _log(detail: str) -> Provenance:
    return Provenance("sglang-log", detail)


def _per_group(groups: dict[str, list[ServingRecord]], fn: Callable[[list[ServingRecord]], float | None],
               how: str, what: str, pick: Callable[[ServingRecord], bool]) -> MetricValue | None:
    """Apply ``fn`` per scheduler and combine (sum or mean); None when no scheduler has a value."""
    vals: list[float] = []
    used: list[ServingRecord] = []
    for recs in groups.values():
        v = fn(recs)
        if v is not None:
            vals.append(v)
            used.extend(r for r in recs if pick(r))
    if not vals:
        return None
    value = sum(vals) if how == "sum" else statistics.fmean(vals)
    verb = "summed" if how == "sum" else "averaged"
    comb = "" if len(vals) == 1 else f", {verb} over {len(vals)} DP groups"
    return MetricValue(value, _log(f"{what} over {_lines(used)}{comb}"))


# --- the summary -----------------------------------------------------------------------------------

def summarize(records: Sequence[ServingRecord], server: ServerInfo | None = None,
              scrape: MetricsSnapshot | None = None, prev_scrape: MetricsSnapshot | None = None,
              spec: ServingModelSpec | None = None, gpu_name: str | None = None,
              peak_tflops: float | None = None, peak_bandwidth: float | None = None,
              lifetime_percentiles: bool = False) -> ServingSummary:
    """Every serving number over ``records`` (the window) and the scrape pair (prev, cur].

    ``lifetime_percentiles``: with one scrape only, report percentiles over the server's lifetime
    (offline analysis of one file); otherwise they need two scrapes.
    """
    spec = spec or ServingModelSpec()
    groups: dict[str, list[ServingRecord]] = {}
    for r in records:
        groups.setdefault(r.group(), []).append(r)
    pre, dec, anyk = _is_prefill, _is_decode, _any
    v: dict[str, MetricValue] = {}

    def put(key: str, *cands: MetricValue | None, reason: str) -> None:
        v[key] = next((c for c in cands if c is not None and c.value is not None), MetricValue.absent(reason))

    # throughput
    put("gen_throughput",
        _per_group(groups, lambda rs: _mean(r.gen_throughput for r in rs if dec(r)), "sum",
                   "mean of 'gen throughput (token/s)'", dec),
        _scrape_rate(scrape, prev_scrape, "sglang:generation_tokens_total", None),
        _scrape_gauge(scrape, "sglang:gen_throughput", "sum"),
        reason="no decode lines with 'gen throughput' and no sglang:generation_tokens_total rate")
    put("input_throughput",
        _per_group(groups, lambda rs: _mean(r.input_throughput for r in rs if pre(r)), "sum",
                   "mean of 'input throughput (token/s)'", pre),
        _per_group(groups, _input_rate_from_span, "sum",
                   "Σ '#new-token' of prefill lines after the first line ÷ the lines' time span", pre),
        _scrape_rate(scrape, prev_scrape, "sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
        reason="no 'input throughput' logged, prefill lines without a time span, and no token counters")
    # load
    put("running_requests",
        _per_group(groups, _running, "sum", "mean of '#running-req' (decode lines, else prefill lines)",
                   anyk),
        _scrape_gauge(scrape, "sglang:num_running_reqs", "sum"),
        reason="no '#running-req' in the log and no sglang:num_running_reqs")
    put("queued_requests",
        _per_group(groups, lambda rs: _mean(float(r.queue_req) for r in rs if r.queue_req is not None), "sum",
                   "mean of '#queue-req'", anyk),
        _scrape_gauge(scrape, "sglang:num_queue_reqs", "sum"),
        reason="no '#queue-req' in the log and no sglang:num_queue_reqs")
    put("queue_growth",
        _per_group(groups, _queue_slope, "sum", "least-squares slope of '#queue-req' over time", anyk),
        reason=f"queue growth needs ≥ {MIN_SLOPE_POINTS} timestamped lines with '#queue-req'")
    put("kv_usage",
        _per_group(groups, lambda rs: _mean(r.kv_usage() for r in rs), "mean",
                   "mean of 'token usage' (hybrid models: the fuller pool)", anyk),
        _scrape_gauge(scrape, "sglang:token_usage", "mean"),
        reason="no 'token usage' in the log and no sglang:token_usage")
    mrr = server.max_running_requests if server else None
    run = v["running_requests"].value
    fill_src = Provenance("analytics", f"running requests ÷ max_running_requests={mrr} (start-up line)")
    put("batch_fill", MetricValue(run / mrr, fill_src) if run is not None and mrr else None,
        reason=("max_running_requests unknown (start-up line not in the log)" if not mrr
                else "running requests absent"))
    # prefix cache
    put("prefix_hit",
        _per_group(groups, _hit_ratio, "mean", "Σ'#cached-token' ÷ Σ('#new-token' + '#cached-token')", pre),
        _scrape_hit(scrape, prev_scrape),
        _per_group(groups, _last_cache_hit_rate, "mean",
                   "last 'cache hit rate' (SGLang ≤ 0.4: cumulative since start)", pre),
        _scrape_gauge(scrape, "sglang:cache_hit_rate", "mean",
                      caveat="last prefill batch only; decode logs set 0"),
        reason="no prefill lines with '#cached-token' and no cached/prompt token counters")
    put("prefix_hit_batches",
        _per_group(groups, _hit_batches, "mean", "share of prefill lines with '#cached-token' > 0", pre),
        reason="no prefill lines with '#cached-token'")
    put("cuda_graph",
        _per_group(groups, lambda rs: _mean(float(bool(r.cuda_graph)) for r in rs
                                            if dec(r) and r.cuda_graph is not None), "mean",
                   "share of decode lines with 'cuda graph: True'", dec),
        reason="decode lines print no 'cuda graph' (SGLang < 0.4.9) or no decode lines")
    put("spec_accept_length",
        _per_group(groups, lambda rs: _mean(r.accept_len for r in rs if dec(r)), "mean", "mean of 'accept "
                                                                                         "len'", dec),
        _scrape_gauge(scrape, "sglang:spec_accept_length", "mean"),
        reason="no speculative decoding ('accept len') logged")
    # latency percentiles
    for key, names, q in (("ttft_p50", HIST_TTFT, 0.5), ("ttft_p99", HIST_TTFT, 0.99),
                          ("itl_p50", HIST_ITL, 0.5), ("itl_p99", HIST_ITL, 0.99),
                          ("e2e_p50", HIST_E2E, 0.5), ("e2e_p99", HIST_E2E, 0.99)):
        v[key] = _percentile(scrape, prev_scrape, names, q, lifetime_percentiles)
    extras = _efficiency(v, groups, server, spec, gpu_name, peak_tflops, peak_bandwidth)
    extras.update(records=len(records), prefill_lines=sum(1 for r in records if pre(r)),
                  decode_lines=sum(1 for r in records if dec(r)), dp_groups=sorted(groups) or [],
                  window=_span_text(records))
    return ServingSummary(v, extras)


def _is_prefill(r: ServingRecord) -> bool:
    return r.kind == "prefill"


def _is_decode(r: ServingRecord) -> bool:
    return r.kind == "decode"


def _any(r: ServingRecord) -> bool:
    return True


def _span_text(records: Sequence[ServingRecord]) -> str:
    ts = [t for t in (r.timeline() for r in records) if t is not None]
    if not records:
        return "no batch lines"
    if len(ts) >= 2:
        return f"{len(records)} batch lines over {max(ts) - min(ts):.0f} s"
    return f"{len(records)} batch lines (no time span)"


def _input_rate_from_span(rs: list[ServingRecord]) -> float | None:
    pts = [(r.timeline(), r) for r in rs if r.timeline() is not None]
    if len(pts) < 2:
        return None
    t0 = min(t for t, _ in pts if t is not None)
    t1 = max(t for t, _ in pts if t is not None)
    if t1 - t0 < 1.0:
        return None
    toks = sum(r.new_tokens or 0 for t, r in pts if r.kind == "prefill" and t is not None and t > t0)
    if not any(r.kind == "prefill" and r.new_tokens is not None for _, r in pts):
        return None
    return toks / (t1 - t0)


def _running(rs: list[ServingRecord]) -> float | None:
    d = [float(r.running_req) for r in rs if r.kind == "decode" and r.running_req is not None]
    p = [float(r.running_req) for r in rs if r.kind == "prefill" and r.running_req is not None]
    return _mean(d or p)


def _last_cache_hit_rate(rs: list[ServingRecord]) -> float | None:
    return next((r.cache_hit_rate for r in reversed(rs) if r.cache_hit_rate is not None), None)


def _queue_slope(rs: list[ServingRecord]) -> float | None:
    pts = [(t, float(r.queue_req)) for r in rs if (t := r.timeline()) is not None and r.queue_req is not None]
    return _slope(pts)


def _hit_ratio(rs: list[ServingRecord]) -> float | None:
    both = [r for r in rs if r.kind == "prefill" and r.new_tokens is not None and r.cached_tokens is not None]
    total = sum((r.new_tokens or 0) + (r.cached_tokens or 0) for r in both)
    return sum(r.cached_tokens or 0 for r in both) / total if total > 0 else None


def _hit_batches(rs: list[ServingRecord]) -> float | None:
    c = [r.cached_tokens for r in rs if r.kind == "prefill" and r.cached_tokens is not None]
    return sum(1 for x in c if x > 0) / len(c) if c else None


def _metrics(detail: str, scrape: MetricsSnapshot) -> Provenance:
    return Provenance("sglang-metrics", f"{detail} ({scrape.source})")


def _scrape_gauge(scrape: MetricsSnapshot | None, name: str, how: str,
                  caveat: str = "") -> MetricValue | None:
    if scrape is None:
        return None
    val, n = sh.gauge_value(scrape, name, how)
    if val is None:
        return None
    extra = f"; {caveat}" if caveat else ""
    return MetricValue(val, _metrics(f"{name}, {how} of {n} series (lowest TP/PP rank kept){extra}", scrape))


def _scrape_rate(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None, name: str,
                 minus: str | None) -> MetricValue | None:
    if cur is None or prev is None:
        return None
    rate = sh.counter_rate(name, cur, prev)
    if rate is None:
        return None
    what = f"rate of {name}"
    if minus is not None:
        sub = sh.counter_rate(minus, cur, prev)
        if sub is not None:
            rate, what = rate - sub, f"rate of {name} − rate of {minus} (computed, not cached)"
        else:
            what += " (includes cached prompt tokens: no cached_tokens_total)"
    return MetricValue(rate, _metrics(f"{what} over {cur.time - prev.time:.1f} s", cur))


def _scrape_hit(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None) -> MetricValue | None:
    if cur is None or prev is None:
        return None
    cached = sh.counter_increase("sglang:cached_tokens_total", cur, prev)
    prompt = sh.counter_increase("sglang:prompt_tokens_total", cur, prev)
    if cached is None or not prompt:
        return None
    return MetricValue(cached / prompt, _metrics("Δ sglang:cached_tokens_total ÷ Δ "
                                                 "sglang:prompt_tokens_total "
                                                 f"over {cur.time - prev.time:.1f} s", cur))


def _percentile(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None, names: Sequence[str], q: float,
                lifetime_ok: bool) -> MetricValue:
    if cur is None:
        return MetricValue.absent(f"no /metrics scrape ({names[0]} comes only from SGLang --enable-metrics)")
    if prev is None and not lifetime_ok:
        return MetricValue.absent("needs two scrapes: percentiles are over the window between them")
    name = sh.first_histogram(cur, names)
    if name is None:
        return MetricValue.absent(f"{' / '.join(names)} not exposed by {cur.source}")
    res = sh.window_quantile(q, name, cur, prev)
    if res.value is None:
        return MetricValue.absent(res.reason or "no observations")
    return MetricValue(res.value, _metrics(res.method, cur))


def _efficiency(v: dict[str, MetricValue], groups: dict[str, list[ServingRecord]], server: ServerInfo | None,
                spec: ServingModelSpec, gpu_name: str | None, peak_tflops_override: float | None,
                bw_override: float | None) -> dict[str, object]:
    """decode MBU, decode/prefill MFU into ``v``; their inputs into the returned extras."""
    n_groups = max(len(groups), 1)
    gpg, gpg_src = gpus_per_group(spec, server, n_groups)
    res = resolve(spec, server, gpg, gpg_src)
    pk = peaks(gpu_name, res.dtype, peak_tflops_override, bw_override)
    extras: dict[str, object] = {
        "gpus_per_dp_group": gpg, "gpus_source": gpg_src, "peak_flops": pk.flops,
        "peak_flops_source": pk.flops_source, "peak_bandwidth": pk.bandwidth,
        "peak_bandwidth_source": pk.bandwidth_source, "weight_bytes_per_gpu": res.weight_bytes_gpu.value,
        "kv_bytes_per_token_per_gpu": res.kv_bytes_per_token_gpu.value,
        "flops_per_token": res.flops_per_token.value}
    total_gpus = gpg * n_groups if gpg else None
    for key, tput in (("decode_mfu", "gen_throughput"), ("prefill_mfu", "input_throughput")):
        t = v[tput].value
        need = [(res.flops_per_token.value, res.flops_per_token.reason), (pk.flops, pk.flops_source),
                (total_gpus, gpg_src), (t, f"{tput} absent: {v[tput].reason}")]
        missing = [str(why) for val, why in need if val is None]
        if missing:
            v[key] = MetricValue.absent("; ".join(missing))
            continue
        assert res.flops_per_token.value and pk.flops and total_gpus and t is not None
        flops_src = res.flops_per_token.source.detail if res.flops_per_token.source else ""
        v[key] = MetricValue(res.flops_per_token.value * t / (total_gpus * pk.flops),
                             Provenance("analytics", f"{flops_src} × {tput} ({v[tput].source}) ÷ "
                                                     f"({total_gpus} GPUs × peak; {pk.flops_source})"))
    v["decode_mbu"], extras["decode_steps_per_s"], extras["decode_bytes_per_step_per_gpu"] = _mbu(
        groups, server, res, pk.bandwidth, pk.bandwidth_source)
    return extras


def _mbu(groups: dict[str, list[ServingRecord]], server: ServerInfo | None, res: Resolved, bw: float | None,
         bw_src: str) -> tuple[MetricValue, float | None, float | None]:
    w_gpu, kv_gpu = res.weight_bytes_gpu, res.kv_bytes_per_token_gpu
    missing = [str(why) for val, why in ((w_gpu.value, w_gpu.reason), (kv_gpu.value, kv_gpu.reason),
                                         (bw, bw_src)) if val is None]
    if missing:
        return MetricValue.absent("; ".join(missing)), None, None
    assert bw
    per_group: list[float] = []
    steps: list[float] = []
    bytes_: list[float] = []
    used: list[ServingRecord] = []
    inferred_kv = False
    for recs in groups.values():
        vals = []
        for r in recs:
            if r.kind != "decode":
                continue
            rate = decode_step_rate(r.gen_throughput, r.running_req, r.accept_len)
            kv: float | None = r.kv_tokens_in_use()
            usage = r.kv_usage()
            if kv is None and usage is not None and server and server.max_total_num_tokens:
                kv, inferred_kv = usage * server.max_total_num_tokens, True
            b = decode_bytes_per_step(res, kv)
            if rate is None or b is None:
                continue
            vals.append(b * rate / bw)
            steps.append(rate)
            bytes_.append(b)
            used.append(r)
        if vals:
            per_group.append(statistics.fmean(vals))
    if not per_group:
        why = "no decode lines with 'gen throughput', '#running-req' > 0 and KV tokens in use"
        return MetricValue.absent(why), None, None
    note = "; KV tokens = token usage × max_total_num_tokens (inferred)" if inferred_kv else ""
    w, kv_pt = res.weight_bytes_gpu, res.kv_bytes_per_token_gpu
    src = Provenance("analytics", f"per GPU (weights {w.value:.3g} B [{w.source}] + '#token' × "
                                  f"{kv_pt.value:.3g} B/token [{kv_pt.source}]) × steps/s ('gen throughput' "
                                  f"÷ ('#running-req' × tokens per step)) ÷ {bw / 1e12:g} TB/s [{bw_src}], "
                                  f"mean over {_lines(used)}{note}")
    return MetricValue(statistics.fmean(per_group), src), statistics.fmean(steps), statistics.fmean(bytes_)


def serving_job_metrics(source: ServingWindow | Sequence[ServingRecord], **kwargs: Any) -> dict[str, float]:
    """{catalog name: value} of the job now: from a ServingWindow, or from records (kwargs go to
    ``summarize``: server, scrape, prev_scrape, spec, gpu_name, ...). Absent values are left out."""
    if isinstance(source, ServingWindow):
        return source.summary().job_metrics()
    return summarize(list(source), **kwargs).job_metrics()


class ServingWindow:
    """Per-job accumulator: records of the last ``window_s`` seconds and the scrapes spanning them.

    Records are placed by their log time (``timeline()``), or by the ``now`` given to
    ``add_records`` when the line has none; the window ends at the latest time seen, so a server
    clock that is not UTC does not empty it. At most ``max_records`` are kept (oldest dropped first,
    counted in ``dropped``). Scrapes are placed by their own time; the oldest scrape inside the
    window is the baseline of the percentiles and counter rates.
    """

    def __init__(self, window_s: float = 60.0, max_records: int = 20000, spec: ServingModelSpec | None = None,
                 gpu_name: str | None = None, peak_tflops: float | None = None,
                 peak_bandwidth: float | None = None) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self.max_records = max_records
        self.spec = spec or ServingModelSpec()
        self.gpu_name, self.peak_tflops, self.peak_bandwidth = gpu_name, peak_tflops, peak_bandwidth
        self.server: ServerInfo | None = None
        self.dropped = 0
        self._records: deque[tuple[float, ServingRecord]] = deque()
        self._latest = -math.inf
        self._scrapes: deque[MetricsSnapshot] = deque()

    def add_records(self, records: Iterable[ServingRecord], now: float) -> None:
        for r in records:
            t = r.timeline()
            key = now if t is None else t
            self._latest = max(self._latest, key)
            self._records.append((key, r))
        while len(self._records) > self.max_records:
            self._records.popleft()
            self.dropped += 1
        self.prune()

    def set_server(self, info: ServerInfo | None) -> None:
        if info is not None:
            self.server = info

    def add_scrape(self, snap: MetricsSnapshot) -> None:
        self._scrapes.append(snap)
        latest = max(s.time for s in self._scrapes)
        while len(self._scrapes) > 2 and self._scrapes[1].time <= latest - self.window_s:
            self._scrapes.popleft()

    def prune(self) -> None:
        cut = self._latest - self.window_s
        while self._records and self._records[0][0] < cut:
            self._records.popleft()

    def records(self) -> list[ServingRecord]:
        return [r for _, r in self._records]

    def scrape_pair(self) -> tuple[MetricsSnapshot | None, MetricsSnapshot | None]:
        """(baseline, latest) scrapes; the baseline is None with fewer than two."""
        if not self._scrapes:
            return None, None
        latest = self._scrapes[-1]
        return (self._scrapes[0] if len(self._scrapes) > 1 else None), latest

    def summary(self) -> ServingSummary:
        prev, cur = self.scrape_pair()
        return summarize(self.records(), self.server, cur, prev, self.spec, self.gpu_name, self.peak_tflops,
                         self.peak_bandwidth)

    def metrics(self) -> dict[str, float]:
        return self.summary().job_metrics()


@dataclass
class ServingAnalysis:
    job: str
    summary: ServingSummary
    findings: list[Finding]
    recommendations: list[Recommendation]
    server: ServerInfo | None = None

    def to_json(self) -> dict[str, Any]:
        """{job, values: {key: {value, source, reason}}, metrics: {catalog name: value}, <extras>, server}"""
        return {"job": self.job, **self.summary.to_json(),
                "server": dataclasses.asdict(self.server) if self.server else None}


def analyze_serving(job: str, records: Sequence[ServingRecord], server: ServerInfo | None = None,
                    scrape: MetricsSnapshot | None = None, prev_scrape: MetricsSnapshot | None = None,
                    spec: ServingModelSpec | None = None, gpu_name: str | None = None,
                    peak_tflops: float | None = None, peak_bandwidth: float | None = None,
                    lifetime_percentiles: bool = True) -> ServingAnalysis:
    """Summary, findings and recommendations of one serving job (offline: all records at once)."""
    from perfd.analytics.serving.serving_findings import derive_serving_findings

    s = summarize(records, server, scrape, prev_scrape, spec, gpu_name, peak_tflops, peak_bandwidth,
                  lifetime_percentiles)
    f, r = derive_serving_findings(s, server)
    return ServingAnalysis(job, s, f, r, server)


def analyze_window(job: str, window: ServingWindow) -> ServingAnalysis:
    """Summary, findings and recommendations of one serving job over its live window (the
    aggregator); the same findings as ``analyze_serving``."""
    from perfd.analytics.serving.serving_findings import derive_serving_findings

    s = window.summary()
    f, r = derive_serving_findings(s, window.server)
    return ServingAnalysis(job, s, f, r, window.server)
