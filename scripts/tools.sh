#!/usr/bin/env bash
# Installs the pinned command-line tools the chart tests and the e2e use, built with the machine's Go from
# the Go module proxy into a cache outside the repo, and prints their paths:
#     $CACHE/tools/<tool>-<version>/<tool>     (CACHE defaults to ~/.cache/fleetmq)
# A tool already there is reused; a missing one is (re)built. Bump a version here to get a new build.
#
#   scripts/tools.sh              helm
#   scripts/tools.sh helm kind    the ones named (helm, kind; coredns and metrics-server: the real node's DNS
#                                 and resource metrics, tests/realnode.py)
#   scripts/tools.sh --path TOOL  only print where TOOL is (or would be) installed; builds nothing
set -euo pipefail
HELM_VERSION=v3.18.6 # client-go v0.33: Kubernetes 1.33, as the test control plane (tests/envtest/go.mod)
HELM_K8S_MINOR=33
KIND_VERSION=v0.30.0
COREDNS_VERSION=v1.12.0 # the CoreDNS of Kubernetes 1.33 (kubeadm's constants), as the test control plane
METRICS_SERVER_VERSION=v0.8.0 # client-go v0.33, as the test control plane
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
TOOLS="$CACHE/tools"

module() {
  case "$1" in
    helm) echo "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
    kind) echo "sigs.k8s.io/kind@$KIND_VERSION" ;;
    coredns) echo "github.com/coredns/coredns@$COREDNS_VERSION" ;;
    metrics-server) echo "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION" ;;
    *) echo "tools: unknown tool $1 (helm, kind, coredns, metrics-server)" >&2; return 1 ;;
  esac
}
dir() { local m; m="$(module "$1")"; echo "$TOOLS/$1-${m##*@}"; }
ldflags() { # what their release builds stamp, so `helm version` / `kind version` tell the truth
  case "$1" in
    helm) # and the Kubernetes version `helm template` and `helm lint` assume (that of its client-go)
      local v="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
      v+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
      for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
        v+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_K8S_MINOR"
      done
      echo "$v" ;;
    kind | coredns | metrics-server) echo "" ;;
  esac
}

if [[ "${1:-}" == "--path" ]]; then
  echo "$(dir "${2:?usage: tools.sh --path TOOL}")/${2}"
  exit 0
fi
(($#)) || set -- helm

mkdir -p "$TOOLS"
exec 9>"$TOOLS/.lock"
flock 9 # one build at a time per cache folder
for tool in "$@"; do
  mod="$(module "$tool")"
  dest="$(dir "$tool")"
  if [[ -x "$dest/$tool" ]]; then
    echo "$dest/$tool"
    continue
  fi
  command -v go >/dev/null || { echo "tools: go not found (needs Go >= 1.24 to build $mod)" >&2; exit 1; }
  echo "tools: building $mod ..." >&2
  t0=$SECONDS
  mkdir -p "$dest"
  GOBIN="$dest" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local CGO_ENABLED=0 \
    GOFLAGS="-buildvcs=false -trimpath" go install -ldflags="-s -w $(ldflags "$tool")" "$mod"
  echo "tools: built $dest/$tool in $((SECONDS - t0))s" >&2
  echo "$dest/$tool"
done
