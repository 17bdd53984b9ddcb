"""The live pipeline inside the test's own process: the real aggregator (its gRPC ingest server, HTTP
API and /metrics, its state, SQLite with --state-dir) on loopback ephemeral ports, fed by real agents
(their collectors, sender and transport client, the codecs) or by bare transport clients pushing
recorded batches, over real gRPC. No process is started: what a test of the pipeline waited for in a
start-up (an interpreter, perfd's imports, a ready file) it no longer waits for, and a failure's message
says what each side held, not the tail of two logs.

Both daemons are configured as their commands configure them: ``pipeline(tmp, *ARGS)`` takes
``perfd aggregator``'s arguments and ``Pipeline.agent(*ARGS)`` ``perfd agent``'s, parsed by perfd's own
parser and turned into the configuration by the commands' own code (perfd/app/commands/live.py), then
``Aggregator(cfg).start()`` and ``Agent(cfg).run(stop)`` run on one event loop in a thread of the test.
Shutdown is the daemons' own, in the order tests/procs.py stops processes: the agents first (each
flushes what it holds, as on SIGTERM), then the aggregator; every wait on the loop is bounded and names
what it waited for.

    with pipeline(tmp_path, "--gpu", "NVIDIA H200") as p:
        a = p.agent("--job", "j", "--megatron-log", log, "--nvml", "off", "--host", "off")
        p.wait(lambda: p.json("/api/jobs")["jobs"], 30, "the job at the aggregator")
        p.send("node-b", [{"steps": records}], jobs=["j"])  # recorded batches, acknowledged
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import perfd.transport.client  # noqa: F401  (grpc imported before the aggregator's command sets GRPC_EXPERIMENTS)
from perfd.agent.config import AgentConfig
from perfd.agent.node_agent import Agent
from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.state import AggregatorState
from perfd.app.cli import build_parser
from perfd.app.commands.live import _agent, _aggregator
from perfd.transport.client import AgentClient
from tests.procs import NOT_YET, WaitTimeout, get_json, http_get, wait_for

T = TypeVar("T")

# The longest any one step of the harness waits on the loop (a start, a flush, a stop): a bound on a
# failure only; each step ends as soon as what it waits for has happened.
STEP_S = 30.0


class _Loop:
    """An event loop running in a thread of its own, and calls into it from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="inproc-loop", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], what: str, timeout: float = STEP_S) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise WaitTimeout(f"timed out after {timeout:.0f}s on the pipeline's loop: {what}") from None

    def close(self) -> None:
        async def cancel_rest() -> None:  # whatever a test left running on the loop (none, normally)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_default_executor()  # its worker threads joined

        try:
            self.call(cancel_rest(), "the loop's last tasks to end")
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(STEP_S)
            if not self.thread.is_alive():
                self.loop.close()


def _config(handler: Callable[..., int], argv: Sequence[str]) -> Any:
    """The configuration the command ``argv`` would run with, made by its own code; its refusal (the
    line it prints, exit status 2) as an AssertionError."""
    args = build_parser().parse_args(list(argv))
    made: list[Any] = []

    def keep(cfg: Any, ready_file: str | None) -> int:
        made.append(cfg)
        return 0

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = handler(args, run=keep)
    if rc != 0 or not made:
        raise AssertionError(f"perfd {' '.join(argv)} refused its arguments ({rc}): {err.getvalue().strip()}")
    return made[0]


def aggregator_config(*args: str | Path) -> AggregatorConfig:
    """``perfd aggregator ARGS``'s configuration (loopback, ephemeral ports unless ARGS say)."""
    cfg: AggregatorConfig = _config(_aggregator, ["aggregator", "--grpc-host", "127.0.0.1", "--grpc-port",
                                                  "0", "--http-host", "127.0.0.1", "--http-port", "0",
                                                  *map(str, args)])
    return cfg


def agent_config(target: str, *args: str | Path) -> AgentConfig:
    """``perfd agent --aggregator TARGET ARGS``'s configuration (no /metrics unless ARGS give a port)."""
    cfg: AgentConfig = _config(_agent, ["agent", "--aggregator", target, "--metrics-port", "-1",
                                        *map(str, args)])
    return cfg


@dataclass
class AgentHandle:
    """A real agent running on the pipeline's loop."""

    name: str
    agent: Agent
    stop_event: asyncio.Event
    task: asyncio.Task[None]
    stopped: bool = False

    @property
    def metrics_url(self) -> str:
        """The agent's own /metrics (with ``--metrics-port 0``: the port it bound)."""
        assert self.agent.metrics_port is not None, f"{self.name} has no /metrics (--metrics-port -1)"
        return f"http://127.0.0.1:{self.agent.metrics_port}/metrics"

    def runs(self, collector: str) -> int:
        """How many times ``collector`` has collected so far."""
        return self.agent.scheduler.states[collector].runs

    def seen(self) -> dict[str, Any]:
        """What this agent holds and has sent: its collectors' runs, output and errors, its stream."""
        c = self.agent.client
        out: dict[str, Any] = {
            "collectors": {n: {"runs": s.runs, "failures": s.failures, "steps": s.steps, "events": s.events,
                               "samples": s.samples} for n, s in self.agent.scheduler.states.items()},
            "config_errors": self.agent.config_errors, "submit_errors": self.agent.submit_errors}
        if c is not None:
            out["client"] = {k: getattr(c, k) for k in ("connected", "batches_submitted", "batches_acked",
                                                       "reconnects", "last_error")}
        if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
            out["ended_with"] = repr(self.task.exception())
        return out


@dataclass
class Pipeline:
    """The running aggregator, what feeds it, and the reads a test makes of it."""

    tmp: Path
    agg: Aggregator
    _loop: _Loop
    agents: dict[str, AgentHandle] = field(default_factory=dict)

    @property
    def state(self) -> AggregatorState:
        return self.agg.state

    @property
    def target(self) -> str:
        """The gRPC address agents send to."""
        return f"127.0.0.1:{self.agg.grpc_port}"

    @property
    def base(self) -> str:
        """The HTTP API's base URL."""
        assert self.agg.http is not None
        return f"http://127.0.0.1:{self.agg.http.port}"

    # -- what feeds it ---------------------------------------------------------------------------
    def agent(self, *args: str | Path, name: str = "agent") -> AgentHandle:
        """``perfd agent ARGS`` streaming to this aggregator, in this process; stopped (as SIGTERM stops
        it: collectors, last batches flushed, stream closed) by stop_agent() or at the end."""
        if name in self.agents and not self.agents[name].stopped:
            raise ValueError(f"an agent named {name!r} is running")
        cfg = agent_config(self.target, *args)

        async def start() -> AgentHandle:
            agent = Agent(cfg)
            stop = asyncio.Event()
            return AgentHandle(name, agent, stop, asyncio.create_task(agent.run(stop)))

        h = self._loop.call(start(), f"{name} to start")
        self.agents[name] = h
        # Started: its collectors built and, where it serves one, its /metrics bound (Agent.run's order).
        self.wait(lambda: h.task.done() or (h.agent.client is not None
                                            and (cfg.metrics_port in (None, -1) or h.agent.metrics_port)),
                  STEP_S, f"{name} to start its stream", interval=0.02)
        if h.task.done():
            raise AssertionError(f"{name} ended at start: {h.seen()}")
        return h

    def stop_agent(self, name: str = "agent") -> None:
        """Stop an agent as SIGTERM does (what it holds flushed first), waiting for the end of its run."""
        h = self.agents[name]
        if h.stopped:
            return
        h.stopped = True

        async def stop() -> None:
            h.stop_event.set()
            await h.task

        self._loop.call(stop(), f"{name} to stop")

    def client(self, agent_id: str, jobs: Sequence[str] = (), node: str = "", **kw: Any) -> AgentClient:
        """A bare transport client (no collectors) of the agent ``agent_id``: its batches are what a test
        submits (``client.submit(...)``); send() runs it."""
        return AgentClient(self.target, agent_id, jobs=list(jobs), node=node, **kw)

    def send(self, agent_id: str, batches: Sequence[Mapping[str, Any]], jobs: Sequence[str] = (),
             node: str = "", timeout: float = STEP_S) -> AgentClient:
        """Recorded batches (AgentClient.submit's keyword arguments each) sent by the agent ``agent_id``
        over its own stream, returned once every one is acknowledged; its stream then closed."""
        c = self.client(agent_id, jobs, node)
        for b in batches:
            c.submit(**b)

        async def run() -> bool:
            task = asyncio.create_task(c.run())
            try:
                return await c.flush(timeout)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                c.close()

        if not self._loop.call(run(), f"{agent_id}'s batches acknowledged", timeout + 5):
            raise AssertionError(f"{agent_id}: {c.batches_acked} of {c.batches_submitted} batches "
                                 f"acknowledged in {timeout:.0f}s (last error {c.last_error!r}); "
                                 f"aggregator: {self.seen()}")
        return c

    def call(self, coro: Coroutine[Any, Any, T], what: str, timeout: float = STEP_S) -> T:
        """Run ``coro`` on the pipeline's loop (clients of a test's own making, streams held open at
        once), its result returned; ``what`` names it in a timeout's message."""
        return self._loop.call(coro, what, timeout)

    # -- reads -----------------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 10.0) -> bytes:
        return http_get(self.base + path, timeout)

    def json(self, path: str, timeout: float = 10.0) -> Any:
        return get_json(self.base + path, timeout)

    @staticmethod
    def get_url(url: str, timeout: float = 10.0) -> bytes:
        """Any other endpoint of the pipeline (an agent's /metrics)."""
        return http_get(url, timeout)

    def seen(self) -> dict[str, Any]:
        """What the aggregator holds: its jobs with their iterations, its transport's counters."""
        st = self.agg.state
        return {"jobs": {j: f"{len(st.step_records(j))} step records" for j in st.job_names()},
                "transport": {k: v for k, v in self.agg.server.counters().items() if v}}

    def wait(self, pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
             progress: Callable[[], Any] | None = None) -> Any:
        """procs.wait_for on this pipeline: a timeout's message also says what the aggregator and each
        agent held at that moment."""
        try:
            return wait_for(pred, timeout, what, interval=interval, ignore=NOT_YET, progress=progress)
        except WaitTimeout as exc:
            agents = {n: h.seen() for n, h in self.agents.items()}
            raise WaitTimeout(f"{exc}\naggregator saw: {json.dumps(self.seen(), default=str)}\n"
                              f"agents saw: {json.dumps(agents, default=str)}") from None

    def collected(self, h: AgentHandle, collector: str, timeout: float = STEP_S) -> None:
        """Wait until ``collector`` of agent ``h`` has run a whole collect that began after this call:
        what was written to its source before the call has been read."""
        since = h.runs(collector)
        self.wait(lambda: h.runs(collector) >= since + 2, timeout, f"{h.name}'s {collector} to collect again",
                  interval=0.02)


@contextlib.contextmanager
def pipeline(tmp: Path, *aggregator_args: str | Path) -> Iterator[Pipeline]:
    """``perfd aggregator ARGS`` in this process; the agents a test starts on it stopped before it."""
    cfg = aggregator_config(*aggregator_args)
    loop = _Loop()
    agg: Aggregator | None = None
    try:
        async def start() -> Aggregator:
            a = Aggregator(cfg)
            await a.start()
            return a

        agg = loop.call(start(), "the aggregator to start")
        p = Pipeline(tmp, agg, loop)
        try:
            yield p
        finally:
            errors = []
            for name in list(p.agents):
                try:
                    p.stop_agent(name)
                except Exception as exc:  # every agent stopped, then the first failure said
                    errors.append(exc)
            if errors:
                raise errors[0]
    finally:
        try:
            if agg is not None:
                loop.call(agg.stop(), "the aggregator to stop")
                _join_http_workers(agg)
        finally:
            loop.close()


HTTP_WORKERS_END_S = 10.0


def _join_http_workers(agg: Aggregator) -> None:
    """The HTTP server's workers end once each has taken its stop sentinel, after the server's stop
    returns (by design: a SIGTERM never waits on a slow API call); a test's process waits for them, so
    that what one test started is gone before the next begins."""
    deadline = time.monotonic() + HTTP_WORKERS_END_S
    for t in agg.http.threads() if agg.http is not None else ():
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise WaitTimeout(f"the aggregator's HTTP worker {t.name} still running "
                              f"{HTTP_WORKERS_END_S:g} s after its stop")
