#!/usr/bin/env bash
# SLURM epilog for perfd (see prolog.sh for the slurm.conf lines). Runs as root on each node after
# the job. SLURM has already ended the job's processes, the agents included. If an agent's spool
# still holds batches the aggregator never acknowledged (last_seq > acked_seq in its state.json),
# the job's directory is moved to $PERFD_SLURM_DIR/unsent/ (nothing is deleted that was not
# delivered; a later `perfd agent --spool-dir DIR` sends it); otherwise it is removed.
# Always exits 0: a failing epilog drains the node.
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=/dev/null
[ -r "$here/perfd-slurm.env" ] && . "$here/perfd-slurm.env"
base="${PERFD_SLURM_DIR:-/var/lib/perfd/slurm}"
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
dir="$base/$SLURM_JOB_ID"
[ -d "$dir" ] || exit 0

unsent=0
for state in "$dir"/spool/state.json "$dir"/spool/*/state.json; do
  [ -r "$state" ] || continue
  if ! python3 - "$state" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(1 if int(s.get("last_seq", 0)) > int(s.get("acked_seq", 0)) else 0)
PYEOF
  then
    unsent=1
  fi
done
if [ "$unsent" = 1 ]; then
  mkdir -p "$base/unsent" && mv "$dir" "$base/unsent/$SLURM_JOB_ID" &&
    echo "perfd epilog: job $SLURM_JOB_ID left unsent batches: kept in $base/unsent/$SLURM_JOB_ID" >&2
else
  rm -rf "$dir"
fi
exit 0
