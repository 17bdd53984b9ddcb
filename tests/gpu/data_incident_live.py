"""On 1 GPU: the data side of an incident, a finished job's advice and the job's device, live,
with the rank's GPU's NVML recorded for the CPU suite.

    python3 tests/gpu/data_incident_live.py OUT_DIR

The plain PyTorch loop of tests/gpu/plain_loop_live.py ("data": a decoder stack fed by a DataLoader
with 2 workers whose samples cost CPU; SLOW_AT s in, for SLOW_S s, they cost SLOW_X times as much),
started as ``python3 train.py`` under ``perfd launch`` with a real agent (``--nvml real``) and a real
aggregator holding the shipped rule pack (its ``incident_capture`` among them). Beside it,
``python -m perfd.collectors.nvml.record`` records the GPU's NVML stream at 0.5 s. After the job exits the
script reads the aggregator's summary, incidents, iterations and captures and checks
(OUT_DIR/data_incident.json; each check ``ok_*``):

- ok_cause: one incident over the slow stretch (its ends within 20 steps of the loop's own clock),
  its verdict ``data_wait`` and its cause "data loading took up to ...", with the rank's GPU placed
  and nothing missing (``verdict.missing`` empty): the real NVML samples of the rank's GPU do not
  make it "not explained";
- ok_marks: the summary's excluded range of that incident names it (``ref``) over the same
  iterations; no recommendation says "Check rank 0: its GPU";
- ok_finished: after the exit, the data-loading recommendation's detail names the rank's 2 worker
  processes ("its 2 child process(es)") and says "while running" — not "its 0 child process(es)";
- ok_device: the job block's ``device`` is "cuda", and the rule capture was asked of it (not skipped);
- ok_sizes: the summary under 40 KB, the iteration rows without ``sources``.

Kept for the CPU suite (copy into tests/data/hook/plain_loop_h100/): OUT_DIR/data_steps.json.gz (the
loop's own clock) and OUT_DIR/data_nvml.jsonl.gz (its GPU's NVML stream, the same run). Runs ~4 min.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's tests

from tests.gpu.plain_loop_live import RUN_S, SLOW_AT, SLOW_S, SLOW_X, TRAIN_DATA, truth_data
from tests.procs import Procs, get_json, run_env, start_agent, start_aggregator, wait_manifest

ROOT = Path(__file__).resolve().parents[2]
JOB = "plain-data"


def run(out: Path) -> dict[str, Any]:
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"job": JOB}
    env = run_env(drop=("RANK", "LOCAL_RANK", "WORLD_SIZE", "KINETO_USE_DAEMON"))
    procs = Procs(raw, env)
    own = raw / "own_steps.json"
    try:
        (raw / "train.py").write_text(TRAIN_DATA)
        grpc_port, _, url = start_aggregator(procs, "--rules", ROOT / "rules" / "default.yaml",
                                             "--rules-interval", "1")
        base = f"{url}/api"
        procs.start("nvml_record", [sys.executable, "-m", "perfd.collectors.nvml.record",
                                    str(raw / "nvml.jsonl"),
                                    "--duration", str(int(RUN_S + 200)), "--interval", "0.5",
                                    "--devices", "0"])
        run_dir = raw / "run"
        launch = procs.perfd("launch", "launch", "--job", JOB, "--run-dir", str(run_dir), "--",
                             sys.executable, str(raw / "train.py"), str(own),
                             str(RUN_S), str(SLOW_AT), str(SLOW_S), str(SLOW_X))
        manifest = wait_manifest(run_dir / "launch.json", launch)
        (raw / "agent.yaml").write_text(f"capture_dir: {raw / 'captures'}\nbatch_interval_s: 0.5\n")
        start_agent(procs, grpc_port, manifest=manifest, config=raw / "agent.yaml", nvml="real")
        t0 = time.time()
        polls = []
        while launch.poll() is None and time.time() - t0 < RUN_S + 150:
            try:
                s = get_json(f"{base}/jobs/{JOB}/summary")
                polls.append({"t": round(time.time() - t0, 1), "incidents": [
                    (i.get("first_iteration"), i.get("last_iteration"), i.get("open"), i.get("cause"))
                    for i in s.get("incidents") or []]})
            except Exception as exc:
                polls.append({"t": round(time.time() - t0, 1), "error": repr(exc)})
            time.sleep(5)
        res["job_exit"] = launch.poll()
        res["polls"] = polls
        time.sleep(10)  # the process gone and its teardown observed: the finished job's report
        raw_summary = get_json(f"{base}/jobs/{JOB}/summary")
        res["summary_bytes"] = len(json.dumps(raw_summary))
        res["summary"] = raw_summary
        res["incidents"] = get_json(f"{base}/jobs/{JOB}/incidents").get("incidents")
        its = get_json(f"{base}/jobs/{JOB}/iterations")
        res["iterations_bytes"] = len(json.dumps(its))
        res["row_keys"] = sorted({k for r in its.get("iterations") or [] for k in r})
        res["captures"] = get_json(f"{base}/captures").get("captures")
        if own.exists():
            res["own"] = json.loads(own.read_text())
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        procs.stop()
        for name in ("agent.out", "launch.out", "aggregator.out"):
            p = raw / name
            if p.exists():
                res[f"{name}_tail"] = p.read_text()[-2000:]
    return res


def check(res: dict[str, Any]) -> dict[str, Any]:
    t = truth_data(res["own"])
    s = res["summary"]
    incs = [i for i in res.get("incidents") or [] if (i.get("cost_s") or 0) > 1]
    over = [i for i in incs
            if i["last_iteration"] >= t["slow_first"] - 20 and i["first_iteration"] <= t["slow_last"] + 20]
    c: dict[str, Any] = {"truth": {k: t[k] for k in ("slow_first", "slow_last", "cost_s", "data_share")},
                         "incidents": [(i["first_iteration"], i["last_iteration"], i.get("cost_s"),
                                        i.get("cause"), (i.get("verdict") or {}).get("missing"))
                                       for i in incs]}
    inc = over[0] if len(over) == 1 else None
    c["ok_cause"] = bool(inc and inc["verdict"].get("cause") == "data_wait"
                         and inc["cause"].startswith("data loading took up to")
                         and inc["verdict"].get("missing") == []
                         and abs(inc["first_iteration"] - t["slow_first"]) <= 20
                         and abs(inc["last_iteration"] - t["slow_last"]) <= 20)
    recs = (s.get("report") or {}).get("recommendations") or []
    c["recommendations"] = [(r.get("finding_id"), r.get("action"), r.get("detail")) for r in recs[:4]]
    ranges = (s.get("summary") or {}).get("excluded") or []
    c["ok_marks"] = bool(inc and any(r.get("ref") == inc["id"] and r.get("first") == inc["first_iteration"]
                                     for r in ranges)
                         and not any(str(r.get("action")).startswith("Check rank 0: its GPU") for r in recs))
    data: dict[str, Any] = next((r for r in recs if r.get("finding_id") == "data-loading"
                                 or "data loading" in str(r.get("action")).lower()), {})
    detail = str(data.get("detail"))
    c["ok_finished"] = "its 2 child process(es)" in detail and "while running" in detail
    caps = [x for x in res.get("captures") or [] if str(x.get("origin", "")).startswith("rule:")]
    c["captures"] = [(x.get("origin"), x.get("status"), x.get("reason")) for x in caps]
    c["ok_device"] = (s.get("job") or {}).get("device") == "cuda" and all(x.get("status") != "skipped"
                                                                          for x in caps)
    c["ok_sizes"] = res["summary_bytes"] < 40_000 and "sources" not in res["row_keys"]
    c["sizes"] = {"summary": res["summary_bytes"], "iterations": res["iterations_bytes"]}
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = run(args.out)
    checks = check(res) if "own" in res and "summary" in res else {"error": res.get("error")}
    if "own" in res:
        with gzip.open(args.out / "data_steps.json.gz", "wt") as f:
            json.dump(res.pop("own"), f)
    rec = args.out / "raw" / "nvml.jsonl"
    if rec.exists():
        with rec.open("rb") as src, gzip.open(args.out / "data_nvml.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    (args.out / "data_incident.json").write_text(json.dumps({"checks": checks, "result": res}, indent=1,
                                                            default=str))
    print(json.dumps(checks, default=str, indent=1), flush=True)
    return 0 if checks and all(v for k, v in checks.items() if k.startswith("ok_")) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
