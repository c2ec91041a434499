#!/usr/bin/env bash
# Installs the Debian packages a part of the project needs, once (already installed ones are skipped):
#   scripts/system-deps.sh [test]   tests and benchmarks: redis-server, redis-sentinel, mosquitto,
#                                   etcd-server (the test control plane's etcd; kube-apiserver and friends
#                                   come from `make envtest`), prometheus (with promtool: tests/monitoring,
#                                   the alert rules), chromium and chromium-driver (the web console's
#                                   tests, through selenium), gcc (mypyc's builds: scripts/compiled.py)
#   scripts/system-deps.sh image    `make image` where no Docker engine runs: Debian's dockerd, debootstrap
#   scripts/system-deps.sh kind     `E2E_CLUSTER=kind make e2e` (scripts/kind.sh): Debian's dockerd,
#                                   debootstrap, jq (its runc wrapper), ip
#   scripts/system-deps.sh node     the real node (tests/realnode.py): containerd, runc, the CNI plugins,
#                                   nft (kube-proxy's nftables mode), ip and unshare/nsenter
#   scripts/system-deps.sh debug    `python -m bench.connmem arenas`: gdb
set -euo pipefail
case "${1:-test}" in
  test) pkgs=(redis-server redis-sentinel mosquitto etcd-server prometheus chromium chromium-driver gcc) ;;
  image) pkgs=(docker.io debootstrap) ;;
  kind) pkgs=(docker.io debootstrap jq iproute2) ;;
  node) pkgs=(containerd runc containernetworking-plugins nftables iproute2 util-linux) ;;
  debug) pkgs=(gdb) ;;
  *) echo "system-deps: unknown set $1 (test, image, kind, node, debug)" >&2; exit 2 ;;
esac
need=()
for pkg in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian packages start system services where an init runs them; tests, `make image` and the real node
# start their own, by pid, on their own sockets and ports.
if [[ "${1:-test}" == test ]]; then
  for svc in redis-server redis-sentinel mosquitto etcd prometheus; do
    command -v systemctl >/dev/null && systemctl stop "$svc" 2>/dev/null || true
  done
fi
exit 0
