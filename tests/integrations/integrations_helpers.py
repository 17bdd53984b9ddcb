"""Shared by the integration tests: real programs on loopback, bounded in time, stopped by the test.

Programs installed from Debian packages by ci/install-system-deps.sh (prometheus, promtool, amtool)
are required in CI; elsewhere a test that needs one skips and says which package provides it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from perfd.core import catalog, catalog_labels
from tests.procs import free_port as free_port
from tests.procs import http_get

get = http_get  # the integration tests import get and free_port from here

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOG = ROOT / "perfd" / "app" / "demo" / "data" / "megatron_h200x2_tp1_pp2.log"
NVML_REPLAY = ROOT / "perfd" / "collectors" / "nvml" / "data" / "h100_phases.jsonl"
PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "perfd.rules.yml"

# Program -> the Debian package that provides it (ci/install-system-deps.sh installs them).
PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus", "amtool": "prometheus-alertmanager",
            "victoria-metrics": "victoria-metrics"}

T = TypeVar("T")


def need(program: str) -> str:
    """The path of ``program``, or skip the test with the reason (CI installs it). With
    PERFD_REQUIRE_SYSTEM_DEPS=1 (set by .ci/run) a missing program fails the test instead: in CI
    a skip would hide a broken install."""
    path = shutil.which(program)
    if path is None:
        pkg = PACKAGES.get(program, program)
        why = (f"{program} not installed (Debian package {pkg!r}; ci/install-system-deps.sh installs it, "
               "CI runs that script)")
        if os.environ.get("PERFD_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail(why + " and PERFD_REQUIRE_SYSTEM_DEPS=1")
        pytest.skip(why)
    return path


def wait_for(pred: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            got = pred()
            if got:
                return got
            last = got
        except (OSError, ValueError, KeyError, IndexError) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}")


def stop(p: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL if the process does not stop in time. Returns the exit code."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    return int(p.returncode)


def perfd(*args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "perfd.app.cli", *args], cwd=ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


@dataclass
class Live:
    """A running aggregator + agent (loopback) that have ingested the whole demo log."""

    job: str
    aggregator_url: str  # http://127.0.0.1:PORT
    agent_url: str
    last_iteration: int
    tmp: Path


@dataclass
class LiveProcs:
    aggregator: subprocess.Popen[bytes]
    agent: subprocess.Popen[bytes] | None = None


def start_live(tmp: Path, job: str = "itest", extra_aggregator_args: tuple[str, ...] = (),
               log_source: Path = DEMO_LOG) -> Iterator[Live]:
    """Generator for a fixture: aggregator + agent (Megatron log copy + NVML replay), yields once
    the aggregator has every iteration of the log, stops both afterwards."""
    ready = tmp / "ready"
    agg = perfd("aggregator", "--grpc-host", "127.0.0.1", "--grpc-port", "0", "--http-host", "127.0.0.1",
                "--http-port", "0", "--ready-file", str(ready), *extra_aggregator_args,
                log=tmp / "aggregator.out")
    procs = LiveProcs(agg)
    try:
        # 60 s: a loaded 2-CPU machine (two suites at once) took over 20 s to start one.
        ports = wait_for(lambda: ready.read_text().split() if ready.exists() else None, 60,
                         "aggregator ready file")
        grpc_port, http_port = int(ports[0]), int(ports[1])
        train_log = tmp / "train.log"
        shutil.copy(log_source, train_log)
        last_it = max(int(m) for m in re.findall(r"iteration\s+(\d+)/", train_log.read_text()))
        metrics_port = free_port()
        cfg = tmp / "agent.yaml"
        cfg.write_text("metrics_host: 127.0.0.1\nbatch_interval_s: 0.2\n")
        procs.agent = perfd("agent", "--config", str(cfg), "--aggregator", f"127.0.0.1:{grpc_port}",
                            "--job", job, "--megatron-log", str(train_log), "--nvml", f"replay:{NVML_REPLAY}",
                            "--metrics-port", str(metrics_port), "--node", "itest-node",
                            log=tmp / "agent.out")
        live = Live(job, f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{metrics_port}", last_it, tmp)

        def caught_up() -> bool:
            # GPU samples: from the JSON API (the aggregator's /metrics leaves node series to the agents).
            text = get(f"{live.aggregator_url}/metrics").decode()
            gpus = json.loads(get(f"{live.aggregator_url}/api/jobs/{job}/gpus"))["gpus"]
            return f'perfd_job_iteration{{job_name="{job}"}} {float(last_it)}' in text \
                and any("perfd_gpu_power_watts" in g["values"] for g in gpus)

        wait_for(caught_up, 60, f"the aggregator to ingest iteration {last_it} and GPU samples")
        wait_for(lambda: b"perfd_gpu_power_watts{" in get(f"{live.agent_url}/metrics"), 20,
                 "the agent's own /metrics")
        yield live
    finally:
        codes = {}
        if procs.agent is not None:
            codes["agent"] = stop(procs.agent)
        codes["aggregator"] = stop(agg)
        bad = {k: v for k, v in codes.items() if v != 0}
        assert not bad, f"exit codes {bad}:\n" + "\n".join(
            (tmp / f"{k}.out").read_text()[-2000:] for k in bad)


def promql_metric_names(expr: str) -> set[str]:
    """perfd metric names an expression references (recorded names like
    ``job_name:perfd_job_mfu_ratio:avg`` give the perfd name inside them)."""
    return set(re.findall(r"(?<![a-z0-9_])perfd_[a-z0-9_]+", expr))


def catalog_problems(names: set[str]) -> list[str]:
    """Why each name would not match a series perfd exports: not in the catalog, or a counter
    referenced without ``_total`` (Prometheus sample names of counters end in _total)."""
    problems = []
    kinds = {m.name: m.kind for m in catalog.all_metrics()}
    for n in sorted(names):
        if n in kinds:
            continue
        parent = re.sub(r"_(bucket|count|sum|gcount|gsum)$", "", n)
        if parent != n and kinds.get(parent) == "histogram":  # a histogram's own series
            continue
        if n + "_total" in kinds:
            problems.append(f"{n}: a counter; its samples are named {n}_total")
        else:
            problems.append(f"{n}: not in perfd.core.catalog")
    return problems


# Labels Prometheus adds (job, instance) and perfd's own.
KNOWN_LABELS = set(catalog_labels.LABELS) | {"job", "instance", "le", "__name__"}


def promql_label_names(expr: str) -> set[str]:
    """Label names used in selectors ({a="x", b=~"y"}) and in by/without/on/ignoring clauses."""
    labels: set[str] = set()
    for body in re.findall(r"\{([^{}]*)\}", expr):
        # Skip Go-template bodies ({{ $labels.x }}) and Grafana's {{legend}}.
        if body.startswith("{") or "$labels" in body:
            continue
        labels.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in clause.split(",") if x.strip())
    return labels
