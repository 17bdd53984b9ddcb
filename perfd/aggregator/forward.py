"""A standby root's API, answered by the leader: with the engine (perfd.engine.root) two aggregators
stand behind one Service, and only the one leading holds the jobs; the other forwards every request
but its own health, metrics and stats to the leader's advertised HTTP (``--engine-advertise-http``)
and relays the answer as it came. Written by hand: a reverse proxy of a few paths, one request at a
time, with the standard library's urllib (no library adds anything here but a dependency).

What a person or a dashboard asks of a standby is then the jobs' answer, not an empty list, marked
with the ``X-Perfd-Served-By`` header; when no leader advertises one (none leads, or it was started
without the flag) the standby answers for itself, as before, without that header.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 30.0  # an analysis can take seconds on a large job: well past that is a dead leader
LOCAL_PATHS = ("/metrics", "/healthz", "/api/stats")  # about this process itself: never forwarded
SERVED_BY = "X-Perfd-Served-By"  # "leader <url>" when forwarded
PASSED_HEADERS = ("Authorization", "Content-Type")


def forwarded(path: str) -> bool:
    return path not in LOCAL_PATHS


def forward(leader: str, method: str, target: str, headers: Mapping[str, str],
            body: bytes | None) -> tuple[int, bytes, str]:
    """The request (its method, target, body, Authorization and Content-Type) sent to ``leader``:
    the leader's answer (status, body, content type) as it came, or a 502 that says why."""
    url = leader.rstrip("/") + target
    given = {k.lower(): v for k, v in headers.items()}  # header names are case-insensitive
    sent = {k: v for k in PASSED_HEADERS if (v := given.get(k.lower()))}
    req = urllib.request.Request(url, data=body, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=FORWARD_TIMEOUT_S) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "application/json")
    except urllib.error.HTTPError as exc:  # the leader's own answer (404, 400, 401): relayed as it is
        return exc.code, exc.read(), exc.headers.get("Content-Type", "application/json")
    except (OSError, ValueError) as exc:  # unreachable, refused, timed out: say so
        log.warning("standby root: %s %s not forwarded to %s: %s", method, target[:80], leader, exc)
        why = (f"this aggregator stands by; the leading root at {leader} did not answer "
               f"({type(exc).__name__}: {exc})")
        return 502, json.dumps({"error": why[:500]}).encode(), "application/json"
