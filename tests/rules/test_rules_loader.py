"""Rule packs: loading, every error of a file with its line, the default pack, the check command."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from perfd.core.model import CAPTURE_TOOLS
from perfd.rules.check_command import run_rules_check
from perfd.rules.pack_loader import check_files, default_pack_path, load_pack, parse_pack
from perfd.rules.rule_types import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_DISK_QUOTA_BYTES,
    DEFAULT_MAX_PER_HOUR,
    DEFAULT_STEPS,
    AlertAction,
    CaptureAction,
    CaptureTargets,
    RulePackError,
    parse_bytes,
    parse_duration,
)

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def errors_of(tmp_path: Path, text: str) -> list[tuple[int | None, str | None, str]]:
    p = write(tmp_path, "pack.yaml", text)
    return [(e.line, e.rule, e.message) for e in check_files([p])]


def assert_errors(found: list[tuple[int | None, str | None, str]],
                  expected: list[tuple[int | None, str | None, str]]) -> None:
    """Each expected (line, rule, fragment) matches one error, and there are no others."""
    left = list(found)
    for line, rule, fragment in expected:
        match = [f for f in left if f[0] == line and f[1] == rule and fragment in f[2]]
        assert match, f"no error ({line}, {rule}, {fragment!r}) in {found}"
        left.remove(match[0])
    assert not left, f"unexpected errors: {left}"


def test_full_pack_loads(tmp_path: Path) -> None:
    p = write(tmp_path, "good.yaml", """
        rules:
          - name: low_mfu
            expr: mfu < 30%
            for: 5m
            severity: critical
            labels: {team: infra, tier: 1}
            annotations:
              summary: low
              description: >-
                long text
              recommendation: do things
            action:
              type: capture
              tool: kineto
              targets: {ranks: [3, 1, 3]}
              steps: 5
              cooldown: 1h30m
              max_per_hour: 4
              disk_quota: 500MB
          - name: hot
            expr: gpu_temperature > 85C
            scope: gpu
          - name: rank_slow
            expr: rank_compute_ratio > 1.1
            scope: rank
            action: {type: capture}
    """)
    pack = load_pack(p)
    assert pack.name == "good" and [r.name for r in pack.rules] == ["low_mfu", "hot", "rank_slow"]
    r = pack.get("low_mfu")
    assert r.for_s == 330.0 - 30.0
    assert r.severity == "critical" and r.scope == "job"
    assert r.labels == {"team": "infra", "tier": "1"}
    assert r.annotations.summary == "low" and r.annotations.description == "long text"
    assert r.action == CaptureAction(tool="kineto", targets=CaptureTargets(ranks=(1, 3)), steps=5,
                                     cooldown_s=5400.0, max_per_hour=4, disk_quota_bytes=500_000_000)
    assert r.origin == f"{p}:2"
    hot = pack.get("hot")
    assert hot.for_s == 0.0 and hot.severity == "warning" and hot.scope == "gpu"
    assert hot.action == AlertAction()
    cap = pack.get("rank_slow").action
    assert isinstance(cap, CaptureAction)
    assert cap.tool == "auto" and cap.targets == CaptureTargets(slowest_rank=True)
    assert (cap.steps, cap.cooldown_s, cap.max_per_hour, cap.disk_quota_bytes) == (
        DEFAULT_STEPS, DEFAULT_COOLDOWN_S, DEFAULT_MAX_PER_HOUR, DEFAULT_DISK_QUOTA_BYTES)


def test_every_error_of_a_pack_with_its_line(tmp_path: Path) -> None:
    found = errors_of(tmp_path, """
        rules:
          - name: ok_rule
            expr: mfu < 30%
          - name: bad_expr
            expr: mfu < (30%
          - name: bad_keys
            expr: mfu < 30%
            sevrity: warning
            for: 5 minutes
          - name: ok_rule
            expr: unknown_metric > 1
          - name: bad_capture
            expr: straggler_ratio > 1.1
            severity: fatal
            scope: node
            action:
              type: capture
              tool: perf
              targets: {slowest_rank: true, pp_stage: 1}
              steps: 0
              cooldown: soon
              max_per_hour: -1
              disk_quota: 0GiB
              color: red
          - expr: mfu < 1
          - name: multi
            expr: |
              mfu < 30%
              and comm_exposed >> 2
          - name: wrong_scope
            expr: gpu_temperature > 85C
          - name: bad labels
            expr: mfu < 1
            labels: {ok: 1, 9bad: x, nested: {a: 1}}
            annotations: {summary: s, sumary: t, description: [1]}
            action: {type: alert, tool: nsys}
    """)
    assert_errors(found, [
        (5, "bad_expr", "expr: unbalanced '(': expected ')', found end of expression (column 7)"),
        (8, "bad_keys", "unknown key 'sevrity'"),
        (9, "bad_keys", "for: not a duration: '5 minutes'"),
        (11, "ok_rule", "expr: unknown metric or alias 'unknown_metric'"),
        (10, "ok_rule", "duplicate rule name 'ok_rule' (first at line 2)"),
        (14, "bad_capture", "severity must be one of info, warning, critical, not 'fatal'"),
        (15, "bad_capture", "scope must be one of job, rank, gpu, not 'node'"),
        (18, "bad_capture", f"action.tool must be one of {', '.join(CAPTURE_TOOLS)}, not 'perf'"),
        (19, "bad_capture", "action.targets must name exactly one of"),
        (20, "bad_capture", "action.steps must be >= 1, not 0"),
        (21, "bad_capture", "action.cooldown: not a duration: 'soon'"),
        (22, "bad_capture", "action.max_per_hour must be >= 1, not -1"),
        (23, "bad_capture", "action.disk_quota must be positive"),
        (24, "bad_capture", "unknown key 'color'"),
        (25, "#6", "missing 'name'"),
        (29, "multi", "expr: unexpected '>' (column 19)"),
        (31, "wrong_scope", "perfd_gpu_temperature_celsius (labels gpu, node) is not available at scope job; "
                            "use scope: gpu"),
        (32, "#9", "name must be letters"),
        (34, "#9", "labels: invalid label name '9bad'"),
        (34, "#9", "labels.nested must be a string, an integer, a number or a boolean, not a mapping"),
        (35, "#9", "unknown key 'sumary'"),
        (35, "#9", "annotations.description must be a string, not a list"),
        (36, "#9", "unknown key 'tool'"),
    ])


def test_error_format_and_cli_output(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.yaml", """
        rules:
          - name: r1
            expr: mfu <
    """)
    out = io.StringIO()
    assert run_rules_check([str(p)], out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == f"{p}:3: rule r1: expr: unexpected end of expression (column 6)"
    assert lines[-1] == "1 error(s) in 1 file(s)"


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ("rules:\n  - name: a\n    expr: [unclosed\n", 4, "YAML:"),
    ("rules:\n  - name: a\n\texpr: x\n", 3, "YAML:"),
    ("", 1, "empty pack"),
    ("- a\n- b\n", 1, "pack must be a mapping"),
    ("rulez: []\n", 1, "unknown key 'rulez'"),
    ("version: 1\nrules: []\n", 1, "unknown key 'version'"),
    ("rules: {a: 1}\n", 1, "'rules' must be a list"),
    ("rules:\n  - just a string\n", 2, "a rule must be a mapping"),
    ("rules:\n  - name: a\n    name: b\n    expr: mfu < 1\n", 3, "duplicate key 'name' (first at line 2)"),
    ("rules:\n  - name: a\n", 2, "missing 'expr'"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action: {tool: nsys}\n", 4, "action needs a type"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action: {type: page}\n", 4, "action.type must be one of"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action: capture\n", 4, "action must be a mapping"),
    ("rules:\n  - name: a\n    expr: 42\n", 3, "expr must be a string, not 42"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    for: -5\n", 4, "duration must be >= 0"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action: {type: capture, steps: true}\n", 4,
     "action.steps must be an integer, not True"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action:\n      type: capture\n"
     "      targets: {slowest_rank: false}\n", 6, "slowest_rank must be true"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action:\n      type: capture\n"
     "      targets: {ranks: []}\n", 6, "non-empty list"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action:\n      type: capture\n"
     "      targets: {ranks: [1, -2]}\n", 6, "ranks are >= 0"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action:\n      type: capture\n"
     "      targets: {pp_stage: -1}\n", 6, "pp_stage must be >= 0"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action:\n      type: capture\n"
     "      targets: {host: n1}\n", 6, "unknown key 'host'"),
    ("rules:\n  - name: a\n    expr: mfu < 1\n    action: {type: capture, disk_quota: lots}\n", 4,
     "action.disk_quota: not a size"),
    ("rules:\n  - name: a\n    expr: rank_compute_ratio > 1.1\n    scope: gpu\n", 3, "use scope: rank"),
])
def test_single_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    errs = check_files([p])
    assert any(e.line == line and fragment in e.message for e in errs), [str(e) for e in errs]


def test_errors_across_files_and_unreadable_file(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "rules:\n  - name: x\n    expr: mfu <\n")
    b = write(tmp_path, "b.yaml", "rules:\n  - name: y\n    expr: mfu < 1\n    for: later\n")
    missing = tmp_path / "missing.yaml"
    errs = check_files([a, b, missing])
    assert [(Path(e.path).name, e.line) for e in errs] == [
        ("a.yaml", 3), ("b.yaml", 4), ("missing.yaml", None)]
    assert str(errs[2]).startswith(f"{missing}: cannot read")


def test_directory_expands_to_its_yaml_files(tmp_path: Path) -> None:
    write(tmp_path, "one.yaml", "rules:\n  - name: a\n    expr: mfu < 1\n")
    write(tmp_path, "two.yml", "rules:\n  - name: a\n    expr: mfu <\n")
    write(tmp_path, "notes.txt", "not a pack")
    errs = check_files([tmp_path])
    assert [Path(e.path).name for e in errs] == ["two.yml"]


def test_load_pack_raises_with_all_errors(tmp_path: Path) -> None:
    p = write(tmp_path, "p.yaml", "rules:\n  - name: a\n    expr: mfu <\n  - name: b\n    expr: x > 1\n")
    with pytest.raises(RulePackError) as info:
        load_pack(p)
    assert [e.line for e in info.value.errors] == [3, 5]


def test_parse_pack_from_text() -> None:
    pack, errors = parse_pack("rules: []\n", "inline.yaml")
    assert errors == [] and pack is not None and pack.rules == ()


def test_durations_and_sizes() -> None:
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300 and parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == 0.25 and parse_duration(0) == 0 and parse_duration("0") == 0
    assert parse_duration(90) == 90.0 and parse_duration("1d") == 86400
    for bad in ("", "5", "5 m", "m", "1h 30m", "-5m", "5min"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("500MB") == 500_000_000
    assert parse_bytes(1024) == 1024 and parse_bytes("1.5KiB") == 1536 and parse_bytes("10") == 10
    with pytest.raises(ValueError):
        parse_bytes("2 gigs")


# --- the default pack -------------------------------------------------------------------------
def test_default_pack_has_no_errors() -> None:
    path = ROOT / "rules" / "default.yaml"
    assert default_pack_path() == path
    assert check_files([path]) == []
    out = io.StringIO()
    assert run_rules_check([str(path)], out) == 0


def test_default_pack_encodes_the_playbook() -> None:
    pack = load_pack(ROOT / "rules" / "default.yaml")
    by = {r.name: r for r in pack.rules}
    mfu = by["mfu_severe"]
    assert mfu.expr.keys == ("perfd_job_mfu_ratio",) and mfu.for_s == 300
    assert isinstance(mfu.action, CaptureAction)
    assert mfu.action.tool == "kineto" and mfu.action.targets.slowest_rank and mfu.action.steps == 3
    comm = by["comm_exposed_high"].action
    assert isinstance(comm, CaptureAction) and comm.tool == "nsys"
    assert isinstance(by["pp_stage_idle_high"].action, CaptureAction)
    assert by["pp_stage_idle_high"].expr.evaluate({"perfd_job_pp_stage_idle_max_ratio": 0.16})
    assert by["data_loading_bottleneck"].action == AlertAction()
    assert by["data_loading_bottleneck"].annotations.recommendation
    strag = by["straggler_persistent"]
    assert strag.for_s == 300
    assert isinstance(strag.action, CaptureAction) and strag.action.targets.slowest_rank
    thr = by["gpu_throttling"]
    assert thr.scope == "gpu" and thr.action == AlertAction()
    assert thr.expr.evaluate({'perfd_gpu_throttle_active{reason="hw_power_brake"}': 1.0})
    assert not thr.expr.evaluate({'perfd_gpu_throttle_active{reason="sw_power_cap"}': 1.0})
    xid = by["gpu_xid_errors"]
    assert xid.severity == "critical" and xid.scope == "gpu"
    for r in pack.rules:
        a = r.annotations
        assert a.summary and a.description and a.recommendation, r.name
