"""The data side of an incident, with real NVML samples of the rank's GPU.

A plain PyTorch loop on an H100 whose DataLoader's samples cost three times as much for ~50 s
(tests/data/hook/plain_loop_h100/data_steps.json.gz: the loop's own clock) replayed through the
aggregator with NVML frames of an H100 (tests/loop_replay.py): the frames of a training job's GPU
while it trained alone (tests/data/incidents/cotenant_h100/nvml.jsonl.gz, 50-95 s in: ~500 W, no
throttle reason), and, for a few seconds early in the slowdown, frames of an H100 at its power limit
under a bf16 matmul (collectors/nvml/data/h100_phases.jsonl, "matmul": ~698 W of 700 W,
sw_power_cap). The data wait grew by most of the slowdown: the incident's cause must name the data
side whatever the GPU samples show, with the data-loading action, and agree with the iteration marks
(the same analysis). Before: the power cap (tier 3) led the verdict and R1 said to check the GPU's
power limit; and a kept incident's verdict was never decided again once it closed, so its cause
could disagree with the marks of a later analysis. The loop's process is observed every second as
collectors/ranks saw it on the H100 (two DataLoader workers), then in its teardown and gone: the
finished job's advice keeps what was observed while it stepped, and says so.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfd.aggregator.http import job_summary
from perfd.analytics.steps.provenance import Code, cite
from perfd.report.data_text import DATA_MORE_WORKERS_ACTION
from perfd.report.incident_text import cause_line
from tests.gpu.plain_loop_live import truth_data
from tests.loop_replay import PHASES_NVML, TRAINING_NVML, Feed, loop, nvml_frames, replay, run3_host

JOB = "plain-data"
PID = 485  # the loop's pid in the recording
UUID = "GPU-3f304f7f-0179-8aeb-2812-6011d9c6a4aa"  # the training NVML recording's GPU


def _feed(capped_s: float) -> tuple[Feed, dict[str, Any]]:
    rec = loop()
    rows = rec["steps"]
    truth = truth_data(rec)
    frames = nvml_frames(TRAINING_NVML)
    t00 = frames[0]["time"]
    steady = [f for f in frames if 50.0 <= f["time"] - t00 <= 95.0]  # the job alone on its GPU
    capped = [f for f in nvml_frames(PHASES_NVML) if f.get("phase") == "matmul"][1:]  # at the limit
    t0 = 1_795_500_000.0 - rows[0][1]
    feed = Feed()
    feed.steps(JOB, rows, t0, PID)
    start, end = t0 + rows[0][1], t0 + rows[-1][3]
    slow_at = t0 + next(r[1] for r in rows if r[0] == truth["slow_first"])
    cap_from, cap_to = slow_at + 8.0, slow_at + 8.0 + capped_s
    feed.nvml(steady, start, cap_from)
    feed.nvml(capped, cap_from, cap_to)
    feed.nvml(steady, cap_to, end)
    feed.gpu_process(start - 1.0, JOB, PID, UUID)
    host = {**run3_host(), "pid": PID}
    t = start
    while t < end:
        feed.host(t, JOB, host)
        t += 1.0
    # After its last step: its teardown (the workers gone, a CPU busy with the exit), then its exit.
    feed.host(end + 0.5, JOB, {**host, "children": 0, "children_cpu_cores": 0.0, "allowed_busy_ratio": 0.97})
    feed.host(end + 2.0, JOB, {"rank": 0, "pid": PID, "state": "gone", "node": "h100"})
    return feed, truth


@pytest.mark.slow
@pytest.mark.parametrize("capped_s", [0.0, 6.0], ids=["gpu-plain", "gpu-capped-during-it"])
def test_a_data_slowdown_is_named_data_loading_whatever_the_gpu_shows(capped_s: float) -> None:
    feed, truth = _feed(capped_s)
    *_, (_, st) = replay(feed, JOB)
    (inc,) = [i for i in st.incidents.incidents(JOB) if (i["cost_s"] or 0) > 5]
    assert not inc["open"]
    assert abs(inc["first_iteration"] - truth["slow_first"]) <= 20
    assert abs(inc["last_iteration"] - truth["slow_last"]) <= 20
    # The rank's GPU was placed and its NVML read while the incident ran: nothing is missing.
    assert inc["evidence"]["gpu"]["0"]["placed"] and inc["verdict"]["missing"] == []
    v = inc["verdict"]
    assert v["cause"] == "data_wait", inc["cause"]
    assert inc["cause"].startswith("data loading took up to") and "not explained" not in inc["cause"]
    if capped_s:  # the power cap was seen during it, and is listed, never the cause
        assert "power_cap" in {e["kind"] for e in v["also"]}
    # The cause agrees with the iteration marks of the same analysis.
    a = st.analysis(JOB)
    assert a is not None
    (marked,) = [i for i in a.incidents if i.id == inc["id"]]
    assert marked.cause == "" and cause_line(marked) == inc["cause"]  # worded where shown, the same line
    assert a.summary.excluded[inc["first_iteration"]] == cite(Code.IN_INCIDENT, inc["id"])
    full = job_summary(st, JOB)
    assert full is not None
    recs = full["report"]["recommendations"]
    # R1 is the data loader's (the incident's recommendation merges with the run's data-loading one:
    # the same action), and nothing sends the user to the GPU.
    assert recs[0]["action"] == DATA_MORE_WORKERS_ACTION  # its CPUs had room while it ran
    # ... as observed while it stepped, said as such (not its teardown: "its 0 child process(es)").
    assert "its 2 child process(es)" in recs[0]["detail"] and "while running" in recs[0]["detail"]
    assert not any(r["action"].startswith("Check rank 0") for r in recs), [r["action"] for r in recs]


def _its(data_ms_slow: float) -> list[Any]:
    """20 calm steps of 100 ms (20 ms data wait), 10 slow ones of 300 ms, 20 calm again."""
    from perfd.analytics.steps.iteration import IterationResult

    steps = [(100.0, 20.0)] * 20 + [(300.0, data_ms_slow)] * 10 + [(100.0, 20.0)] * 20
    return [IterationResult(i + 1, step_time_ms=s, data_share=d / s) for i, (s, d) in enumerate(steps)]


def test_a_closed_incident_is_decided_again_when_its_steps_read_differently() -> None:
    """The tracker keeps a closed incident's GPU evidence of the time, but what its steps show comes
    from the analysis that marks its iterations: a later analysis that reads the data wait as the
    cause (the steady rate firmed up) makes the kept cause say so too (it said "not explained")."""
    from perfd.aggregator.incidents import IncidentTracker
    from perfd.analytics.incidents.detect import detect_incidents

    def found(data_ms_slow: float) -> Any:
        its = _its(data_ms_slow)
        ends = {it.iteration: 1000.0 + it.iteration * 0.2 for it in its}
        return detect_incidents(its, ends, {}, 0, None, world_size=1).incidents

    tr = IncidentTracker(lambda evs: None)
    before = found(20.0)  # the slow steps' data wait did not grow: nothing explains them
    assert before[0].verdict is not None and before[0].verdict.lead is None
    tr.update("j", before, lambda inc: {}, [], 2000.0)
    (kept,) = tr.incidents("j")
    assert "not explained" in kept["cause"] and not kept["open"]
    after = found(220.0)  # the same iterations, their data wait now most of the slowdown
    tr.update("j", after, lambda inc: {}, [], 2001.0)
    (kept,) = tr.incidents("j")
    assert kept["verdict"]["cause"] == "data_wait" and kept["cause"] == cause_line(after[0])
