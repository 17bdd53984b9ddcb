"""Every offline answer perfd gives on the repository's recorded data, written to one folder: the
before/after check of a refactoring ("byte-identical offline outputs on the recorded logs and
captures"). Run it on two commits and diff the folders:

    python tools/offline_outputs.py /tmp/before        # on the old commit
    python tools/offline_outputs.py /tmp/after         # on the new one
    diff -r /tmp/before /tmp/after

Each command's stdout goes to <name>.out and its exit status to <name>.rc; stderr to <name>.err
(a refusal's message is an output too). Nothing is masked: a difference in wording shows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
D = ROOT / "tests" / "data"
MEG = D / "megatron"
CAP = D / "captures"

# (name, arguments to `perfd analyze`): the logs, the captures with their logs, the ncu exports.
RUNS: list[tuple[str, list[str]]] = []
for log in sorted(MEG.glob("*.log")) + sorted(MEG.glob("*.log.gz")):
    stem = log.name.split(".")[0]
    RUNS.append((f"megatron_{stem}", ["megatron", str(log), "--gpu", "NVIDIA H100 80GB HBM3", "--json",
                                      "--iterations", "all"]))
    RUNS.append((f"megatron_{stem}_text", ["megatron", str(log), "--gpu", "NVIDIA H100 80GB HBM3"]))
for d in sorted(CAP.glob("kineto_*_megatron")):
    for log in sorted(d.glob("*_megatron.log.gz")):
        # the A/B plans' captures are kept as xz (repository size), the others as gzip
        named = log.name.replace("_megatron.log.gz", "_rank0.json")
        trace = next((t for z in (".gz", ".xz") if (t := log.with_name(named + z)).exists()), None)
        if trace is not None:
            gpu = "NVIDIA H200" if "h200" in d.name else "NVIDIA H100 80GB HBM3"
            stem = f"{d.name}_{log.name.split('_megatron')[0]}"
            RUNS.append((stem, ["megatron", str(log), "--gpu", gpu, "--capture", str(trace), "--json"]))
            RUNS.append((f"{stem}_text", ["megatron", str(log), "--gpu", gpu, "--capture", str(trace)]))
loop = CAP / "loop_h100_nsys_kineto"
RUNS += [("trace_loop", ["trace", str(loop / "loop_kineto.json.gz"), "--json"]),
         ("trace_loop_text", ["trace", str(loop / "loop_kineto.json.gz")]),
         ("nsys_loop", ["nsys", str(loop / "loop_nsys.sqlite"), "--json"]),
         ("nsys_loop_text", ["nsys", str(loop / "loop_nsys.sqlite")])]
for csv in sorted((D / "ncu").glob("*details*.csv*")):
    RUNS.append((f"ncu_{csv.name.split('.')[0]}", ["ncu", str(csv), "--json"]))


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS:
        p = subprocess.run([sys.executable, "-m", "perfd.app.cli", "analyze", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        (out / f"{name}.out").write_text(p.stdout)
        (out / f"{name}.err").write_text(p.stderr)
        (out / f"{name}.rc").write_text(f"{p.returncode}\n")
        print(f"{name}: exit {p.returncode}, {len(p.stdout)} characters", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/offline_outputs.py OUT_DIR")
    sys.exit(main(Path(sys.argv[1])))
