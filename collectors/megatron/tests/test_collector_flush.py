"""The agent-side collector hands over the job's last iteration at shutdown."""

from pathlib import Path

from collectors.megatron.collector import MegatronCollector

ROOT = Path(__file__).resolve().parents[3]
LOG = ROOT / "perfd" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"


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
