"""perfd_job_incident_cause_info: one series per cause among a job's open incidents, the cause their
verdict names (the alert PerfdJobIncidentOpen pages on it and names the cause), gone once they close."""

from __future__ import annotations

from typing import Any

from perfd.aggregator.incidents import IncidentTracker
from perfd.analytics.incidents.detect import Incident, detect_incidents
from perfd.analytics.incidents.evidence import (
    CAUSE_LABEL_VALUES,
    UNEXPLAINED,
    EvidenceKind,
    Verdict,
    cause_label,
)
from perfd.analytics.steps.iteration import IterationResult
from perfd.core import catalog
from perfd.exporters.prometheus import series_families
from tests.incidents.test_tracked_records import _snapshot, _stall

NAME = catalog.JOB_INCIDENT_CAUSE_INFO


def _slow_open() -> list[Incident]:
    """Slow steps up to the latest: an incident still open, which nothing seen explains."""
    steps = [500.0] * 20 + [1500.0] * 5
    its = [IterationResult(i + 1, step_time_ms=s) for i, s in enumerate(steps)]
    ends = {it.iteration: 80.0 + it.iteration * 0.5 for it in its}
    found = detect_incidents(its, ends, {}, 0, None).incidents
    assert [i.open for i in found] == [True]
    return found


def _causes(tr: IncidentTracker) -> set[tuple[str, str, float]]:
    return {(lbl["job_name"], lbl["cause"], v) for lbl, name, v in tr.metric_rows() if name == NAME}


def test_each_open_incidents_cause_is_a_series_until_it_closes() -> None:
    events: list[dict[str, Any]] = []
    tr = IncidentTracker(events.extend)
    assert _causes(tr) == set()
    tr.update("hung", [_stall(None)], _snapshot(100.0), [], 100.0)  # its rank's process was stopped
    tr.update("slow", _slow_open(), lambda inc: {}, [], 100.0)  # nothing seen on its GPUs or hosts
    assert _causes(tr) == {("hung", "process_stopped", 1.0), ("slow", UNEXPLAINED, 1.0)}
    (verdict,) = [d.incident.verdict for d in tr.typed_incidents("hung")]
    assert verdict is not None and verdict.cause is EvidenceKind.PROCESS_STOPPED  # the label is the verdict's
    # Closed: its cause leaves /metrics; the counters stay (and the open count reads 0).
    assert tr.close_open("hung", 110.0, "the job ended") == 1
    assert _causes(tr) == {("slow", UNEXPLAINED, 1.0)}
    rows = {(lbl["job_name"], name): v for lbl, name, v in tr.metric_rows() if name != NAME}
    assert rows[("hung", "perfd_job_incidents_open")] == 0.0
    assert rows[("hung", "perfd_job_incidents_total")] == 1.0
    # As /metrics serves it: the catalog's name, its labels, value 1.
    (fam,) = [f for f in series_families(tr.metric_rows()) if f.name == NAME]
    assert [(s.labels, s.value) for s in fam.samples] == [({"cause": UNEXPLAINED, "job_name": "slow"}, 1.0)]


def test_the_label_values_are_the_evidence_kinds_and_unexplained() -> None:
    assert set(catalog.get(NAME).labels) == {"job_name", "cause"}
    assert CAUSE_LABEL_VALUES == (*(k.value for k in EvidenceKind), UNEXPLAINED)
    assert cause_label(None) == UNEXPLAINED  # not decided yet
    assert cause_label(Verdict(None, 0, None)) == UNEXPLAINED
    assert cause_label(Verdict(EvidenceKind.DATA_WAIT, 3, None)) == "data_wait"
