"""``perfd agent --metrics-port 0 --ready-file F``: the agent writes the port it bound once /metrics
listens, so a supervisor (``perfd demo``) needs no port picked free beforehand, which another program
can take first (the demo failed so with two test suites at once on one machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.procs import Procs, http_get, run_env, wait_for

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux"), pytest.mark.slow]


@pytest.mark.e2e
def test_the_agent_writes_the_port_it_bound(tmp_path: Path) -> None:
    ready = tmp_path / "agent.ready"
    with Procs(tmp_path, run_env()) as procs:
        agent = procs.perfd("agent", "agent", "--nvml", "off", "--host", "off", "--ranks", "off",
                            "--metrics-port", "0", "--ready-file", str(ready), role="agent")
        port = int(wait_for(lambda: ready.exists() and ready.read_text(), 60, "the ready file"))
        assert port > 0 and agent.poll() is None
        assert b"perfd_agent" in http_get(f"http://127.0.0.1:{port}/metrics")
        # Without /metrics the file still says the agent is up, with -1.
        none = tmp_path / "none.ready"
        procs.perfd("agent2", "agent", "--nvml", "off", "--host", "off", "--ranks", "off",
                    "--metrics-port", "-1", "--ready-file", str(none), role="agent")
        assert wait_for(lambda: none.exists() and none.read_text(), 60, "the second ready file") == "-1\n"
