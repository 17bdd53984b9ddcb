"""perfd.aggregator.eventlog: bounded by count and bytes, each event kept cut to its size cap (its
listeners get it whole), numbered, and paged; divided into pools (a job's events, each
sender's job-less ones) of one share each, every event attributed by the aggregator, never by its
labels."""

from __future__ import annotations

from typing import Any

from perfd.aggregator.eventlog import MAX_EVENTS, EventLog
from perfd.core import events
from perfd.core import limits as L
from perfd.core.refusals import Refusals


def _ev(i: int, kind: str = "xid", payload_kb: int = 0, job: str = "j", **more: Any) -> dict[str, Any]:
    return {"kind": kind, "time": float(i), "job": job, "text": f"e{i}",
            "payload": {"blob": "b" * (payload_kb * 1000)} if payload_kb else {"i": i}, **more}


def test_a_large_event_is_kept_cut_and_its_listener_gets_it_whole() -> None:
    log = EventLog()
    heard: list[Any] = []
    log.listeners.append(lambda ev: heard.append(ev))
    log.ingest("a", [_ev(1, events.CAPTURE_FINISHED.name, payload_kb=100)])
    assert len(heard[0]["payload"]["blob"]) == 100_000  # the capture records read it whole
    kept = log.recent()[0]
    assert kept["payload"] == {"cut_bytes": 100_000 + len('{"blob": ""}')} and kept["seq"] == 1
    assert log.cut == 1 and log.cut_bytes > 99_000


def test_the_log_is_bounded_by_bytes_and_pages_walk_it_once() -> None:
    log = EventLog(max_events=1000, max_bytes=200_000)
    for i in range(100):  # a sender each (one pool would hold its share only): ~10 KB each as kept, ~19 fit
        log.ingest(f"a{i}", [_ev(i, payload_kb=10, job="")])
    st = log.stats()
    assert st["bytes"] <= 200_000 and 15 <= st["held"] <= 20 and st["last_seq"] == 100
    newest, more = log.page(limit=5)
    assert [e["seq"] for e in newest] == [96, 97, 98, 99, 100] and more
    seen: list[object] = []
    cursor = 0
    while True:
        page, more = log.page(limit=7, after=cursor, max_bytes=L.MAX_EVENTS_PAGE_BYTES)
        seen += [e["seq"] for e in page]
        if not more:
            break
        last = page[-1]["seq"]
        assert isinstance(last, int)
        cursor = last
    assert seen == list(range(100 - st["held"] + 1, 101))
    page, _ = log.page(limit=1000, after=0, max_bytes=25_000)  # about that many bytes, at least one
    assert 1 <= len(page) <= 3


def test_cut_keeps_valid_json_and_says_how_much_went() -> None:
    text, payload, n = events.cut("t" * 10_000, '{"a": "' + "x" * 20_000 + '"}', 4096)
    assert len(text.encode()) <= 1024 + len(events.CUT_MARK.encode()) and payload == '{"cut_bytes": 20009}'
    assert n == 10_000 + 20_009 - len(text.encode()) - len(payload)
    assert events.cut("small", "{}", 4096) == ("small", "{}", 0)


def _texts(evs: list[dict[str, object]]) -> list[object]:
    return [e["text"] for e in evs]


def test_a_strangers_flood_evicts_only_its_own_events_and_is_counted() -> None:
    """The issue's probe: 1,250 job-less events from an agent hosting no job (half labelled with the
    victim job) evicted all 20 of the host's events, and ``?job=victim`` listed the stranger's. Now the
    stranger's pool holds its share (its newest), the host's 20 and a node agent's 5 stay, and only the
    host's are the victim's."""
    log = EventLog()
    log.refusals = refused = Refusals()
    log.hosted = lambda agent: ["victim"] if agent == "host" else []
    host = [_ev(i, job="victim", text=f"host {i}") for i in range(10)]
    host += [_ev(10 + i, job="", text=f"host {10 + i}") for i in range(10)]  # job-less: the job it hosts
    log.ingest("host", host)
    log.ingest("node-a", [_ev(20 + i, job="", text=f"node {i}") for i in range(5)])
    flood = [_ev(100 + i, job="", text=f"stranger {i}", labels={"job": "victim"} if i % 2 else {})
             for i in range(1250)]
    for k in range(0, len(flood), 50):
        log.ingest("stranger", flood[k:k + 50])
    share = MAX_EVENTS // L.EVENT_LOG_SHARES
    assert _texts(log.recent("victim", 1000)) == [f"host {i}" for i in range(20)]
    everything = log.recent(None, 1000)
    assert [e["text"] for e in everything if e["agent"] == "node-a"] == [f"node {i}" for i in range(5)]
    assert [e["text"] for e in everything if e["agent"] == "stranger"] == [f"stranger {i}"
                                                                           for i in range(1150, 1250)]
    assert all(e["job"] == "victim" for e in everything if e["agent"] == "host")
    assert refused.get(L.REFUSED_EVENT_SHARE) == 1250 - share
    assert refused.by_agent()["stranger"] == {L.REFUSED_EVENT_SHARE: 1250 - share}
    assert log.stats()["share_evicted"] == 1250 - share and log.stats()["pools"] == 3


def test_an_event_is_the_job_its_sender_hosts_never_its_labels() -> None:
    """``?job=X`` lists what the aggregator attributes to X: an event's own job (the guard let its
    sender speak for it), or the one job a job-less event's sender hosts; a label attributes nothing,
    and a sender hosting several jobs (or none) leaves its job-less events job-less."""
    log = EventLog()
    hosts = {"one": ["mine"], "two": ["x", "y"]}
    log.hosted = lambda agent: hosts.get(agent, [])
    log.ingest("stranger", [_ev(1, job="", labels={"job": "victim"})])
    log.ingest("one", [_ev(2, job="", labels={"job": "victim"}), _ev(3, job="mine")])
    log.ingest("two", [_ev(4, job="")])
    assert log.recent("victim") == []
    assert _texts(log.recent("mine")) == ["e2", "e3"]
    assert log.recent("x") == [] and log.recent("y") == []
    assert {e["text"]: e.get("job") for e in log.recent()} == {"e1": "", "e2": "mine", "e3": "mine", "e4": ""}


def test_a_full_log_takes_from_its_largest_pool_first() -> None:
    """Many senders filling the log each to their share: the job with few events keeps them all, the
    senders holding the most give theirs (the previous log let the oldest go, whoever's)."""
    log = EventLog(max_events=100)  # shares of 10 events
    log.ingest("host", [_ev(i, job="victim") for i in range(3)])
    for s in range(11):
        log.ingest(f"s{s}", [_ev(10 + 10 * s + i, job="") for i in range(10)])
    assert _texts(log.recent("victim")) == ["e0", "e1", "e2"]
    st = log.stats()
    assert st["held"] == 100 and st["share_evicted"] == 0
    held = log.recent(None, 1000)
    per_sender = {a: sum(1 for e in held if e["agent"] == a) for a in {str(e["agent"]) for e in held}}
    assert per_sender.pop("host") == 3 and sorted(per_sender.values()) == [8] * 2 + [9] * 9


def test_a_pool_is_bounded_by_bytes_too() -> None:
    log = EventLog(max_bytes=200_000)  # shares of 20,000 bytes
    log.ingest("noisy", [_ev(i, payload_kb=8, job="") for i in range(10)])
    log.ingest("quiet", [_ev(100, payload_kb=8, job="")])
    st = log.stats()
    assert [e["text"] for e in log.recent() if e["agent"] == "noisy"] == ["e8", "e9"]
    assert st["share_evicted"] == 8 and [e["text"] for e in log.recent() if e["agent"] == "quiet"] == ["e100"]


def test_restored_events_keep_their_pools_and_attribution() -> None:
    """The state store: agent events come back through the journal's replay (the same ingest, the same
    attribution), the aggregator's own from its events document (``restore``): each in the pool its
    kept ``job`` and ``agent`` say, a label still attributing nothing."""
    live = EventLog()
    live.hosted = lambda agent: ["victim"] if agent == "host" else []
    live.ingest("host", [_ev(1, job=""), _ev(2, job="victim")])
    live.ingest("stranger", [_ev(3 + i, job="", labels={"job": "victim"}) for i in range(300)])
    live.ingest("aggregator", [_ev(400, job="victim", kind="incident_opened")])
    doc = [e for e in live.recent(None, 10_000) if e["agent"] == "aggregator"]
    again = EventLog()
    again.hosted = live.hosted
    again.ingest("host", [_ev(1, job=""), _ev(2, job="victim")])
    again.ingest("stranger", [_ev(3 + i, job="", labels={"job": "victim"}) for i in range(300)])
    again.restore(doc)
    assert _texts(again.recent("victim")) == _texts(live.recent("victim")) == ["e1", "e2", "e400"]
    assert _texts(again.recent(None, 1000)) == _texts(live.recent(None, 1000))
    assert again.stats()["pools"] == 2
