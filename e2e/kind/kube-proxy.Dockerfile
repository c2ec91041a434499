# registry.k8s.io/kube-proxy for the kind node image (scripts/kind.sh): the release's kube-proxy on Debian
# with the tools it runs (iptables, nftables, conntrack)
ARG BASE=fleetmq.local/debian:bookworm
FROM $BASE
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables nftables conntrack ipset kmod \
    && rm -rf /var/lib/apt/lists/*
COPY kube-proxy /usr/local/bin/kube-proxy
