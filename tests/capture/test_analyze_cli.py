"""`perfd analyze nsys|trace FILE --json`: the CLI gives the same numbers as the library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfd.app.cli import main
from perfd.capture.nsys_sqlite import analyze_nsys, direct_sql_check
from tests.capture.test_capture_nsys import build_capture


def test_analyze_nsys_json_matches_the_library_and_sql(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "cap.sqlite"
    build_capture(db)
    assert main(["analyze", "nsys", str(db), "--json", "--check-sql"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"] == json.loads(json.dumps(analyze_nsys(db).to_json()["devices"], default=str))
    sql: dict[Any, Any] = direct_sql_check(db)["devices"]  # type: ignore[assignment]
    for d in out["devices"]:
        ref = sql[d["device"]] if d["device"] in sql else sql[str(d["device"])]
        assert abs(d["busy_ms"] - ref["busy_union_ms"]) <= 0.01 * max(ref["busy_union_ms"], 1e-9)
    assert main(["analyze", "nsys", str(db)]) == 0
    assert "device" in capsys.readouterr().out


def test_analyze_trace_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 100, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 50, "dur": 100, "pid": 0,
         "tid": 8, "args": {"device": 0, "stream": 8}}]}))
    assert main(["analyze", "trace", str(trace), "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["devices"]
    assert d["busy_ms"] == pytest.approx(0.15) and d["comm_exposed_ms"] == pytest.approx(0.05)
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["analyze", "trace", str(tmp_path / "bad.json")]) == 1
    assert main(["analyze", "nsys", str(tmp_path / "missing.sqlite")]) == 2
