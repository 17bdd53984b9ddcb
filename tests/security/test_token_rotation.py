"""A rotated bearer token closes the streams that authenticated with the old one:
the real aggregator and a real agent sharing the token file (in the test's process: tests/inproc.py),
and a client that kept a copy of the old token. The aggregator re-reads the file when it changes;
before, it let every open stream run on with the old token for as long as it lasted. The figures printed
are recorded in docs/reliability.md."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfd.transport.client import AgentClient
from perfd.transport.security import TokenFile
from tests.inproc import pipeline
from tests.procs import NOT_YET, wait_for

pytestmark = pytest.mark.slow

OLD, NEW = "old-token-0123456789abcdef", "new-token-fedcba9876543210"


def _write_token(path: Path, token: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(token + "\n")
    tmp.chmod(0o600)  # a token others may read is refused
    os.replace(tmp, path)  # as a secret manager does: a new file in its place


def _stats(base: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(base + "/api/stats", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        got: dict[str, Any] = json.loads(r.read())["transport"]
    return got


def test_a_rotated_token_closes_the_streams_that_used_the_old_one(tmp_path: Path) -> None:
    token = tmp_path / "token"
    _write_token(token, OLD)
    stale = tmp_path / "stale-token"
    stale.write_text(OLD + "\n")  # a client that kept the old token
    stale.chmod(0o600)
    with pipeline(tmp_path, "--auth-token-file", token, "--no-rules") as p:
        base = p.base
        p.agent("--job", "j", "--agent-id", "node-a", "--nvml", "off", "--host", "off", "--metrics-port", "0",
                "--auth-token-file", token)

        async def scenario() -> dict[str, Any]:
            c = AgentClient(p.target, "stale", jobs=["k"], token=TokenFile(str(stale)),
                            backoff_initial_s=0.1, backoff_max_s=0.5)
            task = asyncio.create_task(c.run())
            try:
                assert await c.flush(30)
                before = await asyncio.to_thread(
                    wait_for, lambda: (s := _stats(base, OLD))["agents_connected"] == 2 and s, 30,
                    "both agents connected", ignore=NOT_YET)
                _write_token(token, NEW)
                after = await asyncio.to_thread(
                    wait_for, lambda: (s := _stats(base, NEW))["streams_closed_token_rotated"] >= 2
                    and s["agents_connected"] == 1 and s["streams_opened"] > before["streams_opened"]
                    and s.get("refused_unauthenticated", 0) >= 1 and s, 30,
                    "the old-token streams closed, the agent back with the new token", ignore=NOT_YET)
                assert not c.connected
                return {"before": before, "after": after}
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        got = p.call(scenario(), "the stale client's stream and the rotation", 120)
        a = got["after"]
        print(f"FIGURES token rotation: {a['streams_closed_token_rotated']} streams on the old token closed "
              f"within a liveness tick; the agent reading the token file reconnected "
              f"({a['agents_connected']} connected), the client holding the old copy refused "
              f"({a['refused_unauthenticated']} refusals)")
        assert a["streams_closed_token_rotated"] == 2
