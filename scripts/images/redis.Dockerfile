# Stand-in for the official redis image (the operator's managed Redis, BrokerFleet spec.redis.image) where no
# registry can be reached: Debian bookworm's redis-server (7.0) behind an entrypoint that behaves like the
# official one for what the operator renders (arguments only, run as uid 999, data in /data).
ARG BASE=fleetmq.local/debian:bookworm
FROM ${BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && mkdir /data && chown 999:999 /data
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
USER 999:999
EXPOSE 6379
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["redis-server"]
