"""perfd.app.api as a notebook uses it: the same numbers as the CLI's --json, the same one-line
refusals, and a real aggregator queried through its HTTP API."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import perfd.app.api as pa
from perfd.app.cli import main
from tests.e2e.conftest import JOB, LOG, Live

ROOT = Path(__file__).resolve().parents[2]
SGLANG = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"


@pytest.mark.slow
def test_analyze_megatron_log_equals_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The CLI's own entry point, in this process: what it prints is what the command prints.
    rc = main(["analyze", "megatron", str(LOG), "--gpu", "NVIDIA H200", "--json", "--iterations", "all"])
    cli = capsys.readouterr()
    assert rc == 0, cli.err
    want = json.loads(cli.out)
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(LOG.read_bytes()))
    got = pa.analyze_megatron_log(gz, gpu="NVIDIA H200", job=LOG.stem)
    assert got["summary"] == want["summary"]
    # A row's source names the file (train.log.gz here): everything else is equal.
    def strip(its: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in it.items() if k != "source"} for it in its]
    assert strip(got["iterations"]) == strip(want["iterations"])
    assert set(got) == set(want) - {"iterations_shown"}
    assert got["report"]["summary"] == want["report"]["summary"]
    assert got["parse"]["counts"] == want["parse"]["counts"]


def _python_blocks(md: Path) -> list[str]:
    text = md.read_text()
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


def test_docs_first_example_runs_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/api.md's first example, run on the repository's log (the only change: the file name):
    it reads run["report"]["findings"], which the API must give as the CLI's --json does."""
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(LOG.read_bytes()))
    first = _python_blocks(ROOT / "docs" / "api.md")[0]
    assert '"train.log.gz"' in first
    exec(compile(first.replace('"train.log.gz"', repr(str(gz))), "docs/api.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("MFU ") and "bottleneck" in out and "\n- " in out


def test_aggregator_down_raises_one_clear_error() -> None:
    from tests.procs import free_port

    agg = pa.Aggregator(f"127.0.0.1:{free_port()}", timeout=5)
    for call in (agg.jobs, agg.stats, agg.metrics):
        with pytest.raises(pa.AggregatorUnavailable, match=r"cannot reach the aggregator at http://127\.0\.0\.1:"):
            call()
    with pytest.raises(OSError):  # a ConnectionError: code catching OSError keeps working
        agg.jobs()


def test_refusals_are_the_cli_lines(tmp_path: Path) -> None:
    with pytest.raises(pa.PerfdInputError, match="is a directory"):
        pa.analyze_megatron_log(tmp_path)
    with pytest.raises(pa.PerfdInputError, match="it could mean: 'NVIDIA H100 PCIe'"):
        pa.analyze_megatron_log(LOG, gpu="H100")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(pa.PerfdInputError, match="no Megatron-LM iteration lines"):
        pa.analyze_megatron_log(empty)
    with pytest.raises(pa.PerfdInputError, match="no such capture file"):
        pa.read_capture(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(pa.PerfdInputError, match="cannot analyse"):
        pa.read_capture(bad)


def test_sglang_and_capture(tmp_path: Path) -> None:
    s = pa.analyze_sglang_log(SGLANG, gpu="NVIDIA H200")
    assert s["records"]
    assert s["report"]["summary"]
    # A Kineto trace shape: one NCCL kernel overlapping one compute kernel on device 0.
    ev = [{"ph": "X", "cat": "kernel", "name": "ampere_gemm", "ts": 0, "dur": 100, "pid": 0, "tid": 7,
           "args": {"device": 0, "stream": 7}},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 50, "dur": 100, "pid": 0,
           "tid": 8, "args": {"device": 0, "stream": 8}}]
    trace = tmp_path / "trace.json.gz"
    trace.write_bytes(gzip.compress(json.dumps({"traceEvents": ev}).encode()))
    cap = pa.read_capture(trace)
    (dev,) = cap["devices"]
    assert dev["span_ms"] == pytest.approx(0.150)
    assert dev["comm_exposed_ms"] == pytest.approx(0.050)


@pytest.mark.slow
def test_aggregator_client_against_a_real_aggregator(live: Live) -> None:
    agg = pa.Aggregator(live.base)
    (job,) = agg.jobs()
    assert job["job"] == JOB
    summary = agg.summary(JOB)
    its = agg.iterations(JOB)
    assert its and its[-1]["iteration"] == summary["latest"]["iteration"]
    (gpu,) = agg.gpus(JOB)
    assert gpu["replay"] is True and gpu["values"]["perfd_gpu_power_watts"] > 0
    metrics = agg.metrics()
    (labels, value), = metrics["perfd_job_iteration"]
    assert labels == {"job_name": JOB} and value >= its[-1]["iteration"] - 1
    with pytest.raises(pa.PerfdInputError, match="HTTP 404"):
        agg.summary("no-such-job")


def test_aggregator_client_with_a_token(tmp_path: Path) -> None:
    import asyncio

    from perfd.aggregator.daemon import Aggregator, AggregatorConfig

    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    token.chmod(0o600)  # a token others may read is refused

    async def body() -> tuple[list[dict[str, object]], str]:
        agg = Aggregator(AggregatorConfig(grpc_host="127.0.0.1", grpc_port=0, http_host="127.0.0.1",
                                          http_port=0, rules_files=[], auth_token_file=str(token)))
        await agg.start()
        try:
            assert agg.http is not None
            url = f"http://127.0.0.1:{agg.http.port}"
            jobs = await asyncio.to_thread(pa.Aggregator(url, auth_token_file=token).jobs)
            try:
                await asyncio.to_thread(pa.Aggregator(url).jobs)
            except pa.PerfdInputError as exc:
                return jobs, str(exc)
            return jobs, ""
        finally:
            await agg.stop()

    jobs, refused = asyncio.run(body())
    assert jobs == [] and "HTTP 401" in refused
