"""The event-kind catalog (perfd/core/events.py) is the one place a kind is spelled, and the aggregator
routes each kind by it."""

from __future__ import annotations

import re
from pathlib import Path

from perfd.aggregator.state import AggregatorState
from perfd.core import events

ROOT = Path(__file__).resolve().parents[1]


def test_no_event_kind_is_spelled_outside_the_catalog() -> None:
    spelled = re.compile(r'["\']kind["\']\s*:\s*["\'](\w+)["\']|kind\s*==\s*["\'](\w+)["\']')
    bad = []
    for f in [*ROOT.joinpath("perfd").rglob("*.py"), *ROOT.joinpath("perfd", "collectors").rglob("*.py")]:
        if "tests" in f.relative_to(ROOT).parts or f.name == "events.py" or "gen" in f.parts:
            continue
        for m in spelled.finditer(f.read_text()):
            name = m.group(1) or m.group(2)
            if name in events.KINDS:
                bad.append(f"{f.relative_to(ROOT)}: {name}")
    assert not bad, "spell the kind through perfd.core.events: " + ", ".join(bad)


def test_every_kind_names_its_producer_and_consumers() -> None:
    for k in events.KINDS.values():
        assert k.producer and k.consumers and k.description, k.name
        if k.item is not None:
            assert k.payload in ("list", "mapping"), k.name


def test_state_events_replace_history_events_log_and_malformed_are_counted() -> None:
    st = AggregatorState()
    st.ingest_events("a1", [
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": "0"},
         "payload": [{"pid": 7, "rank": 0}, "junk"]},
        {"kind": events.GPU_PROCESSES.name, "labels": {"node": "n1", "gpu": "1"}, "payload": "not a list"},
        {"kind": events.XID.name, "job": "j", "payload": {"xid": 79}},
    ])
    procs = st.nodes.gpu_procs
    assert procs[("n1", "0")] == ("a1", [{"pid": 7, "rank": 0}])  # the bad element left out
    assert ("n1", "1") not in procs
    assert [e["kind"] for e in st.recent_events()] == [events.XID.name]
    assert st.stats_json()["events_malformed"] == {events.GPU_PROCESSES.name: 1}
