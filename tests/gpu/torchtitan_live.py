"""On 1 GPU: a real torchtitan run (llama3 "debugmodel" from its own configs), live through
agent -> aggregator and offline from its log; perfd's MFU against torchtitan's.

    # here, with network; HAVE = `pip list --format freeze` of the GPU machine (what it holds
    # is left out: a few MiB remain); torch 2.11 there needs torchtitan 0.2.2 (0.3.0 needs newer)
    python3 tests/gpu/torchtitan_wheels.py .whl/titan --have HAVE --torchtitan 0.2.2
    # GPU machine, one call (carry .whl)
    python3 tests/gpu/torchtitan_live.py --install .whl/titan/part1
    python3 tests/gpu/torchtitan_live.py OUT_DIR

torchtitan is installed from the carried wheels (``pip install --no-index --no-deps --target``, one
part per call should the closure pass a call's 64 MiB) into ``.titan-site`` at the repository root
(ignored by git: it stays between calls on a warm machine), put on PYTHONPATH beside the machine's
own torch, whatever environment that is in; an import of
``torchtitan.train`` is checked first. Its wheel has no test assets, so the script
makes them: a byte-level BPE tokenizer (2,000 tokens, under debugmodel's 2,048) trained with
``tokenizers`` on generated text, and a local JSON-lines dataset (``--dataloader.dataset_path``).
Then ``perfd aggregator``, ``perfd launch --flight-recorder DIR --fr-timing -- torchrun ... -m
torchtitan.train`` (its llama3 debugmodel, ``titan_args``) and ``perfd agent --launch-manifest``
with the torchtitan collector on the launch's log (model shape and dtype in its config). Checks:

- live: the aggregator's job is a torchtitan job; perfd's throughput agrees with torchtitan's
  tflops on every steady step it checked (``tflops_check_n_disagree == 0``, 2%), and perfd's median
  MFU is within 2% of the median of torchtitan's own ``mfu`` over the same steps;
- offline: ``perfd analyze torchtitan`` on the same log gives the same agreement;
- the headline has no "None";
- the Flight Recorder dumps the agent asks for land in perfd's folder (``fr/fr_dump_0``), not in
  torchtitan's ``dump/comm_traces`` (perfd launch appends torchtitan's ``--comm.*`` flags).

Writes OUT_DIR/torchtitan_live.json and .md, and the recorded log (titan_llama3_debug.log and its
.times) for the collector's tests; exit 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.procs import ROOT, Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

JOB = "titan-debug"
STEPS = int(os.environ.get("TITAN_STEPS", "150"))
LOCAL_BATCH = int(os.environ.get("TITAN_LOCAL_BATCH", "32"))  # ~0.1 s steps: the line timing is µs
# llama3 debugmodel in torchtitan 0.3.0 (models/llama3/__init__.py: dim 256, 6 layers, 16 heads,
# vocab 2048, FFN compute_ffn_hidden_dim(256, multiple_of=256) = 768, SwiGLU), as perfd's ModelSpec.
MODEL = {
    "num_layers": 6,
    "hidden_size": 256,
    "ffn_hidden_size": 768,
    "num_attention_heads": 16,
    "kv_channels": 16,
    "padded_vocab_size": 2048,
    "swiglu": True,
}
ASSETS = r"""
import json, random, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
work = Path(sys.argv[1])
rng = random.Random(0)
syll = ["ka", "to", "ri", "mu", "sen", "da", "lo", "vi", "pe", "zu", "an", "or", "el", "ti", "ba"]
words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
lines = [" ".join(rng.choice(words) for _ in range(rng.randint(200, 600))) + "." for _ in range(4000)]
(work / "c4_test").mkdir(parents=True, exist_ok=True)
with open(work / "c4_test" / "data.json", "w") as f:
    for t in lines:
        f.write(json.dumps({"text": t}) + "\n")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<|begin_of_text|>", "<|end_of_text|>"]
trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=special,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(lines[:1000], trainer)
(work / "tokenizer").mkdir(parents=True, exist_ok=True)
tok.save(str(work / "tokenizer" / "tokenizer.json"))
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
          open(work / "tokenizer" / "tokenizer_config.json", "w"))
"""
_STEP = re.compile(r"step:\s*(\d+)\s.*tflops: ([0-9.,]+)\s.*mfu: ([0-9.]+)%")


def titan_steps(log: Path) -> dict[int, dict[str, float]]:
    """torchtitan's own tflops and MFU per step, from its log (colours stripped)."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _STEP.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m and "validate" not in line:
            out[int(m.group(1))] = {
                "tflops": float(m.group(2).replace(",", "")),
                "mfu": float(m.group(3)) / 100,
            }
    return out


def compare(
    rows: list[dict[str, Any]], titan: dict[int, dict[str, float]], summary: dict[str, Any], headline: str
) -> dict[str, Any]:
    steady = [
        r for r in rows if r.get("steady_state") and r.get("mfu") is not None and r["iteration"] in titan
    ]
    perfd = statistics.median(r["mfu"] for r in steady) if steady else None
    theirs = statistics.median(titan[r["iteration"]]["mfu"] for r in steady) if steady else None
    gaps = [
        abs(r["mfu"] - titan[r["iteration"]]["mfu"]) / titan[r["iteration"]]["mfu"]
        for r in steady
        if titan[r["iteration"]]["mfu"] > 0
    ]
    out: dict[str, Any] = {
        "n_steady_compared": len(steady),
        "perfd_median_mfu": perfd,
        "torchtitan_median_mfu": theirs,
        "median_rel_gap": abs(perfd - theirs) / theirs if perfd and theirs else None,
        "max_rel_gap_per_step": max(gaps) if gaps else None,
        "tflops_check_n": summary.get("tflops_check_n"),
        "tflops_check_n_disagree": summary.get("tflops_check_n_disagree"),
        "tflops_check_max_abs_gap": summary.get("tflops_check_max_abs_gap"),
        "headline": headline,
    }
    gap = out["median_rel_gap"]
    out["ok"] = bool(
        gap is not None
        and gap <= 0.02
        and (out["tflops_check_n"] or 0) > 0
        and out["tflops_check_n_disagree"] == 0
        and headline
        and "None" not in headline
    )
    return out


SITE = ROOT / ".titan-site"


def titan_args(version: tuple[int, ...], work: Path) -> list[str]:
    """torchtitan's command line for llama3 debugmodel: 0.3 names a config function (``--module
    --config``, log_freq 1 in it); 0.2 takes the model and dataset as ``--model.*``/``--training.*``
    flags and logs every 10 steps unless told."""
    tok, data, dump = work / "assets" / "tokenizer", work / "assets" / "c4_test", work / "dump"
    run = ["--training.steps", str(STEPS), "--training.local_batch_size", str(LOCAL_BATCH)]
    if version >= (0, 3):
        return [
            "--module", "llama3", "--config", "llama3_debugmodel", "--hf_assets_path", str(tok),
            "--dataloader.dataset_path", str(data), "--dump_folder", str(dump), *run,
        ]  # fmt: skip
    return [
        "--model.name", "llama3", "--model.flavor", "debugmodel", "--model.hf_assets_path", str(tok),
        "--training.dataset", "c4_test", "--training.dataset_path", str(data),
        "--job.dump_folder", str(dump), "--metrics.log_freq", "1", *run,
    ]  # fmt: skip


def install(part: Path) -> int:
    """Install one part of the carried wheels into SITE."""
    wheels = sorted(str(w) for w in part.glob("*.whl"))
    if not wheels:
        print(f"no wheels in {part}", file=sys.stderr)
        return 2
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--upgrade",
        "--target",
        str(SITE),
    ]
    return subprocess.run([*cmd, *wheels]).returncode


def run(out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"job": JOB, "steps": STEPS, "local_batch": LOCAL_BATCH, "model": MODEL}
    py = sys.executable
    env = run_env(SITE, NCCL_NVLS_ENABLE="0")
    procs = Procs(out, env)

    try:
        smoke = subprocess.run([py, "-c", "import torchtitan.train"], capture_output=True, text=True, env=env)
        if smoke.returncode:
            res["import_error"] = smoke.stderr[-2000:]
            raise RuntimeError(f"torchtitan does not import from {SITE}: run --install .whl/partN first")
        res["versions"] = subprocess.run(
            [py, "-c", "import torch, torchtitan; print(torch.__version__, torchtitan.__version__)"],
            capture_output=True,
            text=True,
            env=env,
        ).stdout.strip()
        titan_version = tuple(int(x) for x in res["versions"].split()[-1].split(".")[:2])
        work = out / "work"
        (work / "assets").mkdir(parents=True, exist_ok=True)
        (out / "assets.py").write_text(ASSETS)
        subprocess.run([py, str(out / "assets.py"), str(work / "assets")], check=True, env=env)
        (out / "model.yaml").write_text(json.dumps(MODEL))  # JSON is YAML
        (out / "rules.yaml").write_text("rules: []\n")
        grpc_port, _, url = start_aggregator(procs, "--rules", out / "rules.yaml")
        base = f"{url}/api"
        run_dir = out / "run"
        t0 = time.time()
        launch = procs.perfd(
            "launch",
            "launch",
            "--job",
            JOB,
            "--run-dir",
            str(run_dir),
            "--flight-recorder",
            str(out / "fr"),
            "--fr-timing",
            "--",
            py,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "1",
            "--master_port",
            "29551",
            "-m",
            "torchtitan.train",
            *titan_args(titan_version, work),
            cwd=work,
        )
        manifest = wait_manifest(run_dir / "launch.json", launch)
        log = run_dir / "output.log"
        (out / "agent.yaml").write_text(
            json.dumps(
                {
                    "batch_interval_s": 0.5,
                    "collectors": {
                        # path and line_times come from the launch manifest (a torchtitan command)
                        "torchtitan": {"dtype": "bf16", "model": MODEL}
                    },
                }
            )
        )
        start_agent(procs, grpc_port, manifest=manifest, config=out / "agent.yaml")
        while launch.poll() is None and time.time() - t0 < 540:
            time.sleep(2)
        res["job_exit"] = launch.poll()
        time.sleep(6)
        for name in ("output.log", "output.log.times"):
            if (run_dir / name).exists():
                (out / name.replace("output", "titan_llama3_debug")).write_bytes(
                    (run_dir / name).read_bytes()
                )
        # torchtitan points the Flight Recorder's dump file into its own dump folder unless told:
        # perfd launch appends --comm.* flags, so the agent's dump requests land in perfd's folder
        man = json.loads(manifest.read_text())
        res["fr"] = {
            "perfd_folder": sorted(p.name for p in (out / "fr").glob("fr_dump_*")),
            "torchtitan_comm_traces": sorted(p.name for p in (work / "dump").glob("comm_traces/*")),
            "launch_notes": [n for n in man.get("notes", []) if "torchtitan" in n],
            "agent_collectors": sorted(man.get("collectors", {})),
        }
        res["fr"]["ok"] = "fr_dump_0" in res["fr"]["perfd_folder"] and not res["fr"]["torchtitan_comm_traces"]
        titan = titan_steps(log)
        res["torchtitan_steps_logged"] = len(titan)
        summary = get_json(f"{base}/jobs/{JOB}/summary")
        rows = get_json(f"{base}/jobs/{JOB}/iterations?sources=0")["iterations"]
        (out / "aggregator_summary.json").write_text(json.dumps(summary, indent=1, default=str))
        job = summary.get("job") or {}
        res["live_job"] = {
            k: job.get(k)
            for k in (
                "framework",
                "framework_version",
                "layout",
                "flops_formula",
                "flops_per_iteration",
                "gpu",
            )
        }
        headline = ((summary.get("report") or {}).get("summary") or {}).get("headline") or ""
        res["live"] = compare(rows, titan, summary.get("summary") or {}, headline)
        res["live"]["ok"] = res["live"]["ok"] and job.get("framework") == "torchtitan"
        gpu = (job.get("gpu") or {}).get("name") or "NVIDIA H100 80GB HBM3"
        off = subprocess.run(
            [
                py,
                "-m",
                "perfd.app.cli",
                "analyze",
                "torchtitan",
                str(log),
                "--model",
                str(out / "model.yaml"),
                "--dtype",
                "bf16",
                "--gpu",
                gpu,
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
        res["offline_rc"] = off.returncode
        if off.returncode == 0:
            data = json.loads(off.stdout)
            (out / "offline_analysis.json").write_text(
                json.dumps({k: data[k] for k in ("job", "summary", "report", "parse")}, indent=1)
            )
            ohead = data["report"]["summary"]["headline"]
            res["offline"] = compare(data["iterations"], titan, data["summary"], ohead)
        else:
            res["offline"] = {"ok": False, "stderr": off.stderr[-2000:]}
        res["ok"] = bool(res["live"]["ok"] and res["offline"]["ok"] and res["fr"]["ok"])
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
        res["ok"] = False
    finally:
        procs.stop()
        res["logs"] = procs.tails(n=2000)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument(
        "--install",
        type=Path,
        metavar="PART",
        help="install one part of torchtitan_wheels.py's directory into .titan-site, then exit",
    )
    args = ap.parse_args()
    if args.install is not None:
        return install(args.install.resolve())
    if args.out is None:
        ap.error("OUT_DIR is required (or --install PART)")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    random.seed(0)
    res = run(out)
    (out / "torchtitan_live.json").write_text(json.dumps(res, indent=1, default=str))
    md = "\n".join(
        [
            "# torchtitan llama3 debugmodel, live and offline",
            "",
            f"Versions: {res.get('versions')}; job exit {res.get('job_exit')}; "
            f"{res.get('torchtitan_steps_logged')} step lines",
            "",
            f"Job: {res.get('live_job')}",
            "",
            f"Live: {res.get('live')}",
            "",
            f"Offline: {res.get('offline')}",
            "",
            f"Flight Recorder dumps: {res.get('fr')}",
            "",
            f"OK: {res.get('ok')}" + (f"; error {res.get('error')}" if res.get("error") else ""),
            "",
        ]
    )
    (out / "torchtitan_live.md").write_text(md)
    print(md)
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
