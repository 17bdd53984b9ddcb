"""Connecting to the engine and making sure its streams and lease bucket exist, for every role (the
agent's publisher, a shard, a job's root). nats-py does the protocol, reconnects and TLS; this
module only turns an :class:`EngineConfig` into its options and declares the streams once.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TypedDict

from perfd.engine import subjects as S
from perfd.engine.nats_api import NatsClient

RECONNECT_ATTEMPTS = 5
# How long closing a connection may take before its owner lets it go and connects afresh. nats-py's
# close (and its own reconnect) awaits the old socket's transport closing, which can wait for good on
# a socket the server dropped (https://github.com/nats-io/nats.py/issues/671 and
# https://github.com/nats-io/nats.py/issues/718): an agent stuck there never published
# again (a CI run of `perfd bench engine-storm`: an agent still not connected minutes after its
# nats-server came back). A clean close takes milliseconds.
CLOSE_TIMEOUT_S = 5.0
# JetStream's error code for a stream (the lease bucket is one) that exists with another config
STREAM_CONFIG_DIFFERS = 10058
log = logging.getLogger("perfd.engine")


async def _log_error(exc: Exception) -> None:
    log.warning("engine connection: %s: %s", type(exc).__name__, exc)


class ConnectOptions(TypedDict, total=False):
    """The keywords of nats-py's ``connect`` perfd sets."""

    servers: list[str]
    name: str
    max_reconnect_attempts: int
    reconnect_time_wait: float
    connect_timeout: float
    allow_reconnect: bool
    error_cb: Callable[[Exception], Awaitable[None]]
    reconnected_cb: Callable[[], Awaitable[None]]
    token: str
    tls: ssl.SSLContext


def connect_options(cfg: S.EngineConfig, name: str) -> ConnectOptions:
    opts: ConnectOptions = {
        "servers": list(cfg.servers),
        "name": name,
        # A few attempts per server, then the connection gives up (NoServersError) and its owner
        # decides: the agent's publisher and the root retry with backoff (what waits is in their
        # spool or the stream), a shard that never connected exits with the reason. Forever (-1)
        # would also keep a wrong URL given on a command line retrying, silently, for good.
        "max_reconnect_attempts": RECONNECT_ATTEMPTS,
        "reconnect_time_wait": 1.0,
        "connect_timeout": 5.0,
        "allow_reconnect": True,
        "error_cb": _log_error,  # one line each (nats-py's default logs a traceback per attempt)
    }
    if cfg.token:
        opts["token"] = cfg.token
    if cfg.tls_ca:
        ctx = ssl.create_default_context(cafile=cfg.tls_ca)
        if cfg.tls_cert and cfg.tls_key:
            ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        opts["tls"] = ctx
    return opts


async def connect(cfg: S.EngineConfig, name: str,
                  reconnected_cb: Callable[[], Awaitable[None]] | None = None) -> NatsClient:
    """A connected nats-py client (raises what nats-py raises when no server answers).
    ``reconnected_cb``: called each time nats-py has reconnected the session by itself."""
    import nats  # the engine's client: an optional dependency (perfd[engine])

    opts = connect_options(cfg, name)
    if reconnected_cb is not None:
        opts["reconnected_cb"] = reconnected_cb
    return await nats.connect(**opts)


# Closes still running past their bound, held so that they are not collected mid-run.
_LET_GO: set[asyncio.Task[None]] = set()


async def close_bounded(nc: NatsClient, who: str, timeout: float | None = None) -> bool:
    """Close ``nc``, waiting at most ``timeout``; False (logged) when it did not close in time: the
    caller goes on with a fresh connection and counts it. A close that raises is a broken connection
    closed all the same (True). Never raises but CancelledError. ``timeout``: CLOSE_TIMEOUT_S unless given.

    The close runs as a task of its own and is waited on with ``asyncio.wait``, never ``wait_for``
    (which, on its timeout, cancels the close and then waits for it to end: nats-py's close swallows
    a cancellation that lands while it waits for its reconnection task). Measured, `perfd bench
    engine-storm` (30 agents, one burner) three at once on the loaded 2-core VM: with ``wait_for``
    every agent stayed unconnected after the restart in 3 of 3 and 3 of 3 runs, none counted as let
    go; with this, all connected again 1.0-1.3 s after it in 6 of 6, none let go either. Where
    ``wait_for`` held them inside nats-py was not pinned down. Past the bound the task is let go:
    nats-py marks the client closed first thing, so nothing of it reconnects or publishes again."""
    timeout = CLOSE_TIMEOUT_S if timeout is None else timeout
    task = asyncio.ensure_future(nc.close())
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.warning("engine: %s's connection did not close in %.0f s: let go (a fresh one is made)",
                    who, timeout)
        _LET_GO.add(task)
        task.add_done_callback(_LET_GO.discard)
        return False
    exc = None if task.cancelled() else task.exception()
    if exc is not None:  # closing a broken connection: nothing left to save
        log.info("engine: %s's connection closed with %s: %s", who, type(exc).__name__, exc)
    return True


async def ensure_streams(nc: NatsClient, cfg: S.EngineConfig, replicas: int = 1,
                         comm_rows: bool = False, job_roots: bool = False) -> None:
    """The streams, the lease bucket (its keys expiring after ``cfg.lease_ttl_s``) and the job infos', made if
    missing (the same call from every process that starts: JetStream's add is idempotent for an
    identical config, and refuses another: a process given another --engine-replicas or
    --engine-lease-ttl than the bucket was made with). ``replicas``: 3 on a cluster of three servers
    (one lost keeps every message and lease), 1 on a single server."""
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    js = nc.jetstream()
    await js.add_stream(StreamConfig(
        name=S.NODES_STREAM, subjects=[f"{S.NODES_PREFIX}.>"], retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
        discard=DiscardPolicy.NEW,  # full: the publisher is refused and keeps it in its spool
        max_bytes=S.NODES_MAX_BYTES))
    await js.add_stream(StreamConfig(
        name=S.PARTIALS_STREAM, subjects=[f"{S.PARTIALS_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
        max_age=S.PARTIALS_MAX_AGE_S, max_bytes=S.PARTIALS_MAX_BYTES))
    await js.add_stream(StreamConfig(
        name=S.RECORDS_STREAM, subjects=[f"{S.RECORDS_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
        max_age=S.PARTIALS_MAX_AGE_S, max_bytes=S.RECORDS_MAX_BYTES))
    await js.add_stream(StreamConfig(
        name=S.EVENTS_STREAM, subjects=[f"{S.EVENTS_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
        max_age=S.PARTIALS_MAX_AGE_S, max_bytes=S.EVENTS_MAX_BYTES))
    await js.add_stream(StreamConfig(
        name=S.SUMMARIES_STREAM, subjects=[f"{S.SUMMARIES_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
        max_age=S.PARTIALS_MAX_AGE_S, max_bytes=S.SUMMARIES_MAX_BYTES))
    if comm_rows:  # only where a shard saves them (--comm-summaries): its bytes are reserved of the store
        await js.add_stream(StreamConfig(
            name=S.COMMROWS_STREAM, subjects=[f"{S.COMMROWS_PREFIX}.>"], retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE, num_replicas=replicas, duplicate_window=S.DUPLICATE_WINDOW_S,
            max_age=S.COMMROWS_MAX_AGE_S, max_bytes=S.COMMROWS_MAX_BYTES))
    try:
        await js.create_key_value(bucket=S.LEASES_BUCKET, ttl=cfg.lease_ttl_s, replicas=replicas, history=1)
    except Exception as exc:
        if getattr(exc, "err_code", None) != STREAM_CONFIG_DIFFERS:
            raise
        raise RuntimeError(f"the engine's lease bucket was made with another TTL or replicas than this "
                           f"process's --engine-lease-ttl {cfg.lease_ttl_s:g} and --engine-replicas "
                           f"{replicas} (the same on every shard and root): {exc}") from exc
    if job_roots:  # a root's (perfd.engine.job_roots), best effort: a job's own root needs it (it says so)
        try:
            await js.create_key_value(bucket=S.JOB_ROOTS_BUCKET, ttl=S.JOB_ROOTS_TTL_S, replicas=replicas,
                                      history=1)
        except Exception as exc:  # the account's limits, another version's config: used where it is there
            log.warning("engine: the job-roots bucket %s not made as this process would (%s)",
                        S.JOB_ROOTS_BUCKET, exc)
    try:  # best effort (perfd.engine.shard_jobinfo): without it a taking shard waits for the agents' send
        await js.create_key_value(bucket=S.JOBINFO_BUCKET, ttl=S.JOBINFO_TTL_S, replicas=replicas, history=1,
                                  max_bytes=S.JOBINFO_MAX_BYTES)
    except Exception as exc:  # made otherwise by another version, or the account's limits: used as it is
        log.warning("engine: the job-info bucket %s not made as this process would (%s); %s",
                    S.JOBINFO_BUCKET, exc, "the one there is used" if getattr(exc, "err_code", None)
                    == STREAM_CONFIG_DIFFERS else "shards go without it")
