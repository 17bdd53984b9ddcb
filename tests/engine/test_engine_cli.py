"""The engine's flags refuse what cannot work, with a reason and exit 2 (a wrong URL scheme, an
unreadable or empty token file, --engine beside --aggregator, a shard with no engine), and a shard
that cannot reach its engine exits 1 saying where it tried, within seconds, instead of retrying
silently for ever. Each command by the CLI's own entry point, in the test's process (tests/cli_main.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_main import Ran
from tests.cli_main import perfd as run_perfd


@pytest.fixture
def _run(capsys: pytest.CaptureFixture[str]):
    def run(*args: str) -> Ran:
        return run_perfd(capsys, *args)
    return run


@pytest.mark.slow
@pytest.mark.parametrize("args, says", [
    (["shard"], "--engine is required"),
    (["shard", "--engine", "http://127.0.0.1:4222"], "--engine wants nats://HOST:PORT"),
    (["shard", "--engine", "nats://127.0.0.1:4222", "--engine-partitions", "0"],
     "--engine-partitions must be >= 1"),
    (["shard", "--engine", "nats://127.0.0.1:4222", "--engine-ack-wait", "0"],
     "--engine-ack-wait must be > 0 seconds"),
    (["aggregator", "--engine", "nats://127.0.0.1:4222", "--engine-lease-ttl", "nan"],
     "--engine-lease-ttl must be > 0 seconds"),
    (["aggregator", "--engine", "nats://127.0.0.1:4222", "--engine-token-file", "/nonexistent/token"],
     "cannot read --engine-token-file"),
    (["agent", "--engine", "nats://127.0.0.1:4222", "--aggregator", "127.0.0.1:50051", "--nvml", "off"],
     "one or the other"),
    (["agent", "--engine", "redis://127.0.0.1:6379", "--nvml", "off"], "engine must be nats://"),
    (["agent", "--engine", "nats://127.0.0.1:4222", "--engine-collectives", "root", "--nvml", "off"],
     "invalid choice: 'root'"),
    (["aggregator", "--engine-advertise-http", "http://10.0.0.7:8080"], "needs --engine"),
    (["aggregator", "--engine", "nats://127.0.0.1:4222", "--engine-advertise-http", "10.0.0.7:8080"],
     "takes http(s)://HOST:PORT"),
    (["aggregator", "--engine-job", "pretrain"], "--engine-job takes a job's name and needs --engine"),
    (["aggregator", "--engine", "nats://127.0.0.1:4222", "--engine-job", " "], "(got ' ')"),
])
def test_engine_flags_that_cannot_work_are_refused_with_a_reason(args, says, _run):
    res = _run(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert says in res.stderr


@pytest.mark.slow
def test_an_empty_token_file_is_refused(tmp_path: Path, _run):
    empty = tmp_path / "token"
    empty.write_text("\n")
    empty.chmod(0o600)
    res = _run("shard", "--engine", "nats://127.0.0.1:4222", "--engine-token-file", str(empty))
    assert res.returncode == 2 and "is empty" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("role", ["shard", "agent"])
def test_an_engine_token_file_others_may_read_is_refused_before_anything_starts(tmp_path: Path, role: str,
                                                                                       _run):
    """The engine's token lets its holder publish commands to agents and take the root's lease: a
    copy other users can read is refused, naming the file, its mode and the fix (the agent reads it
    only once its run starts, so its command line checks it first)."""
    token = tmp_path / "token"
    token.write_text("s3cret-s3cret-s3cret\n")
    token.chmod(0o644)
    extra = ["--nvml", "off", "--host", "off", "--metrics-port", "0", "--spool-dir", str(tmp_path / "spool"),
             "--state-dir", str(tmp_path / "state")] if role == "agent" else []
    res = _run(role, "--engine", "nats://127.0.0.1:4222", "--engine-token-file", str(token), *extra)
    assert res.returncode == 2, res.stderr
    assert f"chmod 600 {token}" in res.stderr and "0644" in res.stderr


@pytest.mark.slow
def test_a_shard_that_cannot_reach_its_engine_exits_1_naming_it(_run):
    res = _run("shard", "--engine", "nats://127.0.0.1:1", "--id", "s")
    assert res.returncode == 1, res.stderr
    assert "the engine at nats://127.0.0.1:1" in res.stderr and "NoServersError" in res.stderr
    assert "Traceback" not in res.stderr  # one line per attempt, not nats-py's tracebacks


def test_an_agent_config_naming_another_place_to_fold_is_refused(tmp_path: Path) -> None:
    from perfd.agent.config import ConfigError, load_config

    cfg = tmp_path / "agent.yaml"
    cfg.write_text("engine: nats://127.0.0.1:4222\nengine_collectives: root\n")
    with pytest.raises(ConfigError, match="engine_collectives must be one of agent, shard, got 'root'"):
        load_config(cfg).finish()
    cfg.write_text("engine: nats://127.0.0.1:4222\nengine_collectives: shard\n")
    assert load_config(cfg).finish().engine_collectives == "shard"
