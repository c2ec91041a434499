#!/usr/bin/env bash
# The fleetmq user flow end to end on a kind cluster (e2e/test_e2e.py); `make e2e` runs it. Needs a running
# Docker engine; kind and helm are built into the tools cache (scripts/tools.sh), kubectl is the machine's or
# the one `make envtest` built. Where something is missing it says what and exits 2: nothing is skipped
# silently and nothing passes that did not run.
#
#   e2e/run.sh [pytest args]      E2E_KEEP=1 keeps the cluster (kind delete cluster --name fleetmq-e2e)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CACHE="${CACHE:-$HOME/.cache/fleetmq}"
PY="$ROOT/.venv/bin/python"

missing=()
if ! command -v docker >/dev/null; then
  missing+=("docker: the Docker CLI is not on PATH")
elif ! err="$(docker info --format '{{.ServerVersion}}' 2>&1 >/dev/null)"; then
  missing+=("a running Docker engine: \`docker info\` says: ${err//$'\n'/ }")
fi
command -v go >/dev/null || missing+=("go: needed to build kind and helm (scripts/tools.sh)")
kubectl="$(command -v kubectl || true)"
[[ -n "$kubectl" ]] || kubectl="$(CACHE="$CACHE" bash "$ROOT/scripts/envtest.sh" --path)/kubectl"
[[ -x "$kubectl" ]] || missing+=("kubectl: not on PATH and not built by \`make envtest\`")
[[ -x "$PY" ]] || missing+=("the project venv: run \`make deps\`")
if ((${#missing[@]})); then
  echo "e2e: NOT RUN, missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 2
fi

tools="$(bash "$ROOT/scripts/tools.sh" helm kind)"
export FLEETMQ_HELM="$(sed -n 1p <<<"$tools")" FLEETMQ_KIND="$(sed -n 2p <<<"$tools")" FLEETMQ_KUBECTL="$kubectl"
cd "$ROOT"
exec "$PY" -m pytest -p no:cacheprovider -v --timeout=2400 e2e "$@"
