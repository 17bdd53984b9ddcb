"""`perfd report --job J --html OUT`: the job report as one self-contained HTML file with charts.

Data either live from an aggregator's JSON API (``--aggregator URL``: ``/api/jobs/<job>/summary``
and ``/api/jobs/<job>/iterations``) or offline from a Megatron-LM log (``--log FILE``, the same
analysis as ``perfd analyze megatron``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from perfd.report.html import Page


class ReportError(Exception):
    pass


def _get_json(url: str, timeout: float, headers: dict[str, str] | None = None) -> Mapping[str, object]:
    """The aggregator's JSON object at ``url``."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            got = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:500]
        raise ReportError(f"{url}: HTTP {exc.code}: {body}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ReportError(f"{url}: {exc}") from None
    if not isinstance(got, Mapping):
        raise ReportError(f"{url}: a JSON {type(got).__name__}, not an object")
    return got


def _base_url(aggregator: str) -> str:
    url = aggregator if "://" in aggregator else f"http://{aggregator}"
    return url.rstrip("/")


def from_aggregator(aggregator: str, job: str, timeout: float = 10.0,
                    headers: dict[str, str] | None = None) -> Page:
    """The page of a job from a running aggregator, its JSON read back here (``headers``: the
    Authorization header where the aggregator needs a token)."""
    from perfd.report.html import page_from_json

    base = _base_url(aggregator)
    summary = _get_json(f"{base}/api/jobs/{quote(job, safe='')}/summary", timeout, headers)
    if summary.get("report") is None:
        raise ReportError(f"the aggregator has no analysed iterations for job {job!r} yet")
    try:
        its = _get_json(f"{base}/api/jobs/{quote(job, safe='')}/iterations?sources=0", timeout,
                        headers)["iterations"]
    except ReportError:  # an aggregator without the endpoint: the latest iteration only
        its = [summary["latest"]] if summary.get("latest") else []
    return page_from_json({"job": summary.get("job") or {}, "iterations": its,
                           "summary": summary.get("summary") or {}, "report": summary["report"],
                           "ranks": summary.get("ranks") or [], "incidents": summary.get("incidents") or [],
                           "goodput": summary.get("goodput")}, aggregator=base)


def from_log(log: str, job: str | None, gpu: str | None, peak_tflops: float | None,
             dtype: str | None, capture: str | None = None,
             capture_steps: int | None = None, capture_force: bool = False) -> Page:
    """The offline analysis of a log, with a capture of the job when given (its step budget and
    remedies in the report: the same as ``perfd analyze megatron LOG --capture TRACE``)."""
    from perfd.app.commands import megatron_offline
    from perfd.app.commands.analyze import _read_lines
    from perfd.app.commands.peak_args import check_mfu_possible, check_peak_args

    if not Path(log).is_file():
        raise ReportError(f"no such log file: {log}")
    why = check_peak_args(dtype, peak_tflops)
    if why:
        raise ReportError(why)
    timeline = None
    if capture:
        from perfd.app.commands.analyze_capture import timeline_class

        if capture_steps is not None and capture_steps < 1:
            raise ReportError(f"--capture-steps must be >= 1 (got {capture_steps})")
        if not Path(capture).is_file():
            raise ReportError(f"no such capture file: {capture}")
        try:
            timeline = timeline_class(capture, capture_steps, capture_force)
        except Exception as exc:  # unreadable capture: say what and where, no traceback
            raise ReportError(f"cannot analyse the capture {capture}: {exc}") from None
    name = job or Path(log).stem
    try:
        parsed, analysis = megatron_offline.analyze_stream(log, lambda p: _read_lines(p, False), name,
                                                           Path(log).name, gpu, peak_tflops, dtype, timeline)
    except OSError as exc:
        raise ReportError(f"cannot read {log}: {exc}") from None
    if analysis is None or not parsed.n_records:
        raise ReportError(f"no Megatron iteration lines found in {log}")
    match = analysis.capture_match
    if match is not None and match.refused and not capture_force:
        from perfd.report.capture_text import refusal

        raise ReportError(refusal(match))
    why = check_mfu_possible(analysis, parsed.job_info, dtype, peak_tflops)
    if why:
        raise ReportError(why)
    from perfd.report import build_report
    from perfd.report.html import Page

    return Page.of(analysis, build_report(analysis))


def run_report(args: argparse.Namespace) -> int:
    from perfd import __version__
    from perfd.report.html import render_html

    try:
        if args.aggregator:
            if not args.job:
                raise ReportError("--job is required with --aggregator")
            headers = None
            if getattr(args, "auth_token_file", None):  # a Namespace made by hand may lack it
                from perfd.transport.security import SecurityConfigError, TokenFile

                try:
                    headers = {"Authorization": TokenFile(args.auth_token_file).header()}
                except SecurityConfigError as exc:
                    raise ReportError(str(exc)) from None
            data = from_aggregator(args.aggregator, args.job, args.timeout, headers)
            source = f"live, the aggregator at {_base_url(args.aggregator)}, job {args.job}"
        elif args.log:
            data = from_log(args.log, args.job, args.gpu, args.peak_tflops, args.dtype, args.capture,
                            args.capture_steps, args.capture_force)
            source = (f"offline, log {args.log}" + (f" (GPU given: {args.gpu})" if args.gpu else "")
                      + (f", capture {args.capture}" if args.capture else ""))
        else:
            raise ReportError("give --aggregator URL or --log FILE")
    except ReportError as exc:
        print(f"perfd report: {exc}", file=sys.stderr)
        return 2
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    page = render_html(data, source=source, generated=generated, version=__version__)
    if args.html == "-":
        sys.stdout.write(page)
    else:
        Path(args.html).write_text(page, encoding="utf-8")
        print(f"perfd report: wrote {args.html} ({len(page) // 1024} KiB, "
              f"{len(data.iterations)} iterations)", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("report", help="write the job report as one self-contained HTML file with charts")
    p.add_argument("--job", help="job name (required with --aggregator; default with --log: the file name)")
    p.add_argument("--html", required=True, metavar="OUT", help="output file ('-' for stdout)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--aggregator", metavar="URL", help="aggregator HTTP address, e.g. http://host:9401")
    src.add_argument("--log", metavar="FILE", help="analyse this Megatron-LM log offline instead")
    p.add_argument("--gpu", help="with --log: GPU name for the peak (e.g. 'NVIDIA H200')")
    p.add_argument("--peak-tflops", type=float, help="with --log: peak dense TFLOP/s per GPU")
    p.add_argument("--dtype", help="with --log: training dtype for the peak (default: from the log)")
    p.add_argument("--capture", metavar="TRACE", help="with --log: a Kineto trace (.json[.gz]) or nsys "
                   "capture (.nsys-rep, .sqlite) of the job: its step budget and remedies go into the report")
    p.add_argument("--capture-steps", type=int, metavar="N", help="with --capture: the steps the capture "
                   "holds, when the trace marks none")
    p.add_argument("--capture-force", action="store_true", help="with --capture: read the capture even "
                   "where it does not match the job (its tokens, pipeline, collectives or FLOPs are another "
                   "job's: refused without this, exit 2); the report states the mismatch")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds (--aggregator)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help="with --aggregator: the bearer token it requires")
    p.set_defaults(handler=run_report)
