#!/usr/bin/env bash
# SLURM prolog for perfd. slurm.conf:
#   Prolog=/etc/perfd/slurm/prolog.sh
#   Epilog=/etc/perfd/slurm/epilog.sh
#   PrologFlags=Alloc          # run at allocation on every node, before the batch script
# Runs as root on each node of a job. Makes the job's node-local perfd directory (owned by the job's
# user: perfd-slurm-run's agent spools there, on local disk) and records what SLURM says about the
# job on this node in job.env: id, user, node list, partition, and the GPUs it was given
# (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES), so GPUs can be attributed to SLURM jobs after the fact.
# Settings: perfd-slurm.env beside this script (PERFD_SLURM_DIR, default /var/lib/perfd/slurm).
# A prolog that fails drains the node: this one reports problems on stderr and always exits 0.
here=$(dirname "$(readlink -f "$0")")
# shellcheck source=/dev/null
[ -r "$here/perfd-slurm.env" ] && . "$here/perfd-slurm.env"
base="${PERFD_SLURM_DIR:-/var/lib/perfd/slurm}"
[ -n "${SLURM_JOB_ID:-}" ] || { echo "perfd prolog: SLURM_JOB_ID is unset" >&2; exit 0; }
dir="$base/$SLURM_JOB_ID"
if ! mkdir -p "$dir/spool"; then
  echo "perfd prolog: cannot create $dir" >&2
  exit 0
fi
{
  echo "# written by the perfd prolog on $(hostname -s) at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  env | grep -E '^(SLURM_|SLURMD_NODENAME=|CUDA_VISIBLE_DEVICES=|GPU_DEVICE_ORDINAL=)' | sort
} >"$dir/job.env"
if [ -n "${SLURM_JOB_UID:-}" ]; then
  chown -R "$SLURM_JOB_UID:${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$dir" || true
fi
chmod 0750 "$dir" || true
exit 0
