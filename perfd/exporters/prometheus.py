"""Prometheus exposition of perfd's numbers, named and described by the metric catalog.

Knows nothing of collectors: it is handed plain values (an iteration's analysis as a dict, the
latest node series) and turns them into metric families. A value that is None is not exported at
all: an absent series, never a 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from perfd import catalog

# Catalog name -> (key in an iteration's analysis JSON, scale). One table, so the aggregator's
# /metrics and `perfd analyze megatron --json` can be compared key by key (tests do).
JOB_GAUGES: dict[str, tuple[str, float]] = {
    "perfd_job_iteration": ("iteration", 1.0),
    "perfd_job_step_time_seconds": ("step_time_ms", 1e-3),
    "perfd_job_logged_tflops_per_gpu": ("megatron_tflops_per_gpu", 1.0),
    "perfd_job_model_tflops_per_gpu": ("model_tflops_per_gpu", 1.0),
    "perfd_job_mfu_ratio": ("mfu", 1.0),
    "perfd_job_tflops_gap_ratio": ("tflops_rel_gap", 1.0),
    "perfd_job_comm_exposed_ratio": ("comm_exposed_share", 1.0),
    "perfd_job_comm_exposed_dp_ratio": ("comm_exposed_dp_share", 1.0),
    "perfd_job_comm_exposed_pp_ratio": ("comm_exposed_pp_share", 1.0),
    "perfd_job_pp_bubble_analytic_ratio": ("pp_bubble_analytic", 1.0),
    "perfd_job_pp_stage_idle_max_ratio": ("pp_idle_max", 1.0),
    "perfd_job_pp_stage_idle_min_ratio": ("pp_idle_min", 1.0),
    "perfd_job_pp_imbalance_ratio": ("pp_imbalance", 1.0),
    "perfd_job_data_loading_ratio": ("data_share", 1.0),
    "perfd_job_straggler_ratio": ("straggler_rtt_ratio", 1.0),
    "perfd_job_lm_loss": ("lm_loss", 1.0),
    "perfd_job_straggler_rtt_spread_times": ("straggler_rtt_ratio", 1.0),  # the old name, one release more
}


def _gauge(name: str, labels: Sequence[str]) -> GaugeMetricFamily:
    d = catalog.get(name)
    return GaugeMetricFamily(name, f"{d.description} [source: {d.source}]", labels=list(labels))


def _name_for_family(name: str) -> str:
    # prometheus_client appends _total to counter families itself.
    return name[: -len("_total")] if name.endswith("_total") else name


def job_families(job_iterations: Mapping[str, Mapping[str, Any]],
                 per_rank: bool = True) -> Iterator[Metric]:
    """Families for every job's latest analysed iteration: {job name: iteration JSON}.
    ``per_rank=False`` leaves out the per-rank series (bounded cardinality for very large jobs)."""
    fams = {n: _gauge(n, ["job_name"]) for n in JOB_GAUGES}
    bottleneck = _gauge("perfd_job_bottleneck_info", ["job_name", "class"])
    rank_ratio = _gauge("perfd_job_rank_compute_ratio", ["job_name", "rank"])
    for job, it in sorted(job_iterations.items()):
        for name, (key, scale) in JOB_GAUGES.items():
            v = it.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                fams[name].add_metric([job], float(v) * scale)
        cls = it.get("bottleneck")
        if isinstance(cls, str):
            bottleneck.add_metric([job, cls], 1.0)
        per_rank_ratios = (it.get("straggler_rank_compute_ratio") or {}) if per_rank else {}
        for rank, ratio in sorted(per_rank_ratios.items()):
            rank_ratio.add_metric([job, str(rank)], float(ratio))
    yield from fams.values()
    yield bottleneck
    yield rank_ratio


def series_families(series: Iterable[tuple[Mapping[str, str], str, float]],
                    extra_labels: Mapping[str, str] | None = None) -> Iterator[Metric]:
    """Families for node series (name, labels, value). Names not in the catalog are skipped:
    the catalog is the contract with dashboards, nothing leaks past it."""
    grouped: dict[str, list[tuple[dict[str, str], float]]] = {}
    for labels, name, value in series:
        grouped.setdefault(name, []).append(({**labels, **(extra_labels or {})}, value))
    for name, rows in sorted(grouped.items()):
        try:
            d = catalog.get(name)
        except KeyError:
            continue
        label_names = sorted({k for lbl, _ in rows for k in lbl})
        help_text = f"{d.description} [source: {d.source}]"
        fam: Metric
        if d.kind == "counter":
            fam = CounterMetricFamily(_name_for_family(name), help_text, labels=label_names)
        else:
            fam = GaugeMetricFamily(name, help_text, labels=label_names)
        for lbl, value in rows:
            fam.add_metric([lbl.get(k, "") for k in label_names], value)
        yield fam


def plain_families(values: Mapping[str, tuple[Mapping[str, str], float]]) -> Iterator[Metric]:
    """Self-metrics given as {name: (labels, value)} with catalog names."""
    for name, (labels, value) in sorted(values.items()):
        yield from series_families([(labels, name, value)])


def build_info_families() -> Iterator[Metric]:
    """perfd_build_info: which perfd (and Python) a daemon runs, for both daemons' /metrics."""
    import platform

    from perfd import __version__

    yield from series_families([({"version": __version__, "python": platform.python_version()},
                                 "perfd_build_info", 1.0)])
