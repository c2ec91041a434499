#!/usr/bin/env bash
# Installs the system packages tests and benchmarks need (Debian), once. etcd-server is the etcd of the
# test control plane (tests/kubeapi.py; kube-apiserver and friends come from `make envtest`); prometheus
# (with promtool) scrapes real brokers in tests/monitoring and checks the alert rules.
set -euo pipefail
need=()
for pkg in redis-server mosquitto etcd-server prometheus; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian packages start system services; tests start their own servers on free ports.
for svc in redis-server mosquitto etcd prometheus; do
  command -v systemctl >/dev/null && systemctl stop "$svc" 2>/dev/null || true
done
exit 0
