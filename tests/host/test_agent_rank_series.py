"""The real agent's own /metrics follows a rank process's state: when the rank is stopped, its state
info series says ``stopped`` and nothing else (the agent kept every label set it had ever emitted:
``running`` or ``sleeping`` stayed 1 beside ``stopped``, and a scrape could not tell the state). The
rank is a process (SIGSTOP is what changes its state); the agent runs in the test's process
(tests/inproc.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perfd.core.catalog import RANK_STATE_INFO
from perfd.core.manifest import MANIFEST_VERSION
from tests.inproc import pipeline
from tests.procs import Procs, http_get

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
              pytest.mark.slow]

JOB = "one-rank"


def test_the_agents_metrics_show_only_the_ranks_current_state(tmp_path: Path) -> None:
    with Procs(tmp_path) as procs, pipeline(tmp_path, "--no-rules") as p:
        rank = procs.start("rank", [sys.executable, "-c", "import time\nwhile True: time.sleep(0.2)\n"])
        # As `perfd launch` writes it, for one process declaring no RANK: rank 0.
        manifest = tmp_path / "launch.json"
        manifest.write_text(json.dumps({"version": MANIFEST_VERSION, "job": JOB, "status": "running",
                                        "pid": rank.pid,
                                        "collectors": {"ranks": {"launch_manifest": str(manifest)}}}))
        # The agent's own /metrics is what is read (what it sends the aggregator is not).
        url = p.agent("--job", JOB, "--host", "off", "--launch-manifest", manifest, "--nvml", "off",
                      "--metrics-port", "0").metrics_url

        def states() -> list[str]:
            text = http_get(url).decode()
            return sorted(s.labels["process_state"] for f in text_string_to_metric_families(text)
                          for s in f.samples if s.name == RANK_STATE_INFO and s.labels.get("rank") == "0")

        def now() -> list[str] | None:
            try:
                return states()
            except OSError:  # the agent's HTTP server not up yet
                return None

        live = (["running"], ["sleeping"])  # a 0.2 s sleeper reads running when the load keeps it waiting
        p.wait(lambda: now() in live, 60, "rank 0 on the agent's /metrics", interval=0.5)
        os.kill(rank.pid, signal.SIGSTOP)
        try:
            # One series, the new state: not the old one beside it.
            p.wait(lambda: now() == ["stopped"], 30, "rank 0 stopped, and only that", interval=0.5)
        finally:
            os.kill(rank.pid, signal.SIGCONT)
        p.wait(lambda: now() in live, 30, "rank 0 running again, and only that", interval=0.5)
