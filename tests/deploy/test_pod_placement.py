"""The sidecar topology with a trainer that declares no PERFD_JOB (without it the node
agent placed none of the job's GPUs, and a rule's capture reached only the sidecar, which knew no
process for the rank), with real processes in a real pid namespace (`unshare --pid`): the pod of a
Kubernetes job with shareProcessNamespace: true, its sidecar agent and its trainer inside, the node
agent and the aggregator on the host.

- The node agent's view (perfd.core.procinfo.PodJobs, as collectors/nvml uses it for every GPU process):
  a process that declares no job takes the job its pod declares (the sidecar's PERFD_JOB); one that
  declares its own keeps it; a process of the node's own pid namespace takes none.
- The sidecar (`--ranks pod`) follows the ranks of its pod, and a capture asked of the aggregator for
  rank 0 reaches it and runs: a real PyTorch process (CPU) writes a Kineto trace of the steps asked,
  the pid it asked with being the one the sidecar armed (the pod's pid, not the node's).

tests/gpu/verify_pod_placement.py is the same on a GPU machine, with real NVML in the node agent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from perfd.app.cli import main
from perfd.collectors.nvml.processes import GpuProcess, ProcessTracker
from perfd.core.procinfo import PodJobs, pid_namespace
from tests.capture.trace_content import holds_ops
from tests.inproc import pipeline
from tests.procs import free_port, get_json, run_env, wait_for

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "megatron" / "dp2_all_timers.log"
JOB, NODE = "gpt-pod", "gpu-node-9"


def _pod_prefix() -> list[str]:
    """`unshare` making a pid namespace (a pod's), as root or in a user namespace of our own."""
    base = ["unshare", "--pid", "--fork", "--mount-proc"]
    return base if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", *base[1:]]


def _pods_possible() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    try:
        r = subprocess.run([*_pod_prefix(), "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if r.returncode == 0 else f"this machine refuses a pid namespace: {r.stderr.strip()}"


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_pods_possible() is not None,
                                                   reason=str(_pods_possible()))]


def _in_pod(pod: subprocess.Popen[Any] | psutil.Process, marker: str, timeout: float = 30) -> int:
    """The node's pid of the process of ``pod`` whose command line holds ``marker`` (the topmost: a
    rank's helpers, torch's among them, carry its command line too)."""
    def find() -> int | None:
        found = []
        for p in psutil.Process(pod.pid).children(recursive=True):
            try:  # not the pod's shell, whose command line names every process it starts
                if p.name() not in ("sh", "unshare") and marker in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                continue
        pids = {p.pid for p in found}
        top = [p.pid for p in found if p.ppid() not in pids]
        return int(top[0]) if top else None
    return int(wait_for(find, timeout, f"the pod's process {marker!r}"))


@pytest.fixture
def pods() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:  # the pod's processes, then unshare itself
        try:
            children = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        p.kill()
        p.wait(timeout=20)


def test_a_gpu_process_without_perfd_job_takes_its_pods_job(pods: list[subprocess.Popen[bytes]]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PERFD_JOB", "RANK", "WORLD_SIZE")}
    script = ("env PERFD_JOB=gpt-pod sleep 301 & env RANK=0 WORLD_SIZE=2 sleep 302 & "
              "env RANK=1 WORLD_SIZE=2 PERFD_JOB=another sleep 303 & wait")
    pods.append(subprocess.Popen([*_pod_prefix(), "sh", "-c", script], env=env))
    sidecar, rank0, other = (_in_pod(pods[-1], f"sleep {n}") for n in (301, 302, 303))
    pods.append(subprocess.Popen([*_pod_prefix(), "sh", "-c", "env RANK=0 sleep 304 & wait"], env=env))
    lonely = _in_pod(pods[-1], "sleep 304")  # a pod where nothing declares a job
    host = subprocess.Popen(["sleep", "305"], env={**env, "RANK": "0"})  # the node's own namespace
    try:
        # Until it has exec'd sleep its environment is still this process's (no RANK): a reading then was
        # (None, None) under load, as the pods' processes are waited for by their command lines.
        wait_for(lambda: psutil.Process(host.pid).cmdline() == ["sleep", "305"], 30,
                 "the host process's exec", interval=0.02)
        assert pid_namespace(rank0) == pid_namespace(sidecar) != pid_namespace("self")
        jobs = PodJobs()
        assert jobs.job_of(rank0) == "gpt-pod"
        assert jobs.job_of(lonely) is None and jobs.job_of(host.pid) is None
        scans = jobs.scans
        assert jobs.job_of(rank0) == "gpt-pod" and jobs.scans == scans  # remembered per pod
        # What collectors/nvml reports for those GPU processes (the real psutil lookups).
        tracker = ProcessTracker(pod_job=jobs.job_of)
        procs = [GpuProcess(pid, 1 << 30) for pid in (rank0, other, lonely, host.pid)]
        ev = tracker.update({"gpu": "0"}, procs, time.time())
        assert ev is not None
        got = {p["pid"]: (p["job"], p["rank"]) for p in ev["payload"]}
        assert got == {rank0: ("gpt-pod", 0), other: ("another", 1), lonely: (None, 0), host.pid: (None, 0)}
    finally:
        host.kill()
        host.wait()


# A rank of the job: a real PyTorch (CPU) training loop, as Kineto's on-demand protocol sees it.
TRAINER = textwrap.dedent("""
    import sys, time
    import torch
    m = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    print("ready", flush=True)
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[1]):
        loss = m(torch.randn(32, 64)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.02)
""")


@pytest.mark.xdist_group("torch_processes")  # one real torch process at a time (test_kineto_daemon)
def test_the_sidecar_follows_its_pods_ranks_and_captures_them(
        tmp_path: Path, pods: list[subprocess.Popen[bytes]], capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="CPU torch (the dev extra) runs the rank")
    # The aggregator in the test's process (tests/inproc.py); the sidecar agent runs in the pod.
    with pipeline(tmp_path, "--no-rules") as agg:
        grpc, base = agg.agg.grpc_port, agg.base
        # Kineto's socket in a folder of the pod's (the abstract name is one per network namespace;
        # this test's pod shares the machine's); short: a Unix address holds 107 bytes.
        sdir = Path(tempfile.mkdtemp(prefix="pk", dir="/tmp"))
        cfg = tmp_path / "sidecar.yaml"
        cfg.write_text(f"kineto_socket_dir: {sdir}\ncapture_dir: {tmp_path / 'captures'}\n")
        (tmp_path / "trainer.py").write_text(TRAINER)
        kineto_cfg = tmp_path / "kineto.conf"
        kineto_cfg.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
        log = tmp_path / "train.log"
        log.write_text(LOG.read_text())
        env = run_env(drop=("PERFD_JOB", "RANK", "LOCAL_RANK", "WORLD_SIZE"))
        sidecar = (f"{sys.executable} -m perfd.app.cli agent --config {cfg} --job {JOB} --node {NODE} "
                   f"--aggregator 127.0.0.1:{grpc} --megatron-log {log} --nvml off --host off --ranks pod "
                   f"--metrics-port {free_port()} >{tmp_path / 'sidecar.out'} 2>&1")
        trainer = (f"env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 KINETO_USE_DAEMON=1 KINETO_CONFIG={kineto_cfg} "
                   f"KINETO_IPC_SOCKET_DIR={sdir} {sys.executable} {tmp_path / 'trainer.py'} 240 "
                   f">{tmp_path / 'trainer.out'} 2>&1")
        pod = f"PERFD_JOB={JOB} {sidecar} & {trainer} & wait"  # the sidecar's PERFD_JOB: the pod's label
        pods.append(subprocess.Popen([*_pod_prefix(), "sh", "-c", pod], env=env, cwd=ROOT))
        rank0 = _in_pod(pods[-1], "trainer.py")
        nspid = next(ln for ln in Path(f"/proc/{rank0}/status").read_text().splitlines()
                     if ln.startswith("NSpid:"))
        inside = int(nspid.split()[-1])  # the innermost namespace's pid: the pod's
        assert inside != rank0  # the pod's pid of the rank, what its Kineto requests carry

        def followed() -> list[dict[str, Any]] | None:
            hosts = get_json(f"{base}/api/jobs/{JOB}/gpus")["rank_hosts"]
            return hosts or None

        (row,) = wait_for(followed, 90, "the sidecar following rank 0 of its pod")
        assert (row["rank"], row["pid"], row["node"]) == (0, inside, NODE)

        capfd.readouterr()  # `perfd capture` through the CLI's main(): its exit status, what it printed
        rc = main(["capture", "--aggregator", base, "--job", JOB, "--ranks", "0", "--steps", "3",
                   "--tool", "kineto"])
        out = capfd.readouterr()
        assert rc == 0, out.out + out.err

        def ended() -> dict[str, Any] | None:
            caps = [c for c in get_json(f"{base}/api/captures")["captures"] if c["job"] == JOB]
            return caps[-1] if caps and caps[-1]["status"] in ("finished", "failed") else None

        cap = wait_for(ended, 120, "the capture to end")
        assert "no process known" not in cap["reason"], cap  # the answer when no rank was placed
        assert cap["agents"] == [f"{NODE}/{JOB}"], cap
        (manifest,) = (tmp_path / "captures").rglob("manifest.json")
        m = json.loads(manifest.read_text())
        # Armed for the pod's pid of rank 0, the pid its Kineto request carried: the trace is its. Its
        # verdict the one the file calls for (tests/capture/trace_content.py: a starved CPU job's window
        # may hold nothing, which perfd refuses as the rank's miss)
        traces = [p for p in manifest.parent.iterdir() if p.name != "manifest.json"]
        assert [t.name for t in traces] == [f"rank0_{inside}.json"], cap
        recorded = holds_ops(traces[0])
        assert (m["pids"], m["status"]) == ({"0": inside}, "ok" if recorded else "failed"), m
        assert cap["status"] == ("finished" if recorded else "failed"), cap
        shutil.rmtree(sdir, ignore_errors=True)
