"""What a `perfd` process loads before its command runs: every command builds the whole parser at its
start, so a module that registers a command loads only what its arguments need. `perfd agent` on every
node and `perfd nsys-exec` / `perfd ncu-exec` in front of every rank paid the analytics, the report and
rich (the aggregator's and `perfd top`'s) at each start: 0.35-0.5 s of CPU and ~10 MB of the agent's
RSS, before they did anything. Nor does a training script that imports perfd's hook load a framework
or torch it did not, and the agent and aggregator never load torch.

What a fresh interpreter has imported is what these tests read: in the test's process perfd, rich and
torch are loaded already by other tests, so each check runs in an interpreter of its own (the module
keeps every such check of the suite). `perfd --help` runs in the test's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli_main import perfd
from tests.procs import ROOT, run_env

# What only the aggregator, `perfd top`, the offline analyses and the captures' readers need.
HEAVY = ("perfd.analytics", "perfd.report", "perfd.capture.analysis", "perfd.capture.nsys_sqlite",
         "perfd.aggregator.jobs", "perfd.aggregator.state", "perfd.app.commands.top_screen", "rich", "torch")


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
    assert _loaded("import perfd.app.cli\nperfd.app.cli.build_parser()") == []


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["agent", "nsys-exec", "ncu-exec", "launch", "shard"])
def test_the_per_node_and_per_rank_commands_start_light(command: str) -> None:
    """Each command's parse, then the modules its handler imports first (the agent's, the wrappers')."""
    handler = {"agent": "import perfd.agent.node_agent",
               "nsys-exec": "import perfd.capture.nsys_exec, perfd.capture.binaries",
               "ncu-exec": "import perfd.capture.ncu_exec, perfd.core.armed",
               "launch": "import perfd.app.launcher",
               "shard": "import perfd.engine.shard"}[command]
    argv = [command, "--job", "j", "--", "python", "train.py"] if command.endswith("-exec") else [command]
    code = (f"import perfd.app.cli\np = perfd.app.cli.build_parser()\n"
            f"assert p.parse_known_args({argv!r})[0].command == {command!r}\n{handler}")
    # a shard summarises each partition's ranks with the few pure analytics its step summaries reduce
    # with (tests/test_layering.py's ENGINE_ANALYTICS, and what they import): those and nothing more
    allowed = _loaded("import perfd.engine.stepsummary") if command == "shard" else []
    assert not any(m.startswith(("perfd.report", "rich", "torch")) for m in allowed)
    assert _loaded(code) == allowed


def test_perfd_help_still_lists_every_command(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen's split left `perfd top` in the list and its --help whole."""
    # argparse wraps --help to the terminal's width: a process whose output is captured has none and
    # takes 80 columns (or COLUMNS when set), as here where pytest's stdout may be a terminal.
    monkeypatch.setenv("COLUMNS", os.environ.get("COLUMNS", "80"))
    r = perfd(capsys, "--help")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for command in ("agent", "aggregator", "top", "launch", "nsys-exec", "ncu-exec", "shard", "analyze"):
        assert f"    {command}" in out, command
    top = perfd(capsys, "top", "--help")
    assert top.returncode == 0, top.stderr
    assert "--once" in top.stdout and "--auth-token-file" in top.stdout


# Moved here from tests/hook/test_hook_callbacks.py: a fresh interpreter's imports.
def test_importing_the_hook_imports_no_framework_and_no_torch() -> None:
    code = ("import sys, perfd.hook, perfd.hook.hf, perfd.hook.lightning, perfd.collectors.hook; "
            "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Moved here from tests/test_layering.py: a fresh interpreter's imports.
@pytest.mark.slow
def test_agent_and_aggregator_never_import_torch():
    """Run in a fresh interpreter: importing the agent, aggregator and collectors loads no torch."""
    code = (
        "import sys, importlib\n"
        "mods = ['perfd.app.cli', 'perfd.analytics.run.run_analysis', 'perfd.collectors.megatron']\n"
        "import pkgutil\n"
        "for m in ('perfd.agent.node_agent', 'perfd.aggregator.daemon', 'perfd.collectors.nvml',\n"
        "          'perfd.collectors.host'):\n"
        "    try:\n"
        "        importlib.util.find_spec(m) and mods.append(m)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "for m in mods: importlib.import_module(m)\n"
        "print(','.join(mods))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "perfd.collectors.megatron" in res.stdout
