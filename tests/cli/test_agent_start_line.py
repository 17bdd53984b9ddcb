"""What a person starting `perfd agent` sees at the default verbosity: one line with the address
its /metrics listens on (the bound port when asked for any free one), as docs/usage.md says."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.procs import stop, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.slow
def test_agent_prints_its_listening_line(tmp_path: Path) -> None:
    out = tmp_path / "agent.out"
    p = subprocess.Popen([sys.executable, "-m", "perfd.app.cli", "agent", "--job", "j", "--nvml", "off",
                          "--host", "off", "--metrics-port", "0"], cwd=ROOT, stdout=out.open("wb"),
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        line = wait_for(lambda: (m := re.search(r"^perfd agent: listening on (http://127\.0\.0\.1:(\d+)/metrics)$",
                                                out.read_text(), re.M)) and m, 60, "the listening line")
        with urllib.request.urlopen(line.group(1), timeout=10) as r:  # the printed address answers
            assert b"perfd_build_info" in r.read()
    finally:
        stop(p)
