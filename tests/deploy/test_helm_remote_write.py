"""The chart's aggregator.remoteWrite: the flags it renders are the aggregator's, each credential file
is a key of the mounted Secret, and values that would give an aggregator refusing to start are refused
at render time."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfd.app.cli import build_parser
from perfd.exporters.remote_write import TENANT_HEADER, Credentials
from tests.deploy.test_helm_chart import CHART, _args, _pod, _render, _run, validate_rendered

pytestmark = pytest.mark.slow

SETS = ("aggregator.remoteWrite.urls[0]=https://mimir.example/api/v1/push",
        "aggregator.remoteWrite.urls[1]=http://vm.example:8428/api/v1/write",
        "aggregator.remoteWrite.tenant=team-a",
        "aggregator.remoteWrite.headers.THANOS-TENANT=team-a",
        "aggregator.remoteWrite.secret=perfd-remote-write",
        "aggregator.remoteWrite.basicAuthUser=perfd",
        "aggregator.remoteWrite.caKey=ca.crt")


def test_the_rendered_flags_are_the_aggregators_and_read_the_secrets_keys(tmp_path: Path) -> None:
    docs = _render(*SETS)
    validate_rendered(docs)
    args = _args(docs, "Deployment")
    a = build_parser().parse_args(args)
    assert a.remote_write == ["https://mimir.example/api/v1/push", "http://vm.example:8428/api/v1/write"]
    assert (a.remote_write_tenant, a.remote_write_header, a.remote_write_basic_auth_user) == (
        "team-a", ["THANOS-TENANT=team-a"], "perfd")
    pod = _pod(docs, "Deployment")
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "remote-write"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "remote-write"]
    assert vol["secret"]["secretName"] == "perfd-remote-write" and mount["readOnly"] is True
    files = {a.remote_write_basic_auth_password_file: "password", a.remote_write_ca_file: "ca.crt"}
    assert all(f == f"{mount['mountPath']}/{key}" for f, key in files.items()), files
    # the same flags, the Secret's keys as files here: the aggregator's own check takes them
    (tmp_path / "password").write_text("pw\n")
    from tests.security.certs import CA

    CA("chart-ca").write_ca(tmp_path, "ca")
    creds = Credentials.of(a.remote_write_tenant, a.remote_write_header, None, a.remote_write_basic_auth_user,
                           str(tmp_path / "password"), str(tmp_path / "ca.crt"))
    assert dict(creds.headers) == {"THANOS-TENANT": "team-a", TENANT_HEADER: "team-a"}


def test_off_by_default_and_without_a_secret_no_volume() -> None:
    assert not [x for x in _args(_render(), "Deployment") if x.startswith("--remote-write")]
    docs = _render("aggregator.remoteWrite.urls[0]=http://prometheus:9090/api/v1/write")
    args = _args(docs, "Deployment")
    assert args[args.index("--remote-write") + 1] == "http://prometheus:9090/api/v1/write"
    assert "--remote-write-basic-auth-user" not in args
    assert "remote-write" not in {v["name"] for v in _pod(docs, "Deployment")["volumes"]}


def test_values_that_would_not_start_are_refused_at_render() -> None:
    for sets, says in (
        (("aggregator.remoteWrite.secret=s", "aggregator.remoteWrite.bearerTokenKey=token",
          "aggregator.remoteWrite.basicAuthUser=u"), "not both"),
        (("aggregator.remoteWrite.caKey=ca.crt",), "name keys of aggregator.remoteWrite.secret"),
        (("aggregator.remoteWrite.urls[0]=ftp://x/y",), "values don't meet the specifications"),
        (("aggregator.remoteWrite.headers.bad name=x",), "values don't meet the specifications"),
    ):
        r = _run("template", "perfd", str(CHART), *[x for s in sets for x in ("--set", s)])
        assert r.returncode != 0 and says in r.stderr, (sets, r.stderr[-400:])
