"""An incident's line is worded where it is shown (perfd.report.incident_text): analytics keeps
typed values only; a line an older perfd recorded is shown as written."""

from __future__ import annotations

import dataclasses

from perfd.analytics.collectives.collective_hangs import HangView
from perfd.analytics.incidents.detect import HANG, hang_incident
from perfd.analytics.incidents.incident_evidence import EvidenceSource
from perfd.report.collective_text import hang_json
from perfd.report.incident_text import cause_line, incident_json, unworded_evidence


def _hang(not_joined: list[int]) -> HangView:
    return HangView(process_group="0", op="allreduce", seq=7, is_p2p=False, stuck_ranks=[0, 2],
                    ranks_not_joined=not_joined, inferred_not_joined=[], ranks_unknown=[],
                    first_reported=120.0, last_reported=125.0, age_at_first_report_s=5.0, resolved=False,
                    agents=["a"], user_frame=None, texts=[])


def test_a_hang_is_worded_from_its_evidence_not_stored() -> None:
    inc = hang_incident(_hang([1, 3]), 48, 126.0)
    assert inc.kinds == [HANG] and inc.cause == ""  # analytics words nothing
    assert cause_line(inc) == "collective hang: allreduce #7 — rank(s) 1, 3 never reached it"
    stuck = hang_incident(_hang([]), 48, 126.0)
    assert cause_line(stuck) == "collective hang: allreduce #7 — rank(s) 0, 2 stuck in it"
    # the JSON as served carries the line, in the key's place
    doc = incident_json(inc)
    assert doc["cause"] == cause_line(inc) and list(doc) == list(inc.to_json())


def test_the_evidence_source_is_a_code_worded_where_served() -> None:
    inc = hang_incident(_hang([1]), 48, 126.0)
    assert inc.evidence.source is EvidenceSource.NCCL_HANG
    served = incident_json(inc)["evidence"]
    assert isinstance(served, dict) and served["source"] == "collectors/nccl Flight Recorder hang detector"
    hang = inc.evidence.hang
    assert hang is not None
    # analytics' JSON: the code, and the hang without its resolution and line (worded where served)
    assert inc.to_json()["evidence"] == {**served, "source": "nccl_hang", "hang": hang.to_json()}
    assert served["hang"] == hang_json(hang) and "rank(s) 1 never reached it" in str(hang_json(hang)["text"])
    assert list(served) == list(inc.evidence.to_json())  # in the key's place
    # the state store's copy reads back to the code, by the table, never by parsing the sentence
    assert unworded_evidence(served)["source"] == "nccl_hang"
    assert unworded_evidence({**served, "source": "an older perfd's words"})["source"] is None


def test_a_line_recorded_by_an_older_perfd_is_shown_as_written() -> None:
    inc = dataclasses.replace(hang_incident(_hang([1]), 48, 126.0), cause="as it was written then")
    assert cause_line(inc) == "as it was written then"


def test_two_incidents_asking_the_same_thing_are_one_recommendation_merged_on_values() -> None:
    """Two hangs of the same ranks ask for one action: one recommendation, the costlier kept; a hang of
    other ranks stays apart. Merged on the action's typed inputs, not on its words."""
    from perfd.analytics.finding_types import order_findings
    from perfd.report.incident_findings import incident_findings

    first = dataclasses.replace(hang_incident(_hang([1, 3]), 48, 126.0), id="a", cost_s=5.0)
    again = dataclasses.replace(hang_incident(_hang([1, 3]), 60, 200.0), id="b", cost_s=9.0)
    other = dataclasses.replace(hang_incident(_hang([2]), 70, 300.0), id="c", cost_s=1.0)
    _, recs = incident_findings([first, again, other], run_s=100.0)
    assert len(recs) == 3 and recs[0].action == recs[1].action
    _, out = order_findings([], recs)
    assert [r.finding_id for r in out] == ["incident-b", "incident-c"]
