"""English only where it is shown: the sentences perfd/report declares for the analytics' codes
(perfd.report.provenance_text: metric sources, absence reasons, caveats, straggler notes, a row's
exclusion; the JSON legend's exclusion kinds, perfd.report.row_json; an incident's sentences, its line and
its action, perfd.report.incident_text and incident_findings) are in no analytics source again. Checked on
the source (AST, no import): every literal part of each template that reads as words is looked for in
every string constant of perfd/analytics. The serving figures' sources and reasons (MetricValue), a peak's
reason, the evidence's source, a rank snapshot's observations, where the training dtype comes from and the
FLOPs count's notes are codes too: their sentences are TEMPLATE's and incident_text's (so the checks above
catch them spelled in analytics again), and the typed values that carry them hold no text (checked on
their annotations: a field typed ``str`` there again is the English back)."""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import re
import string
import typing
from pathlib import Path

from perfd.report.provenance_text import TEMPLATE
from perfd.report.row_json import EXCLUSION_TEXT

ROOT = Path(__file__).resolve().parents[1]
WORDS = re.compile(r"[A-Za-z][A-Za-z-]+")
MIN_WORDS = 3  # a shorter fragment ("step time", "unknown") is no sentence: it may be said anywhere
# Names of quantities and a phrase the analytics' docs and notes use too (the serving spec's docstrings,
# a FLOPs note, a field's name): no sentence of a code.
NAMED_ELSEWHERE = {"KV bytes per token", "FLOPs per token", "KV heads replicated",
                   "observations in the window", "is not positive", "moe_layer_freq"}


def _fragments(template: str, least: int = MIN_WORDS) -> list[str]:
    """The template's literal runs between its fields that hold at least ``least`` words."""
    parts = [lit.strip(" :;,()") for lit, _, _, _ in string.Formatter().parse(template)]
    return [p for p in parts if len(WORDS.findall(p)) >= least]


def _strings(path: Path) -> list[str]:
    """Every string constant of a module: docstrings, f-strings' literal parts, concatenations."""
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _found(fragments: dict[str, str], files: list[Path]) -> list[str]:
    out = []
    for f in files:
        for s in _strings(f):
            out += [f"{f.name}: {code} {frag!r}" for frag, code in fragments.items() if frag in s]
    return out


def test_no_analytics_module_words_a_code_again() -> None:
    fragments = {frag: c.name for c, t in TEMPLATE.items() for frag in _fragments(t)
                 if frag not in NAMED_ELSEWHERE}
    fragments |= {frag: f"Exclusion.{k.name}" for k, t in EXCLUSION_TEXT.items() for frag in _fragments(t)}
    assert len(fragments) > 100  # the check looks for real sentences (the serving ones among them)
    assert "no speculative decoding ('accept len') logged" in fragments  # a serving reason
    assert "not in the bandwidth table; give the peak bandwidth in config" in fragments  # a peak's reason
    assert "moe_ffn_hidden_size unset: Megatron uses ffn_hidden_size" in fragments  # a FLOPs note
    assert "arguments: neither bf16 nor fp16" in fragments  # where the dtype comes from
    files = sorted((ROOT / "perfd" / "analytics").rglob("*.py"))
    assert files
    found = _found(fragments, files)
    assert not found, found


# The modules that word incidents and the MFU grades and finding: their sentences are
# f-strings and literals, not a table, cut by their fields into pieces; a piece is a sentence from
# INCIDENT_WORDS words ("of the step", "in steady state" are said of other things too).
INCIDENT_TEXT = ("incident_text.py", "incident_findings.py", "grade_text.py")
INCIDENT_WORDS = 5
# Pieces analytics says of something else, in its own words: the docs of a threshold and of the steady
# state (thresholds.py, steady.py).
SAID_ELSEWHERE = {"× the steady time per step", "the rank waited for a CPU"}


def _said(path: Path) -> list[str]:
    """A module's literal sentences: its string constants but its docstrings (which may name what
    analytics says of itself), each cut into fragments as a template is."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [frag for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs
            for frag in _fragments(n.value.replace("{", "{{").replace("}", "}}"), INCIDENT_WORDS)]


def test_no_analytics_module_words_an_incident_again() -> None:
    fragments = {frag: name for name in INCIDENT_TEXT for frag in _said(ROOT / "perfd" / "report" / name)
                 if frag not in SAID_ELSEWHERE}
    assert len(fragments) > 40  # the check looks for real sentences
    assert "MFU < 30%: severe (usually communication or data loading" in fragments  # a grade's (grade_text)
    assert "the step budget shows where the time goes —" in fragments  # a grade explained
    assert "'s digest holds no MFU (its GPU or its model FLOPs were unknown when its records were digested" \
        in fragments  # the MFU finding's
    found = _found(fragments, sorted((ROOT / "perfd" / "analytics").rglob("*.py")))
    assert not found, found


def test_the_check_finds_a_sentence_said_in_a_module(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('def why(n):\n'
                     '    return f"no {n} timers present, " "forward-backward timer is zero"\n')
    fragments = {frag: c.name for c, t in TEMPLATE.items() for frag in _fragments(t)}
    assert [x.split(": ", 1)[1] for x in _found(fragments, [probe])] == [
        "FB_ZERO 'forward-backward timer is zero'"]
    # and an incident's sentence, as the incident used to word itself in analytics (detect.py)
    probe.write_text('def cause(inc):\n'
                     '    return f"the straggler detector named rank {inc.rank} the slowest"\n')
    said = {frag: name for name in INCIDENT_TEXT for frag in _said(ROOT / "perfd" / "report" / name)}
    assert [x.split(": ", 1)[1] for x in _found(said, [probe])] == [
        "incident_text.py 'the straggler detector named rank'"]


def _text_in(hint: object) -> bool:
    """Whether a type annotation can hold text: ``str`` itself, or inside a union, a tuple or a
    mapping's values (a mapping keyed by names holds names, not sentences)."""
    if hint is str:
        return True
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (dict, collections.abc.Mapping):
        args = args[1:]
    return any(_text_in(a) for a in args)


def test_the_typed_values_hold_codes_not_sentences() -> None:
    """Each value that used to carry a sentence: the fields that may hold text are names and data only
    (a GPU's name, a dtype, the kept observations read back from the state store), never the source, a
    reason or the observations made now."""
    from perfd.analytics.incidents.incident_evidence import IncidentEvidence, RankSnapshot
    from perfd.analytics.run.run_summary import JobFlops, JobGpu
    from perfd.analytics.serving.histogram import Quantile
    from perfd.analytics.serving.serving_findings import ServingFinding
    from perfd.analytics.serving.spec import MetricValue, Peaks
    from perfd.analytics.steps.flops import FlopsResult
    from perfd.analytics.steps.gpus import BandwidthResult, PeakResult

    allowed: dict[type, set[str]] = {
        MetricValue: set(),  # (a) a serving figure: its source and reason are codes
        Quantile: set(),
        Peaks: set(),
        PeakResult: {"dtype", "gpu_model"},  # (b) a peak's reason is a code
        BandwidthResult: {"gpu_model"},
        JobGpu: {"name", "model", "dtype"},  # (e) where the dtype comes from is a code
        FlopsResult: {"formula", "missing"},  # (f) its notes are codes (its formula a name)
        JobFlops: {"formula", "source", "missing"},
        RankSnapshot: {"node", "gpu", "throttle_reasons", "written"},  # (c) its observations: GpuSeen
        IncidentEvidence: {"inside_incident"},  # (d) its source: EvidenceSource
        # a serving finding's words are made from its facts (perfd.report.serving_text); what it quotes of a
        # figure is a code
        ServingFinding: {f.name for f in dataclasses.fields(ServingFinding)} - {"span", "cited", "quotes",
                                                                              "facts"},
    }
    for cls, names in allowed.items():
        hints = typing.get_type_hints(cls)
        texts = {f.name for f in dataclasses.fields(cls) if _text_in(hints[f.name])}
        assert texts <= names, (cls.__name__, texts - names)


def test_the_type_check_sees_text_in_a_field(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Old:
        observations: tuple[str, ...]
        source: str | None = None
        notes: dict[int, str] | None = None
        numbers: dict[str, float] | None = None

    hints = typing.get_type_hints(Old)
    assert [n for n in ("observations", "source", "notes", "numbers") if _text_in(hints[n])] == [
        "observations", "source", "notes"]
    assert not _text_in(typing.get_type_hints(test_the_type_check_sees_text_in_a_field)["return"])
