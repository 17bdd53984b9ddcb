"""`perfd capture`: ask the aggregator for a capture by hand (same path as a rule firing)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("capture", help="request a Kineto or nsys capture of a job's ranks")
    p.add_argument("--aggregator", default="http://127.0.0.1:9401", help="aggregator HTTP base URL")
    p.add_argument("--job", required=True)
    p.add_argument("--ranks", help="comma-separated ranks (default: every rank of the job)")
    p.add_argument("--steps", type=int, default=3, help="iterations to capture")
    p.add_argument("--tool", choices=["kineto", "nsys", "auto"], default="auto")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for the capture to finish, printing its status")
    p.set_defaults(handler=run_capture)


def _call(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def run_capture(args: argparse.Namespace) -> int:
    try:
        ranks = [int(x) for x in args.ranks.split(",")] if args.ranks else None
    except ValueError:
        print(f"perfd capture: --ranks must be integers, got {args.ranks!r}", file=sys.stderr)
        return 2
    base = args.aggregator.rstrip("/")
    try:
        code, rec = _call(f"{base}/api/captures", {"job": args.job, "ranks": ranks, "steps": args.steps,
                                                   "tool": args.tool})
    except OSError as exc:
        print(f"perfd capture: aggregator at {base} not reachable: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(rec, indent=2))
    if code >= 300 or rec.get("status") in ("refused", "undeliverable"):
        return 1
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        time.sleep(1.0)
        _c, listing = _call(f"{base}/api/captures")
        cur = next((c for c in listing.get("captures", []) if c.get("id") == rec.get("id")), None)
        if cur and cur.get("status") in ("finished", "failed"):
            print(json.dumps(cur, indent=2))
            return 0 if cur["status"] == "finished" else 1
    return 0
