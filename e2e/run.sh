#!/usr/bin/env bash
# The fleetmq user flow end to end (e2e/), `make e2e`: the images built (scripts/image.sh), then on
#   E2E_CLUSTER=real (default)  the test control plane with a real node (tests/realnode.py): containerd,
#                               kubelet, kube-proxy, CoreDNS; needs root and Linux (packages are installed)
#   E2E_CLUSTER=kind            a kind cluster (scripts/kind.sh): the machine's Docker engine, else Debian's
#                               dockerd started for the run (needs root); the node image built here, no
#                               registry needed
#   E2E_CLUSTER=existing        the cluster of `make dev-cluster NODE=real`, left running (for test work)
# Builds what it needs into the cache (control plane, kubelet, kube-proxy, CoreDNS, helm, cert-manager, kind)
# and says exactly what is missing otherwise, with exit status 2: nothing is skipped and nothing passes
# that did not run.
#
#   e2e/run.sh [pytest args]      E2E_KEEP=1 keeps the cluster afterwards
#   E2E_PREPARE=1 e2e/run.sh      only build and install what the run needs, then exit (.ci/run does this in
#                                 the background while `make test` runs)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CACHE="${CACHE:-$HOME/.cache/fleetmq}"
export E2E_CLUSTER="${E2E_CLUSTER:-real}"
PY="$ROOT/.venv/bin/python"
t0=$SECONDS

fail_missing() {
  echo "e2e: NOT RUN on $E2E_CLUSTER, missing:" >&2
  printf '  - %s\n' "$@" >&2
  exit 2
}

missing=()
[[ -x "$PY" ]] || missing+=("the project venv: run \`make deps\`")
command -v go >/dev/null || missing+=("go (>= 1.24): builds the control plane, the node's kubelet and kube-proxy, helm")
case "$E2E_CLUSTER" in
  real | existing)
    if [[ "$(uname -s)" != Linux ]]; then
      missing+=("Linux: the real node runs Linux containers on this machine's kernel")
    elif [[ "$(id -u)" != 0 ]]; then
      missing+=("root: the real node makes network and mount namespaces, cgroups and mounts (run as root)")
    elif command -v apt-get >/dev/null; then
      bash "$ROOT/scripts/system-deps.sh" node
      bash "$ROOT/scripts/system-deps.sh" image
    fi
    if ((${#missing[@]} == 0)); then
      mapfile -t node_missing < <(cd "$ROOT" && "$PY" -c 'from tests import realnode; print("\n".join(realnode.preflight()))')
      for m in "${node_missing[@]}"; do [[ -n "$m" ]] && missing+=("$m"); done
    fi
    ;;
  kind)
    if [[ "$(uname -s)" != Linux ]]; then
      missing+=("Linux: the kind node image is built here from Linux binaries")
    elif err="$(docker info --format '{{.ServerVersion}}' 2>&1 >/dev/null)"; then
      : # the machine's engine (scripts/kind.sh uses it)
    elif [[ "$(id -u)" != 0 ]]; then
      missing+=("a running Docker engine, or root to start Debian's dockerd: \`docker info\` says: ${err//$'\n'/ }")
    elif command -v apt-get >/dev/null; then
      bash "$ROOT/scripts/system-deps.sh" kind
    fi
    command -v docker >/dev/null || missing+=("docker: the Docker CLI is not on PATH")
    ;;
  *) missing+=("E2E_CLUSTER=$E2E_CLUSTER is none of real, kind, existing") ;;
esac
((${#missing[@]} == 0)) || fail_missing "${missing[@]}"

# the images (the project's, and the third-party ones the chart runs: pulled, else local stand-ins), saved for
# the node's containerd or `kind load`; built in the background while Go builds (one is mostly network and
# disk, the other CPU)
archives="$CACHE/images/archives"
mkdir -p "$CACHE/images"
targets=(broker standins)
# (then the previous release's, e2e/previous.sh: the upgrade test starts from it)
{
  IMAGE_SAVE="$archives" bash "$ROOT/scripts/image.sh" "${targets[@]}" >"$CACHE/images/e2e-archives.txt" &&
    bash "$ROOT/e2e/previous.sh" >"$CACHE/images/e2e-previous.txt"
} 2>"$CACHE/images/e2e-image.log" &
image_pid=$!
trap 'kill "$image_pid" 2>/dev/null; wait "$image_pid" 2>/dev/null' EXIT # a failed Go build stops it too

# the control plane (and the node's kubelet, kube-proxy, pause program, kubectl), CoreDNS, metrics-server,
# helm; on kind what its node image needs (kubeadm, etcd 3.5) and kind
if [[ "$E2E_CLUSTER" != kind ]]; then
  bash "$ROOT/scripts/envtest.sh" >/dev/null
  ENVTEST_COMPONENTS="kubelet kube-proxy pause kubectl" bash "$ROOT/scripts/envtest.sh" >/dev/null
  bash "$ROOT/scripts/tools.sh" coredns metrics-server >/dev/null
else
  bash "$ROOT/scripts/kind.sh" build >/dev/null
fi
bash "$ROOT/scripts/certmanager.sh" >/dev/null # (the e2e installs cert-manager: e2e/certmanager.py)
FLEETMQ_HELM="$(bash "$ROOT/scripts/tools.sh" helm)"
export FLEETMQ_HELM
kubectl="$(bash "$ROOT/scripts/envtest.sh" --path)/kubectl"
[[ -x "$kubectl" ]] || kubectl="$(command -v kubectl || true)"
[[ -x "$kubectl" ]] || fail_missing "kubectl: not built by \`make envtest\` and not on PATH"
export FLEETMQ_KUBECTL="$kubectl"

status=0
wait "$image_pid" || status=$?
trap - EXIT
cat "$CACHE/images/e2e-image.log" >&2
((status == 0)) || { echo "e2e: building the images failed (exit $status)" >&2; exit 1; }
mapfile -t saved <"$CACHE/images/e2e-archives.txt"
mapfile -t previous <"$CACHE/images/e2e-previous.txt" # its tree, its image's archive
export FLEETMQ_PREVIOUS_DIR="${previous[0]}"
saved+=("${previous[1]}")
saved+=("$(cd "$ROOT" && "$PY" -m e2e.certmanager "$archives")")
FLEETMQ_IMAGE_ARCHIVES="$(IFS=:; echo "${saved[*]}")"
export FLEETMQ_IMAGE_ARCHIVES
echo "e2e: tools and images ready in $((SECONDS - t0))s" >&2
[[ -z "${E2E_PREPARE:-}" ]] || exit 0

cd "$ROOT"
# -rP: what passing tests print (failover counts, timings) stays in the log
pytest=("$PY" -m pytest -p no:cacheprovider -v -rP --durations=0 --timeout=2400 e2e "$@")
[[ "$E2E_CLUSTER" == kind ]] || exec "${pytest[@]}"

# kind: its engine (a private dockerd, when the machine has none) runs from `up` to `down`, one run at a
# time per cache folder; down runs however this script ends, unless E2E_KEEP keeps the cluster
mkdir -p "$CACHE/kind"
exec 8>"$CACHE/kind/.lock"
flock -n 8 || { echo "e2e: another kind run uses $CACHE/kind" >&2; exit 1; }
if [[ -z "${E2E_KEEP:-}" ]]; then
  trap 'bash "$ROOT/scripts/kind.sh" down' EXIT
  trap 'exit 143' TERM INT
fi
t1=$SECONDS
exports="$(bash "$ROOT/scripts/kind.sh" up)"
eval "$exports"
echo "e2e: kind engine and node image ready in $((SECONDS - t1))s" >&2
status=0
"${pytest[@]}" || status=$?
[[ -z "${E2E_KEEP:-}" ]] || echo "E2E_KEEP: $exports; stop it all: CACHE=$CACHE scripts/kind.sh down" >&2
exit "$status"
