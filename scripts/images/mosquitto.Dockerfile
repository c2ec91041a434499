# Stand-in for eclipse-mosquitto (the chart's `helm test` pod, tests.image) where no registry can be reached:
# Debian bookworm's mosquitto clients (2.0), the same mosquitto_sub / mosquitto_pub and /bin/sh.
ARG BASE=fleetmq.local/debian:bookworm
FROM ${BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends mosquitto-clients \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
USER 1883:1883
CMD ["/bin/sh"]
