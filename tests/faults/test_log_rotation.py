"""logrotate's copytruncate against a real agent and aggregator: nothing written is lost.

The Megatron-LM log is written iteration by iteration (each write opens the file with O_APPEND, as a
job's `>> train.log` does) while the agent tails it. A rotation copies the log to ``train.log.1`` and
truncates it, the way logrotate's ``copytruncate`` does, with iterations the agent has not read yet
in the copy only; the job then writes more than the agent had read before its next poll (the
truncated file grows past the agent's offset, so its size never looks smaller). At the end
`/api/jobs/<job>/iterations` must hold every iteration once. The figures printed here are recorded
in docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.faults import checkpoint_file
from tests.faults.test_network_faults import _megatron_lines
from tests.faults.test_restarts import N, Rig, _all_iterations_once, rig  # noqa: F401  (a fixture)
from tests.procs import wait_for

pytestmark = pytest.mark.slow


def _append(log: Path, lines: list[str]) -> None:
    with log.open("a") as f:
        f.write("".join(lines))


def _copytruncate(log: Path) -> None:
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    os.truncate(log, 0)


def _written_to_the_agent(r: Rig, n: int) -> None:
    """Wait until the aggregator holds ``n`` iterations (the agent has read up to there)."""
    from tests.procs import http_get

    def there() -> bool:
        import json

        its = json.loads(http_get(f"{r.base}/api/jobs/faults/iterations?sources=0"))["iterations"]
        return len(its) >= n - 1  # the last one is held until the next line closes it

    wait_for(there, 60, f"{n} iterations read by the agent", interval=0.2)


def test_copytruncate_while_running_loses_nothing(rig: Rig) -> None:  # noqa: F811
    _, lines = _megatron_lines(N)
    done = 0
    for upto in (30, 70):
        _append(rig.log, lines[done:upto])
        _written_to_the_agent(rig, upto)
        # Between two polls: 10 iterations the agent has not read, the rotation, then more than the
        # agent had read (the truncated file outgrows its offset).
        _append(rig.log, lines[upto:upto + 10])
        _copytruncate(rig.log)
        _append(rig.log, lines[upto + 10:upto + 40])
        done = upto + 40
        assert os.path.getsize(rig.log) > 0
    for ln in lines[done:]:
        _append(rig.log, [ln])
        time.sleep(0.01)
    _all_iterations_once(rig)
    print(f"copytruncate twice while the agent ran: {N} of {N} iterations once")


def test_copytruncate_while_the_agent_is_down_loses_nothing(rig: Rig) -> None:  # noqa: F811
    _, lines = _megatron_lines(N)
    _append(rig.log, lines[:40])
    _written_to_the_agent(rig, 40)
    head, _ = _megatron_lines(1)
    ck = rig.tmp / "agent-state" / "megatron.checkpoint.json"
    min_offset = len(head.encode()) + sum(len(x.encode()) for x in lines[:39])
    wait_for(lambda: ck.exists() and checkpoint_file.offsets(ck)[0] >= min_offset, 60,
             "the agent's checkpoint past iteration 39", ignore=(OSError, ValueError, KeyError, IndexError))
    rig.kill9("agent")
    _append(rig.log, lines[40:65])  # 25 iterations written while the agent is down, then rotated
    _copytruncate(rig.log)
    _append(rig.log, lines[65:110])  # and the truncated log outgrows the checkpoint's offset
    rig.start_agent()
    _append(rig.log, lines[110:])
    _all_iterations_once(rig)
    out = (rig.tmp / "agent.2.out").read_text()
    assert re.search(r"megatron: resumed \S+ at byte \d+ of its rotated copy", out), out[-3000:]
    print(f"copytruncate while the agent was down: {N} of {N} iterations once (resumed in train.log.1)")
