"""Prometheus exposition of perfd's numbers, named and described by the metric catalog.

Knows nothing of collectors: it is handed plain values (a run's analysed iterations, the latest
node series) and turns them into metric families. A value that is None is not exported at all: an
absent series, never a 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from perfd.core import catalog
from perfd.core.limits import RANK_RATIO_TOP_K

if TYPE_CHECKING:
    from perfd.analytics.steps.iteration import IterationResult
    from perfd.analytics.steps.iteration_table import Table


def _gauge(name: str, labels: Sequence[str]) -> GaugeMetricFamily:
    d = catalog.get(name)
    return GaugeMetricFamily(name, f"{d.description} [source: {d.source}]", labels=list(labels))


def _name_for_family(name: str) -> str:
    # prometheus_client appends _total to counter families itself.
    return name[: -len("_total")] if name.endswith("_total") else name


Row = tuple[Mapping[str, str], str, float]  # (labels, catalog name, value)
# Where :func:`latest_series` hands each series: (catalog name, labels, value).
Emit = Callable[[str, Mapping[str, str], float], None]
_BOTTLENECK = "perfd_job_bottleneck_info"
_RANK_RATIO = "perfd_job_rank_compute_ratio"


def latest_series(job: str, iterations: Table[IterationResult], per_rank: bool, emit: Emit
                  ) -> dict[int, float]:
    """The series of a job's latest analysed iteration (the last row of its run's table), read from
    the table's columns without building the row, each handed to ``emit``: every catalog job metric
    present (its ``attr``'s column in the catalog unit: perfd.core.catalog.in_unit), the bottleneck class
    and, unless ``per_rank`` is False, each rank's compute ratio; then the slowest ranks. Returns the
    ranks' compute ratios. /metrics (:func:`job_families`) and the rules (:func:`iteration_rows`) both
    read these, one listing; a job metric's value goes from its column to ``emit`` as it is read, no
    row, mapping or tuple between (tests/test_mfu_path.py watches MFU's)."""
    i = len(iterations) - 1
    lab = {"job_name": job}
    for m in catalog.job_metrics():
        if m.attr is not None and (v := catalog.in_unit(m, iterations.get(i, m.attr))) is not None:
            emit(m.name, lab, v)
    emit(_BOTTLENECK, {**lab, "class": iterations.get(i, "bottleneck")}, 1.0)
    ratios: dict[int, float] = iterations.get(i, "straggler_rank_compute_ratio")
    if per_rank:
        for rank, ratio in sorted(ratios.items(), key=lambda kv: int(kv[0])):
            emit(_RANK_RATIO, {**lab, "rank": str(rank)}, float(ratio))
    for labels, name, value in rank_picture_rows(job, ratios):
        emit(name, labels, value)
    return ratios


def iteration_rows(job: str, iterations: Table[IterationResult], per_rank: bool = True) -> list[Row]:
    """:func:`latest_series` as (labels, catalog name, value) rows: what the rules read."""
    rows: list[Row] = []
    latest_series(job, iterations, per_rank, lambda name, labels, value: rows.append((labels, name, value)))
    return rows


def bucket_label(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(le)


def rank_picture_rows(job: str, ratios: Mapping[int, float]) -> list[Row]:
    """The rank x step picture at a cardinality no rank count changes, part one: the
    RANK_RATIO_TOP_K slowest ranks' compute ratios (part two: :func:`rank_ratio_buckets`)."""
    slowest = sorted(ratios.items(), key=lambda kv: (-float(kv[1]), int(kv[0])))[:RANK_RATIO_TOP_K]
    return [({"job_name": job, "rank": str(r)}, catalog.RANK_RATIO_TOP, float(v)) for r, v in slowest]


def rank_ratio_buckets(ratios: Mapping[int, float]) -> tuple[list[tuple[str, float]], float] | None:
    """How many ranks fall at or below each RANK_RATIO_BUCKETS bound (cumulative, as Prometheus
    buckets are), and the sum of the ratios; None without per-rank ratios."""
    values = sorted(float(v) for v in ratios.values())
    if not values:
        return None
    counts = [(bucket_label(le), float(sum(1 for v in values if v <= le)))
              for le in catalog.RANK_RATIO_BUCKETS]
    return counts, sum(values)


def job_families(job_iterations: Mapping[str, Table[IterationResult]], per_rank: bool = True
                 ) -> Iterator[Metric]:
    """Families for every job's latest analysed iteration: {job name: its run's table, whose last row
    is that iteration} (:func:`latest_series`, each value added to its family as it is read from its
    column). ``per_rank=False`` leaves out the per-rank series (bounded cardinality for very large
    jobs)."""
    names: dict[str, list[str]] = {m.name: ["job_name"] for m in catalog.job_metrics()}
    names[_BOTTLENECK] = ["job_name", "class"]
    names[_RANK_RATIO] = ["job_name", "rank"]
    names[catalog.RANK_RATIO_TOP] = ["job_name", "rank"]
    fams = {name: _gauge(name, labels) for name, labels in names.items()}
    d = catalog.get(catalog.RANK_RATIO_RANKS)
    ranks = GaugeHistogramMetricFamily(d.name, f"{d.description} [source: {d.source}]", labels=["job_name"])

    def add(name: str, labels: Mapping[str, str], value: float) -> None:
        fams[name].add_metric([labels[k] for k in names[name]], value)

    for job, iterations in sorted(job_iterations.items()):
        buckets = rank_ratio_buckets(latest_series(job, iterations, per_rank, add))
        if buckets is not None:
            ranks.add_metric([job], buckets[0], buckets[1])
    yield from fams.values()
    yield ranks


def histogram_families(name: str, rows: Iterable[tuple[str, Sequence[tuple[str, float]], float]]
                       ) -> Iterator[Metric]:
    """One histogram family (catalog ``name``) from (job, [(le, cumulative count)], sum)."""
    d = catalog.get(name)
    fam = HistogramMetricFamily(name, f"{d.description} [source: {d.source}]", labels=["job_name"])
    for job, buckets, total in rows:
        fam.add_metric([job], list(buckets), total)
    yield fam


GPU_PREFIX = "perfd_gpu_"


def with_dcgm_identity(labels: Mapping[str, str], name: str = "") -> dict[str, str]:
    """A GPU series' labels plus DCGM-exporter's names for its identity (catalog.DCGM_IDENTITY:
    UUID, Hostname; on catalog.GPU_INFO also DCGM_INFO_IDENTITY: modelName), each the value of the
    perfd label it repeats, where that is set."""
    out = dict(labels)
    names = catalog.DCGM_IDENTITY.items()
    if name == catalog.GPU_INFO:
        names = {**catalog.DCGM_IDENTITY, **catalog.DCGM_INFO_IDENTITY}.items()
    for dcgm, ours in names:
        if ours in out and dcgm not in out:
            out[dcgm] = out[ours]
    return out


def series_families(series: Iterable[tuple[Mapping[str, str], str, float]],
                    extra_labels: Mapping[str, str] | None = None) -> Iterator[Metric]:
    """Families for node series (name, labels, value). Names not in the catalog are skipped:
    the catalog is the contract with dashboards, nothing leaks past it. GPU series also carry
    DCGM-exporter's identity labels (:func:`with_dcgm_identity`), whoever exports them."""
    grouped: dict[str, list[tuple[dict[str, str], float]]] = {}
    for labels, name, value in series:
        lbl = {**labels, **(extra_labels or {})}
        grouped.setdefault(name, []).append(
            (with_dcgm_identity(lbl, name) if name.startswith(GPU_PREFIX) else lbl, value))
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
