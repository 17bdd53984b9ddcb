"""The tracker keeps typed incidents (perfd/aggregator/incident_records.py) and writes JSON only at
its edges: the keys and their order are those it has always served, and the state store's copy reads
back to the same JSON (numbers as written)."""

from __future__ import annotations

import json
from typing import Any

from perfd.aggregator.gpu_views import SnapshotView, rank_snapshots
from perfd.aggregator.incidents import IncidentTracker
from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.incidents.attribution import GpuSeen, RankPlacement
from perfd.analytics.incidents.detect import Incident, detect_incidents, hang_incident, stall_incident
from perfd.analytics.incidents.evidence import StallReason
from perfd.analytics.incidents.incident_evidence import EvidenceSource, Withdrawal
from perfd.analytics.incidents.stall import RankSeen, StallCheck, Status
from perfd.analytics.steps.iteration import IterationResult
from perfd.core import finite_json
from perfd.core.events import GpuProcess

GPU = ("n0", "0")
STEP_KEYS = ["named_by_iterations", "rank_compute_ratio_max", "straggler_line_max_rank",
             "disturbed_by_capture", "observed", "source"]
LIVE_KEYS = ["gpu", "gpu_observed", "xid_at_open", "oom_at_open"]


def _snapshot(t: float) -> Any:
    procs: dict[tuple[str, str], list[GpuProcess]] = {
        GPU: [{"pid": 10, "rank": 0}, {"pid": 932, "cmdline": "python other.py", "used_memory_bytes": 1000}]}
    values: dict[tuple[str, str], dict[str, float]] = {
        GPU: {"perfd_gpu_power_watts": 699, "perfd_gpu_power_limit_watts": 700,
              "perfd_gpu_xid_errors_total": 1 if t > 100 else 0, "perfd_gpu_xid_last": 79}}
    view = SnapshotView(t, procs, values, {GPU: ["sw_power_cap"]}, {0: RankPlacement(0, "n0", "0", 10)})
    hosts = {0: {"pid": 10, "state": "stopped", "observed_at": t, "oom_kills": 0, "node": "n0"}}
    return lambda inc: rank_snapshots(inc.ranks, view, hosts, lambda items: items)


def _stall(closed_at: float | None) -> Incident:
    check = StallCheck(Status.STALLED, 12.0, 8.0, 1.0, (StallReason.STOPPED,), (0,), None,
                       (RankSeen(0, "stopped", 0.0, None, 10, "n0"),))
    return stall_incident(check, 21, 22, 90.0, 100.0, closed_at, extra={"stacks": {"0": "frame"}})


def _slow() -> list[Incident]:
    steps = [500.0] * 20 + [1500.0] * 5 + [500.0] * 3
    its = [IterationResult(i + 1, step_time_ms=s) for i, s in enumerate(steps)]
    ends = {it.iteration: 80.0 + it.iteration * 0.5 for it in its}
    return detect_incidents(its, ends, {}, 0, None).incidents


def test_the_evidence_keys_keep_their_order_and_the_state_store_copy_reads_back_the_same() -> None:
    events: list[dict[str, Any]] = []
    tr = IncidentTracker(events.extend)
    tr.update("j", [_stall(None)], _snapshot(100.0), [], 100.0)
    (stall,) = tr.incidents("j")
    assert list(stall["evidence"]) == ["stall", "source", *LIVE_KEYS]  # a stall's own evidence opens with it
    # Typed inside (the source's and the observations' codes), worded in the JSON served and kept.
    kept_stall = tr.typed_incidents("j")[0].incident
    assert kept_stall.evidence.source is EvidenceSource.LIVE_STALL
    assert kept_stall.evidence.gpu is not None and kept_stall.evidence.gpu[0].seen is GpuSeen.ITEMS
    assert kept_stall.to_json()["evidence"]["gpu"]["0"]["observations"] == "items"  # type: ignore[index]
    assert stall["evidence"]["source"] == ("perfd aggregator, live stall detector "
                                           "(perfd.analytics.incidents.stall)")
    assert stall["evidence"]["gpu"]["0"]["observations"] == [
        "rank 0's process (pid 10) on n0 was stopped (state T: SIGSTOP, a debugger, or a frozen container)",
        "rank 0's GPU was shared with another process: pid 932 (python other.py; 0.0 GiB)",
        "rank 0's GPU was power-capped (sw_power_cap; 699 W of a 700 W limit)"]
    tr.update("j", [_stall(None)], _snapshot(101.0), [], 101.0)  # the XID count rose: an int on the wire
    tr.update("j", _slow(), _snapshot(106.0), [], 106.0)  # the slow steps take the stall over
    (carrier,) = tr.incidents("j")
    assert carrier["kinds"] == ["slow-steps", "stall"] and carrier["id"] == "inc-21"
    assert list(carrier["evidence"]) == [*STEP_KEYS, *LIVE_KEYS, "stall"]  # a stall taken over comes last
    assert carrier["cost_parts"]["silence_s"] == 11.0 and carrier["verdict"]["cause"] == "process_stopped"
    hang = HangView(process_group="0", op="allreduce", seq=7, is_p2p=False, stuck_ranks=[0],
                    ranks_not_joined=[1],
                    inferred_not_joined=[], ranks_unknown=[], first_reported=120.0, last_reported=125.0,
                    age_at_first_report_s=5.0, resolved=False, agents=["a"], user_frame=None,
                    texts=[f"t{i}" for i in range(10)])
    tr.update("j", [hang_incident(hang, 48, 126.0)], _snapshot(126.0), [], 126.0)
    kept = json.loads(finite_json.dumps(tr.export()))
    again = IncidentTracker(events.extend)
    again.load(kept)
    assert finite_json.dumps(again.export()) == finite_json.dumps(kept)
    assert again.incidents("j") == tr.incidents("j")
    xid = next(e for e in kept["jobs"]["j"]["inc-21"]["evidence"]["gpu"]["0"]["items"] if e["kind"] == "xid")
    assert isinstance(xid["worst"], int)  # as it was written, not re-read as a float
    # The carried stall withdrawn after the restart: the incident keeps its steps, says why in its JSON.
    assert again.withdraw_stall("j", 21, 190.0, Withdrawal.LATE_RECORDS)
    doc = next(d for d in again.incidents("j") if d["id"] == "inc-21")
    assert doc["kinds"] == ["slow-steps"] and "stall" not in doc["evidence"] and "cost_parts" not in doc
    assert doc["stall_withdrawn"] == "late_records"


def test_withdrawal_reasons_carry_the_codes_the_events_always_had() -> None:
    assert [w.value for w in Withdrawal] == ["job_exit", "late_records", "ncu_arming", "cadence_pause"]
    events: list[dict[str, Any]] = []
    tr = IncidentTracker(events.extend)
    tr.update("j", [_stall(None)], _snapshot(100.0), [], 100.0)
    assert tr.withdraw("j", "stall-21", 110.0, Withdrawal.JOB_EXIT)
    assert events[-1]["payload"]["withdrawn"] == "job_exit" and "withdrawn (job_exit)" in events[-1]["text"]
    assert tr.incidents("j") == []
