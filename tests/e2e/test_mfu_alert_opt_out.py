"""A job's opt-out of the MFU alert travels with the job: given where the job is
started (`perfd agent --no-mfu-alert`, `mfu_alert: false` in its config, `perfd launch --no-mfu-alert`
in its manifest), it rides in the job's info to the aggregator, which exports
perfd_job_mfu_alert_opt_out_info for that job only; PerfdJobMFULow leaves such jobs out
(deploy/prometheus/perfd.rules.test.yml has the alert's side, with promtool)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perfd.agent.config import ConfigError, apply_overrides, load_config
from perfd.core import catalog
from perfd.core.jobinfo_json import job_info_from_json, job_info_to_json
from perfd.core.model import HOOK_FRAMEWORK, JobInfo, merge_job_info
from tests.cli_main import perfd
from tests.inproc import pipeline
from tests.procs import ROOT

DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
SERIES = catalog.JOB_MFU_ALERT_OPT_OUT


@pytest.mark.slow
def test_the_opt_out_given_at_agent_start_reaches_the_exported_series(tmp_path: Path) -> None:
    with pipeline(tmp_path, "--no-rules", "--gpu", "NVIDIA H200") as p:
        for job, extra in (("debug-run", ("--no-mfu-alert",)), ("pretrain", ())):
            log = tmp_path / f"{job}.log"
            shutil.copy(DEMO_LOG, log)
            p.agent("--job", job, "--megatron-log", log, "--host", "off", "--ranks", "off", "--node", "n1",
                    *extra, "--nvml", "off", name=f"agent-{job}")

        def both_known() -> str | None:
            text = p.get("/metrics").decode()
            return text if all(f'perfd_job_mfu_ratio{{job_name="{j}"}}' in text
                               for j in ("debug-run", "pretrain")) else None

        text = p.wait(both_known, 60, "both jobs' MFU on /metrics")
    rows = [ln for ln in text.splitlines() if ln.startswith(SERIES + "{")]
    assert rows == [f'{SERIES}{{job_name="debug-run"}} 1.0'], rows


def test_perfd_launch_writes_it_in_the_manifest_and_the_agent_reads_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `perfd launch` by the CLI's own entry point in this process (tests/cli_main.py): what is tested is
    # the manifest it writes, not its process (the job it starts, `true`, is one)
    manifests = {}
    for name, extra in (("quiet", ["--no-mfu-alert"]), ("plain", [])):
        manifest = tmp_path / f"{name}.json"
        r = perfd(capsys, "launch", "--job", name, *extra, "--manifest", manifest,
                  "--run-dir", tmp_path / name, "--", "true")
        assert r.returncode == 0, r.stdout + r.stderr
        manifests[name] = manifest
    assert json.loads(manifests["quiet"].read_text())["mfu_alert"] is False
    assert json.loads(manifests["plain"].read_text())["mfu_alert"] is True
    read = {name: apply_overrides(load_config(None), launch_manifest=str(m), nvml="off", host=False)
            for name, m in manifests.items()}
    assert (read["quiet"].mfu_alert, read["plain"].mfu_alert) == (False, True)


def test_the_config_file_takes_a_boolean_only(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("mfu_alert: false\n")
    assert load_config(cfg).mfu_alert is False
    cfg.write_text("mfu_alert: 'no'\n")
    with pytest.raises(ConfigError, match="mfu_alert must be bool"):
        load_config(cfg)


def test_the_opt_out_survives_the_wire_and_a_second_describer() -> None:
    log = JobInfo(mfu_alert=False)
    assert job_info_from_json(job_info_to_json(log)).mfu_alert is False
    hook = JobInfo(framework=HOOK_FRAMEWORK)
    assert merge_job_info(log, hook).mfu_alert is False
    assert merge_job_info(hook, log).mfu_alert is False
    assert merge_job_info(JobInfo(), hook).mfu_alert is None
