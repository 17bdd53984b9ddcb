"""A real Prometheus joins perfd's GPU series with DCGM-exporter's: it scrapes a real node agent
(an NVML recording of an H100 whose process declares its job), the aggregator it streams to with
--export-node-series (the same GPU series a second time), and a DCGM-exporter-shaped
exposition of the same GPU (served by a small local HTTP server), and evaluates deploy/prometheus/
perfd-dcgm.rules.yml. The joins documented in docs/prometheus.md, read from it, return the GPU once;
the unit rules turn DCGM-exporter's MiB, MHz, mJ and percent into perfd's bytes, hertz, joules and
ratios."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.integrations_helpers import (
    NVML_REPLAY,
    PROM_DIR,
    free_port,
    get,
    need,
    perfd,
    stop,
    wait_for,
)
from tests.procs import placed_recording

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DCGM_RULES = PROM_DIR / "perfd-dcgm.rules.yml"
JOB, NODE, BUS = "llm-pretrain", "gpu-node-3", "00000000:18:00.0"
UUID = "GPU-bb1b6096-0d43-4ba6-647a-b35d2c368947"  # the recording's GPU
MODEL = "NVIDIA H100 80GB HBM3"
# DCGM-exporter's labels in Kubernetes mode (Hostname from NODE_NAME), and its units.
_DCGM_LABELS = (f'gpu="0",UUID="{UUID}",pci_bus_id="{BUS}",device="nvidia0",modelName="{MODEL}",'
                f'Hostname="{NODE}",DCGM_FI_DRIVER_VERSION="580.159.04",container="trainer",'
                f'namespace="ml",pod="llm-pretrain-0"')
DCGM_FIELDS = {  # name: (value in DCGM-exporter's unit, HELP)
    "DCGM_FI_DEV_GPU_UTIL": (87, "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (25, "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": (3406, "Framebuffer memory used (in MiB)."),
    # dcgm-exporter's default counters: used and free, no total (81,559 MiB = 85,520,809,984 bytes)
    "DCGM_FI_DEV_FB_FREE": (81559 - 3406, "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_SM_CLOCK": (1980, "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": (2619, "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (123456789, "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_POWER_USAGE": (412.5, "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_TEMP": (55, "GPU temperature (in C)."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0.93, "Ratio of cycles the tensor (HMMA) pipe is active."),
}
EXPOSITION = "".join(f"# HELP {n} {h}\n# TYPE {n} gauge\n{n}{{{_DCGM_LABELS}}} {v}\n"
                     for n, (v, h) in DCGM_FIELDS.items()).encode()


class _Dcgm(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(EXPOSITION)))
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dcgm_exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get_error(url: str) -> bytes:
    """The body of an answer Prometheus gives with an HTTP error status (a query it refuses)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return bytes(r.read())
    except urllib.error.HTTPError as exc:
        return bytes(exc.read())


def _query(base: str, q: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}"))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _joined(base: str, q: str, logs: Path) -> list[dict[str, Any]]:
    """The join ``q``'s answer once it has one (30 s at most); else the failure says what each side held
    (a fresh clone's run once found the job's join empty for 30 s)."""
    try:
        return wait_for(lambda: _query(base, q), 30, q)
    except AssertionError as exc:
        held = {k: _query(base, k) for k in ("perfd_gpu_info", "gpu:perfd_gpu_info:max")}
        ends = {name: (logs / name).read_text(errors="replace")[-2000:]
                for name in ("aggregator.out", "agent.out")}
        raise AssertionError(f"{exc}\nPrometheus holds {held}\nthe logs end: {ends}") from exc


def _documented_joins() -> list[str]:
    """The queries of docs/prometheus.md's "Joining DCGM-exporter" example block, as written."""
    doc = (ROOT / "docs" / "prometheus.md").read_text()
    section = doc[doc.index("### Joining DCGM-exporter"):]
    start = section.index("```promql") + len("```promql")
    block = section[start:section.index("```", start)]
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """An aggregator on loopback serving the agents' node series too (--export-node-series)."""
    ready = tmp_path / "aggregator.ready"
    proc = perfd("aggregator", "--grpc-port", "0", "--http-port", "0", "--export-node-series", "--no-rules",
                 "--ready-file", str(ready), log=tmp_path / "aggregator.out")
    try:
        words: list[str] = wait_for(lambda: ready.read_text().split() if ready.exists() else None, 60,
                                    "the aggregator's ready file")
        grpc_port, http_port = int(words[0]), int(words[1])
        yield grpc_port, http_port
    finally:
        stop(proc)


def test_prometheus_joins_perfd_and_dcgm_exporter(tmp_path: Path, dcgm_exporter: str,
                                                  aggregator: tuple[int, int]) -> None:
    prometheus = need("prometheus")
    recording = placed_recording(NVML_REPLAY, tmp_path / "nvml.jsonl", JOB, BUS)
    grpc_port, http_port = aggregator
    cfg = tmp_path / "agent.yaml"  # a node agent: NVML only, no job of its own
    cfg.write_text(f"collectors:\n  nvml: {{source: 'replay:{recording}', loop: true}}\n")
    agent_port = free_port()
    agent = perfd("agent", "--config", str(cfg), "--node", NODE, "--host", "off", "--aggregator",
                  f"127.0.0.1:{grpc_port}", "--metrics-port", str(agent_port), log=tmp_path / "agent.out")
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{DCGM_RULES}"]
scrape_configs:
  - job_name: perfd-agent
    static_configs: [{{targets: ["127.0.0.1:{agent_port}"]}}]
  - job_name: perfd-aggregator
    static_configs: [{{targets: ["127.0.0.1:{http_port}"]}}]
  - job_name: dcgm-exporter
    static_configs: [{{targets: ["{dcgm_exporter}"]}}]
""")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out = tmp_path / "prometheus.out"
    proc = subprocess.Popen([prometheus, f"--config.file={prom_cfg}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=out.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for(lambda: get(f"{base}/-/ready") is not None, 30, "Prometheus ready")
        wait_for(lambda: len([r for r in _query(base, "up == 1")]) == 3 or None, 30, "the three targets up")
        # The GPU's series twice: from the agent and from the aggregator (--export-node-series).
        wait_for(lambda: len(_query(base, f'perfd_gpu_sm_util_ratio{{UUID="{UUID}"}}')) == 2 or None, 60,
                 "the GPU's SM series from both scrape jobs")
        # The plain join of the two fails then; the one docs/prometheus.md gives does not.
        plain = "perfd_gpu_sm_util_ratio - on(UUID) gpu:perfd_gpu_utilization_ratio:dcgm"
        wait_for(lambda: _query(base, "gpu:perfd_gpu_utilization_ratio:dcgm"), 30, "the DCGM unit rules")
        body = json.loads(_get_error(f"{base}/api/v1/query?query={urllib.parse.quote(plain)}"))
        assert body["status"] == "error" and "many-to-one" in body["error"], body
        joins = _documented_joins()
        assert any("max without (job, instance) (perfd_gpu_sm_util_ratio)" in q for q in joins), joins
        for q in joins:
            # DCGM_FI_PROF_SM_ACTIVE: the exposition here serves the tensor pipe's, same labels and unit
            q = q.replace('{job_name="gpt-8b"}', f'{{job_name="{JOB}"}}').replace(
                "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
            res = _joined(base, q, tmp_path)
            assert len(res) == 1 and res[0]["metric"]["UUID"] == UUID, (q, res)

        # The joins docs/prometheus.md gives, each matching the one GPU: by UUID, by node and index,
        # by PCI bus id; the job comes from perfd_gpu_info (the job its processes declare).
        for join in ("on(UUID)", "on(Hostname, gpu)", "on(pci_bus_id)"):
            q = f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE * {join} group_left(job_name) gpu:perfd_gpu_info:max"
            res = _joined(base, q, tmp_path)
            assert len(res) == 1, (q, res)
            m = res[0]["metric"]
            assert (m["job_name"], m["pod"], m["UUID"]) == (JOB, "llm-pretrain-0", UUID), (q, m)
            assert float(res[0]["value"][1]) == 0.93

        # A perfd series and a DCGM one side by side, in perfd's units: the memory total is the
        # same number of bytes (constant in the recording), whatever unit DCGM-exporter serves.
        q = "max without (job, instance) (perfd_gpu_memory_total_bytes) - on(UUID) " \
            "gpu:perfd_gpu_memory_total_bytes:dcgm"
        res = wait_for(lambda: _query(base, q), 30, q)
        assert len(res) == 1 and float(res[0]["value"][1]) == 0.0, res
        # DCGM-exporter's own series, put in the job by perfd (the dashboards' job_name filter).
        q = f'gpu:perfd_gpu_utilization_ratio:dcgm * on(UUID) group_left(job_name) ' \
            f'gpu:perfd_gpu_info:max{{job_name="{JOB}"}}'
        res = wait_for(lambda: _query(base, q), 30, q)
        assert [float(r["value"][1]) for r in res] == [0.87]

        # Every unit rule: DCGM-exporter's value in perfd's unit.
        want = {"perfd_gpu_utilization_ratio": 0.87, "perfd_gpu_memory_utilization_ratio": 0.25,
                "perfd_gpu_memory_used_bytes": 3406 * 2**20, "perfd_gpu_memory_total_bytes": 85520809984,
                "perfd_gpu_sm_clock_hertz": 1.98e9, "perfd_gpu_mem_clock_hertz": 2.619e9,
                "perfd_gpu_energy_joules_total": 123456.789, "perfd_gpu_power_watts": 412.5,
                "perfd_gpu_temperature_celsius": 55.0}
        for name, value in want.items():
            res = wait_for(lambda name=name: _query(base, f"gpu:{name}:dcgm"), 30, name)  # type: ignore[misc]
            assert len(res) == 1 and res[0]["metric"]["UUID"] == UUID
            assert float(res[0]["value"][1]) == pytest.approx(value, rel=1e-12), name
        # Each rule records a perfd catalog name: the join partner exists on the agent's /metrics.
        served = get(f"http://127.0.0.1:{agent_port}/metrics").decode()
        assert all(f"\n{name}{{" in served for name in ("perfd_gpu_memory_total_bytes", "perfd_gpu_info"))
    finally:
        stop(agent)
        rc = stop(proc)
        assert rc == 0, out.read_text()[-3000:]
