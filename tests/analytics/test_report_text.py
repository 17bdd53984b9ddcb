"""Text fit to read: no "None" in any headline or report of every recorded Megatron-LM log, the
one-rank sentence says what it means, and no code in perfd/ decides by matching its own sentences."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pytest

from perfd.app.commands.analyze import analyze_megatron_file
from perfd.report.incident_text import cause_line
from perfd.report.render import render_text
from perfd.report.training_report import analysis_json, build_report

ROOT = Path(__file__).resolve().parents[2]
LOGS = sorted([*ROOT.glob("tests/data/**/*.log"), *ROOT.glob("tests/data/**/*.log.gz"),
               *ROOT.glob("perfd/collectors/megatron/tests/data/*.log"),
               *ROOT.glob("perfd/app/demo/data/*.log")])


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_no_none_in_any_headline_or_report(log: Path, tmp_path: Path) -> None:
    path = log
    if log.suffix == ".gz":  # analyze_megatron_file reads .gz too; a copy keeps the name plain
        path = tmp_path / log.stem
        with gzip.open(log, "rb") as src, path.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    for gpu in ("NVIDIA H200", None):
        _, analysis = analyze_megatron_file(str(path), gpu=gpu)
        report = build_report(analysis)
        assert "None" not in report.summary.headline, report.summary.headline
        text = render_text(report)
        assert not re.search(r"\bNone\b", text), [ln for ln in text.splitlines() if "None" in ln]
        doc = analysis_json(analysis)
        for inc in doc["incidents"]:
            assert "None" not in inc["cause"]


def test_a_one_rank_job_says_its_only_rank_not_a_missing_flag(tmp_path: Path) -> None:
    log = tmp_path / "dp1.log"
    with gzip.open(ROOT / "tests/data/incidents/cotenant_h100/megatron_dp1.log.gz", "rb") as src:
        log.write_bytes(src.read())
    _, analysis = analyze_megatron_file(str(log), gpu="NVIDIA H100 80GB HBM3")
    (inc,) = analysis.incidents
    assert inc.ranks == [0] and inc.single_rank
    assert "the job's only rank (0)" in cause_line(inc)
    assert "--timing-log-option all" not in cause_line(inc) and "names a rank" not in cause_line(inc)


# Deciding by a sentence perfd wrote: `"... " in obs`, `in o for o in ...observations`, `in reason`.
_TEXT_MATCH = re.compile(r"""["'][^"'\n]{6,}["']\s+(not\s+)?in\s+"""
                         r"""(obs|o|cause|reason|observation|title|hint|finding)\b""")


def test_no_code_decides_by_matching_its_own_sentences() -> None:
    hits = []
    for p in (ROOT / "perfd").rglob("*.py"):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if _TEXT_MATCH.search(line) or re.search(r"in\s+\w+\.observations", line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)
