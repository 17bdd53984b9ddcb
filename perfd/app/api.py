"""perfd from Python (a notebook, a script): analyse a log, read a capture, query an aggregator.

The same functions the CLI runs, returning the same JSON-shaped dicts that ``--json`` prints, so a
notebook and ``perfd analyze ... --json`` cannot disagree. Input that cannot be used raises
``PerfdInputError`` with the one line the CLI prints (never a page of absent values)::

    import perfd.app.api as pa
    run = pa.analyze_megatron_log("train.log.gz", gpu="NVIDIA H200")
    run["summary"]["medians"]["mfu"]
    pa.read_capture("trace_1234.json.gz")["devices"][0]["comm_exposed_ms"]
    agg = pa.Aggregator("http://127.0.0.1:9401")
    agg.summary(agg.jobs()[0]["job"])["latest"]["step_time_ms"]

See docs/api.md. Nothing here imports torch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfd.transport.security import TokenFile

__all__ = ["Aggregator", "AggregatorUnavailable", "PerfdInputError", "analyze_megatron_log",
           "analyze_sglang_log", "read_capture"]


class PerfdInputError(ValueError):
    """Input perfd cannot use; the message is the one line `perfd analyze` prints."""


class AggregatorUnavailable(ConnectionError):
    """The aggregator did not answer (down, wrong address, timed out, TLS refused); the message says
    which address and why, in one line. A ConnectionError, so ``except OSError`` catches it too."""


def analyze_megatron_log(path: str | Path, gpu: str | None = None, dtype: str | None = None,
                         peak_tflops: float | None = None, job: str | None = None) -> dict[str, Any]:
    """`perfd analyze megatron PATH --json` as a dict: job, iterations, summary, report, parse."""
    from perfd.app.commands.analyze import analyze_megatron_file
    from perfd.app.commands.input_checks import check_gpu, check_log
    from perfd.app.commands.peak_args import check_mfu_possible, check_peak_args
    from perfd.core.logfiles import LogFileError

    why = check_log(str(path)) or check_peak_args(dtype, peak_tflops) or check_gpu(gpu, peak_tflops)
    if why:
        raise PerfdInputError(why)
    try:
        parsed, analysis = analyze_megatron_file(str(path), job, gpu, peak_tflops, dtype)
    except (OSError, EOFError, LogFileError) as exc:
        raise PerfdInputError(f"cannot read {path}: {exc}") from exc
    if not parsed.records:
        raise PerfdInputError(f"no Megatron-LM iteration lines in {path}")
    why = check_mfu_possible(analysis, parsed.job_info, dtype, peak_tflops)
    if why:
        raise PerfdInputError(why)
    from perfd.report import analysis_json

    # The same keys as the CLI's --json (job, iterations, summary, report), so code written against
    # one runs against the other.
    out = analysis_json(analysis)
    out["parse"] = {"counts": dict(parsed.counts), "issues_total": len(parsed.issues)}
    return out


def analyze_sglang_log(path: str | Path, gpu: str | None = None, job: str | None = None) -> dict[str, Any]:
    """The serving analysis of an SGLang server log (no /metrics, no model spec): records, summary,
    report, as `perfd analyze sglang PATH --json` gives them without those options."""
    from perfd.analytics.serving.serving_analysis import analyze_serving
    from perfd.app.commands.input_checks import check_gpu, check_log
    from perfd.collectors.sglang.parser import parse_file
    from perfd.core.logfiles import LogFileError
    from perfd.core.serving_model import ServingModelSpec
    from perfd.report.serving_report import build_serving_report, serving_json

    why = check_log(str(path)) or check_gpu(gpu, None)
    if why:
        raise PerfdInputError(why)
    try:
        parsed = parse_file(path)
    except (OSError, EOFError, LogFileError) as exc:
        raise PerfdInputError(f"cannot read {path}: {exc}") from exc
    if not parsed.records:
        raise PerfdInputError(f"no SGLang 'Prefill batch' / 'Decode batch' lines in {path}")
    analysis = analyze_serving(job or Path(path).stem, parsed.records, parsed.server, None, None,
                               ServingModelSpec(), gpu, None, None, lifetime_percentiles=True)
    return {"records": [r.to_json() for r in parsed.records], "summary": serving_json(analysis),
            "report": build_serving_report(analysis).to_json()}


def read_capture(path: str | Path) -> dict[str, Any]:
    """Per-device breakdown (busy, idle, compute, NCCL, exposed communication, top kernels) of a
    Kineto/Chrome trace (.json, .json.gz, .json.xz) or an nsys capture (.nsys-rep, .sqlite)."""
    p = Path(path)
    if not p.is_file():
        raise PerfdInputError(f"{path} is a directory" if p.is_dir() else f"no such capture file: {path}")
    try:
        if p.suffix in (".nsys-rep", ".sqlite", ".qdrep"):
            from perfd.capture.nsys_sqlite import analyze_nsys

            out = analyze_nsys(p).to_json()
        else:
            from perfd.capture.chrome_trace import analyze_chrome_trace

            out = analyze_chrome_trace(p).to_json()
    except Exception as exc:  # not a trace: one line, as the CLI says it
        raise PerfdInputError(f"cannot analyse {path}: {exc}") from exc
    return out


class Aggregator:
    """A running `perfd aggregator`, through its HTTP API (read-only). Every method raises
    ``AggregatorUnavailable`` when it does not answer and ``PerfdInputError`` for an HTTP error
    (an unknown job: 404)."""

    def __init__(self, url: str = "http://127.0.0.1:9401", timeout: float = 10.0,
                 auth_token_file: str | Path | None = None) -> None:
        """``auth_token_file``: the bearer token of an aggregator started with --auth-token-file
        (re-read when the file changes, as the daemons do)."""
        self.url = (url if "://" in url else f"http://{url}").rstrip("/")
        self.timeout = timeout
        self._token: TokenFile | None = None
        if auth_token_file is not None:
            from perfd.transport.security import SecurityConfigError, TokenFile

            try:
                self._token = TokenFile(str(auth_token_file))
            except SecurityConfigError as exc:
                raise PerfdInputError(str(exc)) from exc

    def _read(self, path: str) -> bytes:
        headers = {"Authorization": self._token.header()} if self._token is not None else {}
        try:
            req = urllib.request.Request(self.url + path, headers=headers)
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body: bytes = r.read()
                return body
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise PerfdInputError(f"{self.url}{path}: HTTP {exc.code} {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out, TLS
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise AggregatorUnavailable(f"cannot reach the aggregator at {self.url}: {why}") from exc

    def _get(self, path: str) -> Any:
        return json.loads(self._read(path).decode("utf-8"))

    def _job(self, job: str, what: str) -> Any:
        return self._get(f"/api/jobs/{urllib.parse.quote(job, safe='')}/{what}")

    def jobs(self) -> list[dict[str, Any]]:
        """Every job the aggregator knows, with its agents, iterations seen and last step's age."""
        return list(self._get("/api/jobs")["jobs"])

    def summary(self, job: str) -> dict[str, Any]:
        """Latest values, steady-state values, the report, rank placement, collectives, serving."""
        return dict(self._job(job, "summary"))

    def iterations(self, job: str, sources: bool = False) -> list[dict[str, Any]]:
        """Every retained iteration's analysis (as `perfd analyze megatron --json` 'iterations')."""
        return list(self._job(job, "iterations" + ("" if sources else "?sources=0"))["iterations"])

    def gpus(self, job: str) -> list[dict[str, Any]]:
        """The latest GPU series of the job's agents, one row per GPU (catalog names as keys under
        ``values``) with its compute processes (pid, user, rank, GPU memory, command line)."""
        return list(self._job(job, "gpus")["gpus"])

    def hosts(self, job: str) -> list[dict[str, Any]]:
        """The latest host series (CPU, load, memory, ...) of the job's nodes, one row per node."""
        return list(self._job(job, "gpus").get("hosts") or [])

    def rank_hosts(self, job: str) -> list[dict[str, Any]]:
        """Each rank process of the job as its node's agent last saw it (collectors/ranks): state,
        CPU used, run-queue wait, allowed CPUs and how busy, the processes that took them."""
        return list(self._job(job, "gpus").get("rank_hosts") or [])

    def stats(self) -> dict[str, Any]:
        return dict(self._get("/api/stats"))

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """/metrics parsed: {sample name: [(labels, value), ...]}."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self._read("/metrics").decode("utf-8")
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return out
