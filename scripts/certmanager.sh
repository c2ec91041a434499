#!/usr/bin/env bash
# Builds the real cert-manager controller for the tests: tests/certmanager/main.go, a small main over the
# controllers of github.com/cert-manager/cert-manager's pkg/controller (version pinned in
# tests/certmanager/go.mod; cert-manager's own cmd/controller module is not on the Go module proxy), with the
# machine's Go and the Go module proxy, into
#     $CACHE/cert-manager/<version>/bin/cert-manager-controller   (CACHE defaults to ~/.cache/fleetmq;
#                                                                 never in the repo)
# and copies that version's CRDs of Certificate, CertificateRequest, Issuer and ClusterIssuer (not ACME's
# Order and Challenge: none of the controllers built here watches them) from the module's deploy/crds/ into
#     $CACHE/cert-manager/<version>/crds/                         (`kubectl apply -f` that folder)
# A binary or CRD folder that is already there is reused; a missing one is (re)made.
# Runs only the certificates, certificaterequests (approver, CA, SelfSigned) and issuers/clusterissuers
# controllers: no webhook (so no defaulting or validation: give every field), no cainjector, no ACME.
#
#   scripts/certmanager.sh            build what is missing, print the bin folder
#   scripts/certmanager.sh --path     only print the bin folder (builds nothing; CRDs are in ../crds)
#   scripts/certmanager.sh --check    exit 0 when the binary and CRDs are there, 1 otherwise (builds nothing)
#
#   cert-manager-controller --kubeconfig PATH --cluster-resource-namespace NS [-v=4]
#       (also --namespace NS, --workers N, --controllers a,b,c, --master URL; no leader election)
#
# Go's module and build caches are $CACHE/go/{mod,build}, shared by every Go build of the project.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/tests/certmanager"
CM_MODULE=github.com/cert-manager/cert-manager
CM_VERSION="$(awk '($1 == "require" && $2 == m) || $1 == m {print ($1 == m ? $2 : $3); exit}' \
  m="$CM_MODULE" "$MOD/go.mod")"
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
DEST="$CACHE/cert-manager/$CM_VERSION"
BIN="$DEST/bin"
CRDS="$DEST/crds"
CRD_FILES="cert-manager.io_certificates.yaml cert-manager.io_certificaterequests.yaml
  cert-manager.io_issuers.yaml cert-manager.io_clusterissuers.yaml"

[[ -n "$CM_VERSION" ]] || { echo "certmanager: no $CM_MODULE version in $MOD/go.mod" >&2; exit 1; }

if [[ "${1:-}" == "--path" ]]; then
  echo "$BIN"
  exit 0
fi

crds_there() {
  local f
  for f in $CRD_FILES; do [[ -s "$CRDS/$f" ]] || return 1; done
}

if [[ "${1:-}" == "--check" ]]; then
  [[ -x "$BIN/cert-manager-controller" ]] && crds_there
  exit $?
fi

mkdir -p "$BIN"
exec 9>"$DEST/.lock"
flock 9 # one build at a time per cache folder

if [[ -x "$BIN/cert-manager-controller" ]] && crds_there; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { echo "certmanager: go not found (needs Go >= 1.26)" >&2; exit 1; }
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
mkdir -p "$GOMODCACHE" "$GOCACHE"

if ! crds_there; then
  # The CRDs as controller-gen wrote them (plain YAML); the Helm chart's copies
  # (deploy/charts/cert-manager/templates/crd-*.yaml) have the same spec wrapped in {{ }}.
  src="$(cd "$MOD" && go mod download -json "$CM_MODULE@$CM_VERSION" | awk -F'"' '$2 == "Dir" {print $4}')"
  [[ -d "$src/deploy/crds" ]] || { echo "certmanager: no deploy/crds in $CM_MODULE@$CM_VERSION ($src)" >&2; exit 1; }
  mkdir -p "$CRDS"
  for f in $CRD_FILES; do
    if grep -q '{{' "$src/deploy/crds/$f"; then
      # a later release may template them: drop the Helm-only lines (if/end/include/helm.sh annotations)
      sed -e '/^[[:space:]]*{{-\{0,1\}[[:space:]]*\(if\|end\|include\)[^}]*}}[[:space:]]*$/d' \
        -e '/helm.sh\/resource-policy/d' "$src/deploy/crds/$f" >"$CRDS/.$f.tmp"
      if grep -q '{{' "$CRDS/.$f.tmp"; then
        echo "certmanager: $f still templated after rendering" >&2
        exit 1
      fi
    else
      cp "$src/deploy/crds/$f" "$CRDS/.$f.tmp"
    fi
    chmod 644 "$CRDS/.$f.tmp"
    mv -f "$CRDS/.$f.tmp" "$CRDS/$f"
  done
  echo "certmanager: CRDs of $CM_VERSION in $CRDS" >&2
fi

if [[ ! -x "$BIN/cert-manager-controller" ]]; then
  t0=$SECONDS
  echo "certmanager: building $BIN/cert-manager-controller ($CM_MODULE $CM_VERSION) ..." >&2
  # what cert-manager's release build stamps, so the version it logs and sends as User-Agent is right
  ldflags="-s -w -X $CM_MODULE/pkg/util.AppVersion=$CM_VERSION"
  (cd "$MOD" && go build -ldflags="$ldflags" -o "$BIN/.cert-manager-controller.tmp" .)
  mv -f "$BIN/.cert-manager-controller.tmp" "$BIN/cert-manager-controller"
  echo "certmanager: built $BIN/cert-manager-controller in $((SECONDS - t0))s" >&2
fi
echo "$BIN"
