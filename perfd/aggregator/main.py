"""`perfd aggregator`: gRPC ingest (grpc.aio) + analytics + Prometheus /metrics + JSON API."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfd.aggregator.captures import CaptureCoordinator
from perfd.aggregator.http import HttpServer
from perfd.aggregator.state import AggregatorState, LabelKey
from perfd.aggregator.wandb_sync import WandbSync
from perfd.analytics.collectives import CollectiveConfig
from perfd.jobinfo_json import job_info_from_json
from perfd.rules.engine import RuleEngine
from perfd.rules.loader import default_pack_path, load_pack
from perfd.transport.codec import DecodedBatch, HelloInfo, Series
from perfd.transport.server import IngestServer

log = logging.getLogger(__name__)


@dataclass
class AggregatorConfig:
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 50051
    http_host: str = "0.0.0.0"
    http_port: int = 9401
    gpu: str | None = None  # override the GPU name used for the peak table
    peak_tflops: float | None = None
    max_iterations_per_job: int = 5000
    per_rank_series: bool = True  # False: /metrics leaves out per-rank series (very large jobs)
    export_node_series: bool = False  # True: /metrics also re-exports the agents' GPU and host series
    # Rule packs evaluated every rules_interval_s; None = the shipped default pack, [] = no rules.
    rules_files: list[str] | None = None
    rules_interval_s: float = 5.0
    # Weights & Biases: one run per job (perfd.exporters.wandb); None = off.
    wandb_project: str | None = None
    wandb_mode: str = "offline"  # offline (no server; `wandb sync` later) | online | disabled
    wandb_dir: str | None = None  # where runs are written (default: ./perfd-wandb)
    wandb_interval_s: float = 10.0
    # Collective analysis (link capabilities): the default and per-job overrides.
    collectives: CollectiveConfig | None = None
    collectives_per_job: dict[str, CollectiveConfig] = field(default_factory=dict)


class Aggregator:
    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.state = AggregatorState(cfg.max_iterations_per_job, gpu_override=cfg.gpu,
                                     peak_tflops=cfg.peak_tflops)
        if cfg.collectives is not None:  # link capabilities for the collective analysis
            self.state.collectives.config = cfg.collectives
        self.state.collectives.job_config.update(cfg.collectives_per_job)
        self.server = IngestServer(self.on_batch, self._on_hello)
        self.http: HttpServer | None = None
        self.grpc_port = 0
        self.captures = CaptureCoordinator(self.state, self._engine(cfg), self.server.send_command,
                                           cfg.rules_interval_s)
        self._rules_task: asyncio.Task[None] | None = None
        # (agent, series id) -> (name, sorted labels): converted once per definition, not per sample.
        self._series: dict[str, dict[int, tuple[str, LabelKey]]] = {}
        self.job_info_errors = 0
        self.wandb: WandbSync | None = None
        self._wandb_task: asyncio.Task[None] | None = None
        if cfg.wandb_project:
            from perfd.exporters.wandb import WandbExporter

            exporter = WandbExporter(cfg.wandb_project, cfg.wandb_mode, cfg.wandb_dir)
            self.wandb = WandbSync(self.state, exporter, self.captures.list, cfg.wandb_interval_s)

    @staticmethod
    def _engine(cfg: AggregatorConfig) -> RuleEngine | None:
        if cfg.rules_files is None:
            default = default_pack_path()
            if not default.is_file():  # an install without the shipped packs: say so, run on
                log.warning("no default rule pack at %s: no rules evaluated (give --rules FILE)", default)
                return None
            files = [str(default)]
        else:
            files = cfg.rules_files
        rules = [r for f in files for r in load_pack(f).rules]  # a bad pack stops start-up: loud
        return RuleEngine(rules) if rules else None

    async def _rules_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.rules_interval_s)
            try:
                # Analysis may run here (rate-limited): off the event loop, so ingest never waits.
                await asyncio.get_running_loop().run_in_executor(None, self.captures.evaluate)
            except Exception:  # a rule bug must not stop ingest; it is logged each time
                log.exception("rule evaluation failed")

    def _on_hello(self, hello: HelloInfo) -> None:
        self.state.hello(hello.agent_id, hello.jobs)

    def _series_defs(self, batch: DecodedBatch) -> Mapping[int, tuple[str, LabelKey]]:
        cache = self._series.setdefault(batch.agent_id, {})
        table: Mapping[int, Series] = batch.series
        for sid in batch.new_series:
            s = table[sid]
            cache[sid] = (s.name, tuple(sorted(s.labels.items())))
        if len(cache) < len(table):  # first batch after an aggregator restart: fill all at once
            for sid, s in table.items():
                if sid not in cache:
                    cache[sid] = (s.name, tuple(sorted(s.labels.items())))
        return cache

    def on_batch(self, agent_id: str, batch: DecodedBatch) -> None:
        st = self.state
        for job, text in batch.job_info_json.items():
            try:
                st.ingest_job_info(agent_id, job, job_info_from_json(text))
            except (ValueError, TypeError) as exc:
                self.job_info_errors += 1
                log.warning("agent %s sent unusable job info for %s: %s", agent_id, job, exc)
        if batch.n_samples:
            st.ingest_samples(agent_id, self._series_defs(batch), batch.series_ids,
                              batch.timestamps_ns, batch.values)
        if batch.steps:
            st.ingest_steps(agent_id, batch.steps)
        if batch.collectives:
            st.ingest_collectives(agent_id, batch.collectives)
        if batch.events:
            st.ingest_events(agent_id, [dict(e) for e in batch.events])

    async def start(self) -> None:
        self.grpc_port = await self.server.start(self.cfg.grpc_host, self.cfg.grpc_port)
        self.state.transport_stats = _LiveCounters(self)
        self.http = HttpServer(self.state, self.cfg.http_host, self.cfg.http_port, self.captures,
                               per_rank_series=self.cfg.per_rank_series,
                               export_node_series=self.cfg.export_node_series)
        self.http.start()
        if self.captures.engine is not None:
            self._rules_task = asyncio.create_task(self._rules_loop())
        if self.wandb is not None:
            self._wandb_task = asyncio.create_task(self.wandb.run())
        log.info("aggregator: gRPC on %s:%d, HTTP on %s:%d", self.cfg.grpc_host, self.grpc_port,
                 self.cfg.http_host, self.http.port)

    async def stop(self) -> None:
        if self._rules_task is not None:
            self._rules_task.cancel()
        if self._wandb_task is not None:
            self._wandb_task.cancel()
        if self.wandb is not None:
            await self.wandb.close()
        await self.server.stop(grace=1.0)
        if self.http is not None:
            self.http.stop()


class _LiveCounters(Mapping[str, int]):
    """The transport's counters, read when /api/stats is asked (not copied on every batch)."""

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def _d(self) -> dict[str, int]:
        d = self.agg.server.counters()
        d["job_info_errors"] = self.agg.job_info_errors
        return d

    def __getitem__(self, k: str) -> int:
        return self._d()[k]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())


def run_aggregator(cfg: AggregatorConfig, ready_file: str | None = None) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        agg = Aggregator(cfg)
        await agg.start()
        assert agg.http is not None
        print(f"perfd aggregator: gRPC {cfg.grpc_host}:{agg.grpc_port}, "
              f"HTTP http://{cfg.http_host}:{agg.http.port}/metrics", flush=True)
        if ready_file:  # lets a supervisor (the demo, tests) learn the bound ports
            with open(ready_file, "w") as f:
                f.write(f"{agg.grpc_port} {agg.http.port}\n")
        await stop.wait()
        await agg.stop()

    asyncio.run(main())
    return 0
