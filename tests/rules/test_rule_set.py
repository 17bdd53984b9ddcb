"""``perfd rules check`` checks the set the aggregator will load, and a rule named like a shipped one
is handled the same way by both (issue 36 item 7): real ``perfd rules check`` and ``perfd
aggregator`` processes on the same files.

The issue's probe: ``perfd rules check user.yaml`` passed a user rule named like a shipped one, and
the aggregator given the shipped pack and the user's refused to start ("duplicate rule names"), with
nothing to say how to override the shipped rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.procs import ROOT, Procs, run_env, start_aggregator

pytestmark = pytest.mark.slow

SHIPPED = ROOT / "rules" / "default.yaml"
USER = """
rules:
  - name: mfu_severe          # a shipped rule's name
    expr: mfu < 0.2
    for: 10m
{extra}
"""


def perfd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfd.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=run_env())


@pytest.mark.e2e
def test_a_user_rule_named_like_a_shipped_one_fails_the_check_as_it_fails_the_aggregator(
        tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text(textwrap.dedent(USER.format(extra="")).lstrip("\n"))
    check = perfd("rules", "check", str(SHIPPED), str(user))
    agg = perfd("aggregator", "--grpc-port", "0", "--http-port", "0", "--rules", str(SHIPPED),
                "--rules", str(user))
    print(f"FIGURES rules set: check exit {check.returncode}: {check.stdout.splitlines()[0]!r}; "
          f"aggregator exit {agg.returncode}: {agg.stderr.strip().splitlines()[-1]!r}")
    assert check.returncode == 1 and agg.returncode == 2
    line = f"{user}:2: rule mfu_severe: a rule of this name is already defined at {SHIPPED}:"
    assert line in check.stdout and line in agg.stderr  # the same refusal, word for word
    assert "give this one 'override: true'" in check.stdout
    # Alone, the user's pack loads (what `--rules user.yaml` gives): the check says so, and notes
    # the shipped rule of that name and how to override it should the shipped pack be added.
    alone = perfd("rules", "check", str(user))
    assert alone.returncode == 0 and "a shipped rule has this name" in alone.stdout
    assert f"perfd aggregator --rules {user} loads 1 rule(s)" in alone.stdout
    shipped = perfd("rules", "check")  # no file: the set the aggregator loads without --rules
    assert shipped.returncode == 0 and "perfd aggregator (no --rules) loads" in shipped.stdout


@pytest.mark.e2e
def test_override_true_replaces_the_shipped_rule_in_both(tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text(textwrap.dedent(USER.format(extra="    override: true")).lstrip("\n"))
    check = perfd("rules", "check", str(SHIPPED), str(user))
    assert check.returncode == 0, check.stdout
    assert f"{user}:2: rule mfu_severe: overrides the rule of {SHIPPED}:" in check.stdout
    n = int(check.stdout.split(" loads ")[1].split()[0])
    assert ", 1 replaced by override" in check.stdout
    with Procs(tmp_path, run_env()) as procs:
        start_aggregator(procs, "--rules", str(SHIPPED), "--rules", str(user), verbose=True)
        log = (tmp_path / "aggregator.out").read_text()
    assert f"rule mfu_severe of {user}:2 overrides the one of {SHIPPED}:" in log
    nothing = tmp_path / "nothing.yaml"
    text = textwrap.dedent(USER.format(extra="    override: true")).lstrip("\n")
    nothing.write_text(text.replace("mfu_severe", "mine"))
    warned = perfd("rules", "check", str(nothing))
    assert warned.returncode == 0 and "it overrides nothing" in warned.stdout
    assert n == sum(1 for ln in SHIPPED.read_text().splitlines() if ln.startswith("  - name:"))
