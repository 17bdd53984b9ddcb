"""The agent-side collector hands over the job's last iteration at shutdown."""

from pathlib import Path
from typing import Any

from perfd.collectors.megatron.collector import MegatronCollector
from perfd.core.model import JobInfo, StepRecord

ROOT = Path(__file__).resolve().parents[4]
LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


def test_last_iteration_is_flushed_at_stop(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(LOG.read_text())
    col = MegatronCollector({"path": str(log), "job": "j", "flush_after_s": 3600})
    assert col.probe().available
    col.start()
    first = col.collect(0.0)
    its = [r.iteration for r in first.steps]
    assert its == list(range(1, 40))  # the 40th waits for the next iteration line (or a quiet log)
    assert "j" in first.job_info
    last = col.flush(1.0)
    assert [r.iteration for r in last.steps] == [40]
    assert col.flush(2.0).steps == []  # flushed once
    col.stop()


def test_sample_config_builds_a_collector() -> None:
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "sample.yaml").read_text())
    col = MegatronCollector(cfg)
    assert col.path.endswith("train.log") and col.job == "gpt-8b"
    assert col.line_times is not None and str(col.line_times.path).endswith("train.log.times")


def test_a_tail_far_behind_skips_ahead_with_an_event_and_a_count(tmp_path: Path) -> None:
    import re

    from perfd.core.events import LOG_GAP

    text = LOG.read_text()
    log = tmp_path / "train.log"
    log.write_text(text)
    col = MegatronCollector({"path": str(log), "job": "j", "flush_after_s": 3600,
                             "max_bytes_per_collect": 4096, "max_lag_bytes": 16384})
    col.start()
    steps: list[StepRecord] = []
    events: list[dict[str, Any]] = []
    infos: list[JobInfo] = []
    for _ in range(200):
        out = col.collect(0.0)
        steps.extend(out.steps)
        events.extend(out.events)
        infos.extend(out.job_info.values())
    steps.extend(col.flush(1.0).steps)
    gaps = [e for e in events if e["kind"] == LOG_GAP.name]
    assert len(gaps) == 1 and col.errors.get("tail:skipped_ahead") == 1
    assert col.tail is not None
    skipped = gaps[0]["payload"]["skipped_bytes_total"]
    assert skipped == col.tail.counts["skipped_bytes"] and 0 < skipped < len(text)
    its = [r.iteration for r in steps]
    assert its == sorted(set(its)) and its[-1] == 40  # what was read is whole and ends at the end
    assert len(its) < 40  # and what was passed over is not invented
    assert infos and infos[-1].layout.world_size == 2  # the start-up block was read whole first
    last = int(re.findall(r"iteration\s+(\d+)/", text)[-1])
    assert last == 40
    col.stop()
