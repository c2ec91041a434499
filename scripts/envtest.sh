#!/usr/bin/env bash
# Builds the binaries of the test control plane (tests/kubeapi.py), like controller-runtime's envtest:
# kube-apiserver, kube-controller-manager and kube-scheduler from k8s.io/kubernetes (module in
# tests/envtest/) and kwok (tests/envtest/kwok/), with the machine's Go and the Go module proxy, into
#     $CACHE/envtest/<k8s-version>/bin/        (CACHE defaults to ~/.cache/fleetmq; never in the repo)
# A binary that is already there is reused; a missing one is (re)built. etcd comes from Debian's
# etcd-server (scripts/system-deps.sh) and is linked into the same folder.
#
#   scripts/envtest.sh            build what is missing, print the bin folder
#   scripts/envtest.sh --path     only print the bin folder (builds nothing)
#   scripts/envtest.sh --check    exit 0 when everything is built, 1 when something is missing (builds nothing)
#   ENVTEST_COMPONENTS="kube-apiserver" scripts/envtest.sh   build only some (default: all four, plus
#                                                            kubectl when there is none on PATH)
#   ENVTEST_COMPONENTS="kubelet kube-proxy pause kubectl"    the real node's (tests/realnode.py): kubelet and
#       kube-proxy of the same release, the pod sandbox program (tests/envtest/pause) and a kubectl of the
#       release (the stand-in for the chart's kubectl image)
#   ENVTEST_COMPONENTS="... kubeadm"                        also kubeadm, for the kind node image
#       (scripts/kind.sh)
#
# Go's module and build caches are $CACHE/go/{mod,build}, shared by every Go build of the project (the
# standard library and common modules compile once for all of them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/tests/envtest"
K8S_VERSION="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$MOD/go.mod")"
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
DEST="$CACHE/envtest/$K8S_VERSION"
BIN="$DEST/bin"
COMPONENTS="${ENVTEST_COMPONENTS:-kube-apiserver kube-controller-manager kube-scheduler kwok}"
# the tests drive the cluster with kubectl: the machine's if it has one, else one of the same release
command -v kubectl >/dev/null || COMPONENTS+=" kubectl"

if [[ "${1:-}" == "--path" ]]; then
  echo "$BIN"
  exit 0
fi

if [[ "${1:-}" == "--check" ]]; then
  for c in $COMPONENTS; do [[ -x "$BIN/$c" ]] || exit 1; done
  exit 0
fi

mkdir -p "$BIN"
exec 9>"$DEST/.lock"
flock 9 # one build at a time per cache folder

if [[ ! -e "$BIN/etcd" ]]; then
  etcd_bin="${ETCD_BIN:-$(command -v etcd || true)}"
  if [[ -z "$etcd_bin" ]]; then
    echo "envtest: etcd not found: run scripts/system-deps.sh (Debian etcd-server) or set ETCD_BIN" >&2
    exit 1
  fi
  ln -sf "$etcd_bin" "$BIN/etcd"
fi

missing=()
for c in $COMPONENTS; do
  [[ -x "$BIN/$c" ]] || missing+=("$c")
done
if ((${#missing[@]} == 0)); then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { echo "envtest: go not found (needs Go >= 1.24)" >&2; exit 1; }
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
mkdir -p "$GOMODCACHE" "$GOCACHE"

# What hack/lib/version.sh stamps into a release build, so `kubectl version` shows the real version.
minor="${K8S_VERSION#v1.}"
minor="${minor%%.*}"
ver_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ver_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ver_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # build <module dir> <output> <package> <extra ldflags>
  local dir="$1" out="$2" pkg="$3" extra="$4" t0=$SECONDS
  echo "envtest: building $out ($pkg) ..." >&2
  (cd "$dir" && go build -ldflags="-s -w $extra" -o "$BIN/.$out.tmp" "$pkg")
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  echo "envtest: built $BIN/$out in $((SECONDS - t0))s" >&2
}

start=$SECONDS
for c in "${missing[@]}"; do
  case "$c" in
    kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet | kube-proxy | kubeadm)
      build "$MOD" "$c" "k8s.io/kubernetes/cmd/$c" "$ver_ldflags" ;;
    kwok)
      build "$MOD/kwok" kwok sigs.k8s.io/kwok/cmd/kwok "" ;;
    pause)
      build "$MOD" pause ./pause "" ;;
    *) echo "envtest: unknown component $c" >&2; exit 1 ;;
  esac
done
echo "envtest: $K8S_VERSION control plane ready in $BIN (built in $((SECONDS - start))s)" >&2
echo "$BIN"
