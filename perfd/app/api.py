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
    """`perfd analyze megatron PATH --json` as a dict.

    Args:
        path: a Megatron-LM training log (plain, .gz or .xz).
        gpu: the GPU's name as nvidia-smi gives it ("NVIDIA H200"), for its peak; None: no MFU unless
            ``peak_tflops`` is given.
        dtype: the training dtype (bf16, fp16, fp8, fp32, or torch's names), which picks the peak;
            perfd never guesses one.
        peak_tflops: the GPU's peak in TFLOP/s, instead of the one perfd knows for ``gpu``.
        job: the job's name in the output; None: from the file's name.

    Returns:
        ``job``, ``iterations``, ``summary``, ``report`` (as the CLI's --json) and ``parse`` (the
        parser's line counts, and how many issues it met).

    Raises:
        PerfdInputError: the file is missing or unreadable, holds no iteration lines, or the GPU, the
            dtype or the peak cannot be used.
    """
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
    """The serving analysis of an SGLang server log (no /metrics, no model spec), as
    `perfd analyze sglang PATH --json` gives it without those options.

    Args:
        path: an SGLang server log (plain, .gz or .xz).
        gpu: the GPU's name as nvidia-smi gives it ("NVIDIA H200"); None: not named.
        job: the job's name in the output; None: the file's name without its suffix.

    Returns:
        ``records`` (one per prefill or decode batch line), ``summary`` and ``report``.

    Raises:
        PerfdInputError: the file is missing or unreadable, holds no batch lines, or ``gpu`` is unknown.
    """
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
    """Per-device breakdown of a Kineto/Chrome trace or an nsys capture.

    Args:
        path: a trace (.json, .json.gz, .json.xz) or an nsys capture (.nsys-rep, .qdrep, .sqlite).

    Returns:
        The capture's analysis; under ``devices``, per device: busy, idle, compute, NCCL and exposed
        communication time (ms) and the top kernels.

    Raises:
        PerfdInputError: the file is missing, a directory, or not a capture perfd can read.
    """
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
        """Nothing is asked of the aggregator until a method is called.

        Args:
            url: the aggregator's address; ``http://`` is assumed without a scheme.
            timeout: seconds each request may take.
            auth_token_file: the bearer token of an aggregator started with --auth-token-file
                (re-read when the file changes, as the daemons do); None: no token.

        Raises:
            PerfdInputError: the token file cannot be used.
        """
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
        """Every job the aggregator knows.

        Returns:
            One dict per job: its name (``job``), its agents, iterations seen and its last step's age.
        """
        return list(self._get("/api/jobs")["jobs"])

    def summary(self, job: str) -> dict[str, Any]:
        """One job's summary.

        Args:
            job: the job's name, as :meth:`jobs` gives it.

        Returns:
            Latest values, steady-state values, the report, rank placement, collectives, serving.
        """
        return dict(self._job(job, "summary"))

    def iterations(self, job: str, sources: bool = False) -> list[dict[str, Any]]:
        """Every retained iteration's analysis.

        Args:
            job: the job's name, as :meth:`jobs` gives it.
            sources: include each iteration's provenance (where each value came from); heavier.

        Returns:
            One dict per iteration, as `perfd analyze megatron --json` gives ``iterations``.
        """
        return list(self._job(job, "iterations" + ("" if sources else "?sources=0"))["iterations"])

    def gpus(self, job: str) -> list[dict[str, Any]]:
        """The latest GPU series of the job's agents.

        Args:
            job: the job's name, as :meth:`jobs` gives it.

        Returns:
            One row per GPU (catalog names as keys under ``values``) with its compute processes
            (pid, user, rank, GPU memory, command line).
        """
        return list(self._job(job, "gpus")["gpus"])

    def hosts(self, job: str) -> list[dict[str, Any]]:
        """The latest host series of the job's nodes.

        Args:
            job: the job's name, as :meth:`jobs` gives it.

        Returns:
            One row per node: CPU, load, memory, ...; empty where no agent sent host series.
        """
        return list(self._job(job, "gpus").get("hosts") or [])

    def rank_hosts(self, job: str) -> list[dict[str, Any]]:
        """Each rank process of the job as its node's agent last saw it (collectors/ranks).

        Args:
            job: the job's name, as :meth:`jobs` gives it.

        Returns:
            One row per rank: state, CPU used, run-queue wait, allowed CPUs and how busy, the
            processes that took them; empty where no agent watched the ranks.
        """
        return list(self._job(job, "gpus").get("rank_hosts") or [])

    def stats(self) -> dict[str, Any]:
        """The aggregator's own health.

        Returns:
            Its ``/api/stats`` document (perfd.aggregator.stats), with what the agents refused.
        """
        return dict(self._get("/api/stats"))

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The aggregator's Prometheus exposition, parsed.

        Returns:
            ``{sample name: [(labels, value), ...]}``, in the order /metrics lists them.
        """
        from prometheus_client.parser import text_string_to_metric_families

        text = self._read("/metrics").decode("utf-8")
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return out
