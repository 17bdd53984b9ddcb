"""What a `perfd` process loads before its command runs: every command builds the whole parser at its
start, so a module that registers a command loads only what its arguments need. `perfd agent` on every
node and `perfd nsys-exec` / `perfd ncu-exec` in front of every rank paid the analytics, the report and
rich (the aggregator's and `perfd top`'s) at each start: 0.35-0.5 s of CPU and ~10 MB of the agent's
RSS, before they did anything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.procs import ROOT, run_env

# What only the aggregator, `perfd top`, the offline analyses and the captures' readers need.
HEAVY = ("perfd.analytics", "perfd.report", "perfd.capture.analysis", "perfd.capture.nsys_sqlite",
         "perfd.aggregator.jobs", "perfd.aggregator.state", "perfd.commands.top_screen", "rich", "torch")


def _loaded(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after ``code``."""
    probe = (f"import json, sys\n{code}\nheavy = {HEAVY!r}\n"
             "print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
             "for h in heavy))))")
    got = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=run_env(), capture_output=True,
                         text=True, timeout=60, check=True)
    return list(json.loads(got.stdout.splitlines()[-1]))


@pytest.mark.e2e
def test_the_parser_loads_no_analytics_report_or_screen() -> None:
    assert _loaded("import perfd.cli\nperfd.cli.build_parser()") == []


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["agent", "nsys-exec", "ncu-exec", "launch", "shard"])
def test_the_per_node_and_per_rank_commands_start_light(command: str) -> None:
    """Each command's parse, then the modules its handler imports first (the agent's, the wrappers')."""
    handler = {"agent": "import perfd.agent.node_agent",
               "nsys-exec": "import perfd.capture.nsys_exec, perfd.capture.binaries",
               "ncu-exec": "import perfd.capture.ncu_exec, perfd.armed",
               "launch": "import perfd.launcher",
               "shard": "import perfd.engine.shard"}[command]
    argv = [command, "--job", "j", "--", "python", "train.py"] if command.endswith("-exec") else [command]
    code = (f"import perfd.cli\np = perfd.cli.build_parser()\n"
            f"assert p.parse_known_args({argv!r})[0].command == {command!r}\n{handler}")
    assert _loaded(code) == []


@pytest.mark.e2e
def test_perfd_help_still_lists_every_command() -> None:
    """The screen's split left `perfd top` in the list and its --help whole."""
    out = subprocess.run([sys.executable, "-m", "perfd.cli", "--help"], cwd=ROOT, env=run_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for command in ("agent", "aggregator", "top", "launch", "nsys-exec", "ncu-exec", "shard", "analyze"):
        assert f"    {command}" in out, command
    top = subprocess.run([sys.executable, "-m", "perfd.cli", "top", "--help"], cwd=ROOT, env=run_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--once" in top and "--auth-token-file" in top
