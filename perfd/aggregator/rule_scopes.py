"""The values the rules engine reads on the aggregator: what /metrics exports for each job, keyed by
rule scope.

Scope keys (perfd.rules.evaluator): the job name for job scope, ``(job, rank)`` for rank scope,
``(job, node, gpu)`` for gpu scope. A job series goes to the scope its labels name, as
:func:`perfd.rules.rule_types.carrying_scopes` says from the catalog for ``perfd rules check``: with a
``rank`` label to rank scope, with ``node`` and ``gpu`` to gpu scope, else to job scope. Its other
labels (group, scope, class, state, ...) stay in the series key (:func:`perfd.rules.expr.series_key`),
so a rule selects one as ``perfd_job_comm_total_group_ratio{group="dp"}``.

:func:`perfd.aggregator.job_rows.job_rows` lists the job series /metrics exports (perfd.aggregator.http)
from the jobs' snapshots: the latest analysed iteration of each running job, rank placement, each
job's collective analysis, incidents, liveness and serving gauges. A new job series on /metrics
belongs there: tests/rules/test_rule_scopes.py checks that every job sample /metrics exports is in
the scope with its value. GPU series come from each snapshot's GPU view, only those some rule reads
(a few of ~25 per GPU, on every GPU); a rank's scope holds the GPU series of the GPU it runs on.

A job that ended has no scope: rules stop evaluating it (/metrics keeps a few of its series).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from perfd.aggregator.snapshot import JobSnapshot
from perfd.core import catalog
from perfd.core.catalog import RANK_HOST_SERIES
from perfd.exporters.prometheus import Row
from perfd.rules.evaluator import ScopeKey, job_of
from perfd.rules.expr import SCOPE_LABELS, base_name, series_key
from perfd.rules.rule_types import carrying_scopes

Values = dict[str, float | None]


def scope_key(labels: Mapping[str, str]) -> tuple[ScopeKey, dict[str, str]] | None:
    """The scope key a job series belongs to and its labels beyond the scope's; None for a series
    of no job (perfd's own counters) or a malformed one."""
    job = labels.get("job_name")
    if not job:
        return None
    rest = {k: v for k, v in labels.items() if k not in SCOPE_LABELS}
    rank, node, gpu = labels.get("rank"), labels.get("node"), labels.get("gpu")
    if rank is not None:
        try:
            return (job, int(rank)), rest
        except ValueError:
            return None
    if node is not None and gpu is not None:
        return (job, node, gpu), rest
    if node is not None or gpu is not None:
        return None  # a host series: no scope holds it (carrying_scopes)
    return job, rest


def add_rows(out: dict[ScopeKey, Values], rows: Iterable[Row], skip_jobs: Collection[str] = ()) -> None:
    """File each row under its scope key and series key (the last value of a series wins)."""
    for labels, name, value in rows:
        got = scope_key(labels)
        if got is None:
            continue
        key, rest = got
        if job_of(key) in skip_jobs:
            continue
        out.setdefault(key, {})[series_key(name, rest)] = value


def add_rank_host_values(out: dict[ScopeKey, Values], snaps: Iterable[JobSnapshot],
                         rank_keys: Collection[str]) -> None:
    """Each rank process's host series (collectors/ranks, the agents' /metrics) at rank scope, those
    some rank-scope rule reads, from the host view's latest observations (perfd.aggregator.hosts):
    ``rank_cpu_wait > 0.5`` fires for the rank that waits."""
    names = {base_name(k) for k in rank_keys}
    fields = {n: f for n, f in RANK_HOST_SERIES.items() if n in names}
    extra = names & {catalog.RANK_STATE_INFO, catalog.RANK_ALLOWED_CPUS, catalog.RANK_PRESSURE}
    if not fields and not extra:
        return
    for snap in snaps:
        for rank, obs in snap.hosts().items():
            vals = out.setdefault((snap.job, rank), {})
            for name, field in fields.items():
                v = obs.get(field)
                vals[name] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
            if catalog.RANK_STATE_INFO in extra and isinstance(obs.get("state"), str):
                vals[series_key(catalog.RANK_STATE_INFO, {"process_state": obs["state"]})] = 1.0
            if catalog.RANK_ALLOWED_CPUS in extra and isinstance(obs.get("allowed_cpus"), list):
                vals[catalog.RANK_ALLOWED_CPUS] = float(len(obs["allowed_cpus"]))
            for res, share in (obs.get("pressure") or {}).items() if catalog.RANK_PRESSURE in extra else ():
                vals[series_key(catalog.RANK_PRESSURE, {"resource": str(res)})] = float(share)


def gpu_series_names() -> frozenset[str]:
    """Catalog names of the per-GPU series (the ones the GPU view holds)."""
    return frozenset(m.name for m in catalog.CATALOG
                     if "job_name" not in m.labels and "gpu" in carrying_scopes(m)[0])


def add_gpu_values(out: dict[ScopeKey, Values], snaps: Iterable[JobSnapshot], gpu_keys: Collection[str],
                   rank_keys: Collection[str]) -> None:
    """GPU series of each job's GPUs: at gpu scope the names in ``gpu_keys`` (series keys some
    gpu-scope rule reads), and at rank scope, for the rank on that GPU, those in ``rank_keys``."""
    gpu_names = {base_name(k) for k in gpu_keys} & gpu_series_names()
    rank_names = {base_name(k) for k in rank_keys} & gpu_series_names()
    if not gpu_names and not rank_names:
        return
    throttle = catalog.GPU_THROTTLE_ACTIVE
    for snap in snaps:
        job = snap.job
        _procs, values, throttles = snap.gpus(gpu_names | rank_names, procs=False)
        per_gpu: dict[tuple[str, str], Values] = {}
        for (node, gpu), vals in values.items():
            gv: Values = dict(vals)
            for reason in throttles.get((node, gpu), []):
                gv[series_key(throttle, {"reason": reason})] = 1.0
            per_gpu[(node, gpu)] = gv
        if gpu_names:
            for (node, gpu), gv in per_gpu.items():
                out.setdefault((job, node, gpu), {}).update(
                    {k: v for k, v in gv.items() if base_name(k) in gpu_names})
        if rank_names:
            for rank, pl in snap.placed_ranks.items():
                gv = per_gpu.get((pl.node, pl.gpu), {})
                out.setdefault((job, rank), {}).update(
                    {k: v for k, v in gv.items() if base_name(k) in rank_names})
