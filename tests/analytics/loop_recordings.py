"""The two published training loops recorded on one H200 (tests/data/loops: nanoGPT's train.py and
transformers' run_clm.py), read as the aggregator reads them: the step records and job info of the
aggregator's journal (``state.sqlite3.xz``), the job's world size as the aggregator infers it from the
ranks that report (perfd.aggregator.job_fold), the steps a capture touched marked as the aggregator
marks them, and the model each loop's hook was given (its ``model=``, as meta.json says) taken into the
job's spec through the hook's model record (perfd.hook.wire.KIND_MODEL), as a hook of this version
sends it (the recordings' hooks predate that record). The trace (``trace.json.xz``, the capture asked
for by hand) is the job's timeline, read once a session (tests/trace_cache.py).
"""

from __future__ import annotations

import dataclasses
import json
import lzma
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfd.aggregator.daemon import Aggregator, AggregatorConfig
from perfd.aggregator.durable import restore
from perfd.aggregator.job_fold import job_info_of, mark_disturbed
from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.run.run_result import RunAnalysis
from perfd.analytics.steps.flops import read_spec
from perfd.collectors.hook.model_record import take_model
from perfd.core.model import JobInfo, StepRecord
from perfd.hook import wire
from tests.trace_cache import cached, timeline_class

LOOPS = Path(__file__).resolve().parents[1] / "data" / "loops"
NANOGPT, HF = "nanogpt_h200", "hf_clm_h200"
GPU = "NVIDIA H200"
# The ``model=`` each loop's hook was constructed with (meta.json "script"): nanoGPT's as perfd's README
# shows (GPT-2 124M, its padded vocabulary), the Trainer's its LlamaConfig's dict with the block size
# (run_clm.py's --config_overrides on LlamaConfig() leave its default head_dim, 128, and the model is
# built with it: q_proj 768 -> 1536, 137.8M parameters; tests/analytics/test_hf_configs.py).
MODELS: dict[str, Mapping[str, object]] = {
    NANOGPT: {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "seq_length": 1024,
              "vocab_size": 50304},
    HF: {"model_type": "llama", "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
         "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 128,
         "max_position_embeddings": 1024, "vocab_size": 16000, "hidden_act": "silu",
         "tie_word_embeddings": False, "seq_length": 1024},
}


def meta(name: str) -> dict[str, Any]:
    return dict(json.loads((LOOPS / name / "meta.json").read_text()))


def journal(name: str) -> tuple[JobInfo, list[StepRecord]]:
    """The job's info (its hook's model record taken in) and its step records as the aggregator held
    them, the captured steps marked."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "state.sqlite3").write_bytes(lzma.decompress((LOOPS / name / "state.sqlite3.xz")
                                                                  .read_bytes()))
        agg = Aggregator(AggregatorConfig(grpc_port=0, http_port=0, rules_files=[], state_dir=tmp))
        assert agg.store is not None
        try:
            restore(agg, agg.store)
            st = agg.state
            (job,) = st.job_names()
            raw = st.step_records(job)
            info = job_info_of(st.job_info(job), raw, ())
            records = mark_disturbed(raw, st.capture_windows(job))
        finally:
            agg.store.close()
    spec = dataclasses.replace(info.spec)
    sent = wire.unpack_model(wire.pack_model(wire.model_msg(0, 1, read_spec(MODELS[name]).spec)))
    assert take_model(spec, sent) == []
    return dataclasses.replace(info, spec=spec), records


def analysis(name: str) -> RunAnalysis:
    """The job's analysis with the recorded trace as its timeline (3 steps, as the capture asked)."""
    trace = LOOPS / name / "trace.json.xz"
    info, records = cached("loop-journal", [LOOPS / name / "state.sqlite3.xz"], (name,),
                           lambda: journal(name))
    return analyze_run(info, records, GPU, timeline=timeline_class(str(trace), 3), live=False)


def raw_gaps(name: str) -> dict[str, float]:
    """An independent reading of the trace's idle, per complete step (json alone, none of perfd's
    code): the GPU's activities (kernels, copies, memsets) merged, each gap between them classed by
    where the host was: ``ahead`` where the next activity's launch call had returned before the gap
    began (the GPU's own switch), else ``behind``; ``behind_max`` the longest behind gap (a sync's),
    ``step_ms`` the complete steps' span over their number, ``busy`` the activities' time in them (their
    overlaps counted each: a bound, not the union), and ``steps`` the complete steps (between the first
    and the last ``Optimizer.step#`` mark, each step starting on the GPU where the first activity
    launched after its mark starts; a mark with none launched after it, at the window's end, starts
    none); ``fetch`` the host's time inside ``enumerate(DataLoader)`` ranges between the first and the
    last mark, per step."""
    def read() -> dict[str, float]:
        with lzma.open(LOOPS / name / "trace.json.xz", "rt") as f:
            events = json.load(f)["traceEvents"]
        gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in
                      ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
        calls = {e["args"]["correlation"]: (e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                 and "correlation" in e.get("args", {})}
        marks = sorted(e["ts"] for e in events if e.get("cat") == "user_annotation"
                       and str(e.get("name", "")).startswith("Optimizer.step#"))
        cuts = []
        for m in marks:
            after = [g["ts"] for g in gpu if calls.get(g["args"].get("correlation"), (-1.0, 0.0))[0] >= m]
            cuts += [min(after)] if after else []  # the window ends after the last mark's host call
        lo, hi = cuts[0], cuts[-1]
        fetch = sum(e["dur"] for e in events if e.get("ph") == "X" and marks[0] <= e["ts"] < marks[-1]
                    and str(e.get("name", "")).startswith("enumerate(DataLoader)")) / 1e3
        out = {"ahead": 0.0, "behind": 0.0, "behind_max": 0.0, "steps": float(len(cuts) - 1), "fetch": fetch,
               "step_ms": (hi - lo) / 1e3 / (len(cuts) - 1),
               "busy": sum(max(0.0, min(g["ts"] + g["dur"], hi) - max(g["ts"], lo)) for g in gpu) / 1e3}
        end = None
        for g in gpu:
            if end is not None and g["ts"] > end and lo <= end < hi:
                gap = (g["ts"] - end) / 1e3
                call = calls.get(g["args"].get("correlation"))
                if call is not None and call[1] <= end:
                    out["ahead"] += gap
                else:
                    out["behind"] += gap
                    out["behind_max"] = max(out["behind_max"], gap)
            end = max(end or 0.0, g["ts"] + g["dur"])
        n = out["steps"]
        return {k: (v / n if k in ("ahead", "behind", "busy", "fetch") else v) for k, v in out.items()}

    return cached("loop-raw-gaps", [LOOPS / name / "trace.json.xz"], (name, "fetch"), read)
