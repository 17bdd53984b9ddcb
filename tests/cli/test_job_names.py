"""A job name that cannot be one, refused where it is given: ``--job ""`` had become
the job "default" and a literal ``$(PERFD_JOB)`` a job of that name, each merging unrelated pods into
one job. The CLI's own entry point, in the test's process (tests/cli_main.py): exit 2 and the reason,
nothing started."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfd.core.jobname import MAX_JOB_NAME, job_name_problem
from tests.cli_main import Ran
from tests.cli_main import perfd as run_perfd

ROOT = Path(__file__).resolve().parents[2]
BAD = ["", "   ", "$(PERFD_JOB)", "${PERFD_JOB}", "$PERFD_JOB", "{{ .Values.job }}", " llama ",
       "a\nb", "x" * (MAX_JOB_NAME + 1)]
GOOD = ["llama-70b", "default", "team/run 7", "pretrain_gpt.2026-11-25", "x" * MAX_JOB_NAME, "price$5"]


@pytest.fixture
def perfd(capsys: pytest.CaptureFixture[str]):
    def run(*args: str) -> Ran:
        return run_perfd(capsys, *args)
    return run


@pytest.mark.parametrize("name", BAD)
def test_names_that_cannot_be_a_job_are_refused_with_a_reason(name: str) -> None:
    assert job_name_problem(name)


@pytest.mark.parametrize("name", GOOD)
def test_real_names_pass(name: str) -> None:
    assert job_name_problem(name) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["", "$(PERFD_JOB)"])
def test_perfd_launch_refuses_and_runs_nothing(name: str, tmp_path: Path, perfd) -> None:
    marker = tmp_path / "ran"
    r = perfd("launch", "--job", name, "--run-dir", str(tmp_path / "run"), "--",
              sys.executable, "-c", f"open({str(marker)!r}, 'w').close()")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("perfd launch: --job ") and len(r.stderr.strip().splitlines()) == 1
    assert ("empty" if not name else "unexpanded") in r.stderr
    assert not marker.exists() and not (tmp_path / "run" / "launch.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["", "$(PERFD_JOB)"])
def test_perfd_agent_refuses_a_job_flag_that_is_no_name(name: str, perfd) -> None:
    r = perfd("agent", "--job", name, "--aggregator", "", "--nvml", "off", "--metrics-port", "-1")
    assert r.returncode == 2, (r.stdout, r.stderr[-800:])
    assert "configuration error: --job " in r.stderr


@pytest.mark.slow
def test_perfd_agent_refuses_a_manifest_whose_job_is_no_name(tmp_path: Path, perfd) -> None:
    m = tmp_path / "launch.json"
    m.write_text(json.dumps({"version": 1, "job": "$(PERFD_JOB)", "collectors": {}}))
    r = perfd("agent", "--launch-manifest", str(m), "--aggregator", "", "--nvml", "off",
              "--metrics-port", "-1")
    assert r.returncode == 2, (r.stdout, r.stderr[-800:])
    assert "its job '$(PERFD_JOB)' is a variable left unexpanded" in r.stderr
