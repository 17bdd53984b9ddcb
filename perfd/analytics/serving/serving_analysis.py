"""Serving analytics (SGLang): job-level numbers from logged batches and ``/metrics`` scrapes. Pure.

Entry points, shared by the CLI (``perfd analyze sglang``), the collector and the aggregator so
offline and live numbers cannot drift apart:

- ``summarize(records, server, scrape, prev_scrape, spec, ...) -> ServingSummary``: every number
  as a MetricValue (value + source, or None + reason: codes and their numbers, worded where shown,
  perfd.report.serving_report.serving_json);
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

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.finding_types import Finding, Recommendation
from perfd.analytics.serving import histogram as sh
from perfd.analytics.serving.spec import (
    MetricValue,
    Resolved,
    decode_bytes_per_step,
    decode_step_rate,
    gpus_per_group,
    peaks,
    resolve,
)
from perfd.analytics.steps.provenance import Arg, Cited, Code, cite
from perfd.core.serving_model import ServingModelSpec
from perfd.core.serving_records import MetricsSnapshot, ServerInfo, ServingRecord

# summary key -> catalog name (perfd/core/catalog.py, "serving" section)
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
    # what the efficiency figures were read from (their sources as codes) and the window's span
    extras: dict[str, object] = field(default_factory=dict)

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


# --- helpers ---------------------------------------------------------------------------------------

def _mean(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None and math.isfinite(x)]
    try:
        return statistics.fmean(v) if v else None
    except OverflowError:  # finite values whose sum is not (a scrape past perfd.core.bounds): no mean
        return None


def _lines(recs: Sequence[ServingRecord]) -> Cited:
    if not recs:
        return cite(Code.SG_NO_LINES)
    lo, hi = min(r.line_no for r in recs), max(r.line_no for r in recs)
    return cite(Code.SG_LINES, len(recs), lo, hi) if lo != hi else cite(Code.SG_ONE_LINE, lo)


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


def _per_group(groups: dict[str, list[ServingRecord]], fn: Callable[[list[ServingRecord]], float | None],
               how: str, what: Code, pick: Callable[[ServingRecord], bool]) -> MetricValue | None:
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
    many = Code.SG_PER_GROUP_SUM if how == "sum" else Code.SG_PER_GROUP_MEAN
    over = (cite(Code.SG_PER_GROUP_ONE, cite(what), _lines(used)) if len(vals) == 1
            else cite(many, cite(what), _lines(used), len(vals)))
    return MetricValue(value, cite(Code.SG_LOG, over))


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

    def put(key: str, *cands: MetricValue | None, reason: Cited) -> None:
        v[key] = next((c for c in cands if c is not None and c.value is not None), MetricValue.absent(reason))

    # throughput
    put("gen_throughput",
        _per_group(groups, lambda rs: _mean(r.gen_throughput for r in rs if dec(r)), "sum",
                   Code.SG_GEN_TPUT, dec),
        _scrape_rate(scrape, prev_scrape, "sglang:generation_tokens_total", None),
        _scrape_gauge(scrape, "sglang:gen_throughput", "sum"),
        reason=cite(Code.SG_NO_GEN_TPUT))
    put("input_throughput",
        _per_group(groups, lambda rs: _mean(r.input_throughput for r in rs if pre(r)), "sum",
                   Code.SG_INPUT_TPUT, pre),
        _per_group(groups, _input_rate_from_span, "sum",
                   Code.SG_INPUT_FROM_SPAN, pre),
        _scrape_rate(scrape, prev_scrape, "sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
        reason=cite(Code.SG_NO_INPUT_TPUT))
    # load
    put("running_requests",
        _per_group(groups, _running, "sum", Code.SG_RUNNING, anyk),
        _scrape_gauge(scrape, "sglang:num_running_reqs", "sum"),
        reason=cite(Code.SG_NO_RUNNING))
    put("queued_requests",
        _per_group(groups, lambda rs: _mean(float(r.queue_req) for r in rs if r.queue_req is not None), "sum",
                   Code.SG_QUEUE, anyk),
        _scrape_gauge(scrape, "sglang:num_queue_reqs", "sum"),
        reason=cite(Code.SG_NO_QUEUE))
    put("queue_growth",
        _per_group(groups, _queue_slope, "sum", Code.SG_QUEUE_SLOPE, anyk),
        reason=cite(Code.SG_QUEUE_POINTS, MIN_SLOPE_POINTS))
    put("kv_usage",
        _per_group(groups, lambda rs: _mean(r.kv_usage() for r in rs), "mean",
                   Code.SG_KV_USAGE, anyk),
        _scrape_gauge(scrape, "sglang:token_usage", "mean"),
        reason=cite(Code.SG_NO_KV_USAGE))
    mrr = server.max_running_requests if server else None
    run = v["running_requests"].value
    fill_src = cite(Code.SG_ANALYTICS, cite(Code.SG_BATCH_FILL, str(mrr)))
    put("batch_fill", MetricValue(run / mrr, fill_src) if run is not None and mrr else None,
        reason=cite(Code.SG_NO_MRR) if not mrr else cite(Code.SG_NO_RUNNING_FOR_FILL))
    # prefix cache
    put("prefix_hit",
        _per_group(groups, _hit_ratio, "mean", Code.SG_HIT_TOKENS, pre),
        _scrape_hit(scrape, prev_scrape),
        _per_group(groups, _last_cache_hit_rate, "mean", Code.SG_LAST_HIT_RATE, pre),
        _scrape_gauge(scrape, "sglang:cache_hit_rate", "mean", caveat=cite(Code.SG_HIT_GAUGE_CAVEAT)),
        reason=cite(Code.SG_NO_HIT))
    put("prefix_hit_batches",
        _per_group(groups, _hit_batches, "mean", Code.SG_HIT_BATCHES, pre),
        reason=cite(Code.SG_NO_HIT_BATCHES))
    put("cuda_graph",
        _per_group(groups, lambda rs: _mean(float(bool(r.cuda_graph)) for r in rs
                                            if dec(r) and r.cuda_graph is not None), "mean",
                   Code.SG_CUDA_GRAPH, dec),
        reason=cite(Code.SG_NO_CUDA_GRAPH))
    put("spec_accept_length",
        _per_group(groups, lambda rs: _mean(r.accept_len for r in rs if dec(r)), "mean", Code.SG_ACCEPT_LEN,
                   dec),
        _scrape_gauge(scrape, "sglang:spec_accept_length", "mean"),
        reason=cite(Code.SG_NO_ACCEPT_LEN))
    # latency percentiles
    for key, names, q in (("ttft_p50", HIST_TTFT, 0.5), ("ttft_p99", HIST_TTFT, 0.99),
                          ("itl_p50", HIST_ITL, 0.5), ("itl_p99", HIST_ITL, 0.99),
                          ("e2e_p50", HIST_E2E, 0.5), ("e2e_p99", HIST_E2E, 0.99)):
        v[key] = _percentile(scrape, prev_scrape, names, q, lifetime_percentiles)
    extras = _efficiency(v, groups, server, spec, gpu_name, peak_tflops, peak_bandwidth)
    extras.update(records=len(records), prefill_lines=sum(1 for r in records if pre(r)),
                  decode_lines=sum(1 for r in records if dec(r)), dp_groups=sorted(groups) or [],
                  window=_window_span(records))
    return ServingSummary(v, extras)


def _is_prefill(r: ServingRecord) -> bool:
    return r.kind == "prefill"


def _is_decode(r: ServingRecord) -> bool:
    return r.kind == "decode"


def _any(r: ServingRecord) -> bool:
    return True


def _window_span(records: Sequence[ServingRecord]) -> Cited:
    ts = [t for t in (r.timeline() for r in records) if t is not None]
    if not records:
        return cite(Code.SG_NO_BATCH_LINES)
    if len(ts) >= 2:
        return cite(Code.SG_WINDOW, len(records), max(ts) - min(ts))
    return cite(Code.SG_WINDOW_NO_SPAN, len(records))


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


def _metrics(detail: Cited, scrape: MetricsSnapshot) -> Cited:
    return cite(Code.SG_METRICS, detail, scrape.source)


def _scrape_gauge(scrape: MetricsSnapshot | None, name: str, how: str,
                  caveat: Cited | None = None) -> MetricValue | None:
    if scrape is None:
        return None
    val, n = sh.gauge_value(scrape, name, how)
    if val is None:
        return None
    said = (cite(Code.SG_GAUGE, name, how, n) if caveat is None
            else cite(Code.SG_GAUGE_NOTED, name, how, n, caveat))
    return MetricValue(val, _metrics(said, scrape))


def _scrape_rate(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None, name: str,
                 minus: str | None) -> MetricValue | None:
    if cur is None or prev is None:
        return None
    rate = sh.counter_rate(name, cur, prev)
    if rate is None:
        return None
    what = cite(Code.SG_RATE, name)
    if minus is not None:
        sub = sh.counter_rate(minus, cur, prev)
        if sub is not None:
            rate, what = rate - sub, cite(Code.SG_RATE_MINUS, name, minus)
        else:
            what = cite(Code.SG_RATE_WITH_CACHED, name)
    return MetricValue(rate, _metrics(cite(Code.SG_OVER_SECONDS, what, cur.time - prev.time), cur))


def _scrape_hit(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None) -> MetricValue | None:
    if cur is None or prev is None:
        return None
    cached = sh.counter_increase("sglang:cached_tokens_total", cur, prev)
    prompt = sh.counter_increase("sglang:prompt_tokens_total", cur, prev)
    if cached is None or not prompt:
        return None
    return MetricValue(cached / prompt, _metrics(cite(Code.SG_HIT_COUNTERS, cur.time - prev.time), cur))


def _percentile(cur: MetricsSnapshot | None, prev: MetricsSnapshot | None, names: Sequence[str], q: float,
                lifetime_ok: bool) -> MetricValue:
    if cur is None:
        return MetricValue.absent(cite(Code.SG_NO_SCRAPE, names[0]))
    if prev is None and not lifetime_ok:
        return MetricValue.absent(cite(Code.SG_TWO_SCRAPES))
    name = sh.first_histogram(cur, names)
    if name is None:
        return MetricValue.absent(cite(Code.SG_NOT_EXPOSED, " / ".join(names), cur.source))
    res = sh.window_quantile(q, name, cur, prev)
    if res.value is None or res.method is None:
        return MetricValue.absent(res.reason or cite(Code.SG_NO_OBSERVATIONS))
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
        need: list[tuple[float | None, Arg | None]] = [
            (res.flops_per_token.value, res.flops_per_token.reason), (pk.flops, pk.flops_source),
            (total_gpus, gpg_src), (t, cite(Code.SG_TPUT_ABSENT, tput, _said(v[tput].reason)))]
        missing = [_said(why) for val, why in need if val is None]
        if missing:
            v[key] = MetricValue.absent(_both(missing))
            continue
        assert res.flops_per_token.value and pk.flops and total_gpus and t is not None
        how = cite(Code.SG_MFU, res.flops_per_token.detail, tput, _said(v[tput].source), total_gpus,
                   pk.flops_source)
        value = res.flops_per_token.value * t / (total_gpus * pk.flops)
        v[key] = MetricValue(value, cite(Code.SG_ANALYTICS, how))
    v["decode_mbu"], extras["decode_steps_per_s"], extras["decode_bytes_per_step_per_gpu"] = _mbu(
        groups, server, res, pk.bandwidth, pk.bandwidth_source)
    return extras


def _mbu(groups: dict[str, list[ServingRecord]], server: ServerInfo | None, res: Resolved, bw: float | None,
         bw_src: Cited) -> tuple[MetricValue, float | None, float | None]:
    w_gpu, kv_gpu = res.weight_bytes_gpu, res.kv_bytes_per_token_gpu
    missing = [_said(why) for val, why in ((w_gpu.value, w_gpu.reason), (kv_gpu.value, kv_gpu.reason),
                                           (bw, bw_src)) if val is None]
    if missing:
        return MetricValue.absent(_both(missing)), None, None
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
        return MetricValue.absent(cite(Code.SG_NO_MBU_LINES)), None, None
    w, kv_pt = res.weight_bytes_gpu, res.kv_bytes_per_token_gpu
    assert w.value is not None and kv_pt.value is not None
    how = cite(Code.SG_MBU, w.value, _said(w.source), kv_pt.value, _said(kv_pt.source), bw / 1e12, bw_src,
               _lines(used))
    src = cite(Code.SG_ANALYTICS, cite(Code.SG_KV_INFERRED, how) if inferred_kv else how)
    return MetricValue(statistics.fmean(per_group), src), statistics.fmean(steps), statistics.fmean(bytes_)


def _said(c: Arg | None) -> Arg:
    """A source or reason as another sentence quotes it ("None" where there is none, as it always read)."""
    return "None" if c is None else c


def _both(whys: list[Arg]) -> Cited:
    """Several reasons, one after the other ("; " between)."""
    out = whys[0] if isinstance(whys[0], Cited) else cite(Code.WHY, whys[0])
    for w in whys[1:]:
        out = cite(Code.SG_BOTH, out, w)
    return out


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
