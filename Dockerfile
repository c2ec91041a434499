# syntax=docker/dockerfile:1
# The fleetmq image: `fleetmq-broker` (the entrypoint, run by the operator's broker StatefulSets) and
# `fleetmq-operator` (run by the Helm chart's Deployment).
#   docker build -t fleetmq/broker:0.2.0 .
#   docker build --target pipeline -t fleetmq/pipeline:0.2.0 .
ARG PYTHON=python:3.11-slim-bookworm

FROM ${PYTHON} AS build
ARG MYPY=2.4.1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler for mypyc, and Python's headers where the base image has none (Debian's own Python)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && if ! python -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(sysconfig.get_path("include") + "/Python.h"))'; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker/ broker/
COPY operator/ operator/
COPY pipeline/ pipeline/
RUN pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/fleetmq \
 && /opt/fleetmq/bin/pip install "$(ls /dist/fleetmq-*.whl)[operator]"
# The per-message path compiled with mypyc beside its sources in the installed package (issue 30): the
# image always runs it. mypy type-checks against the installed dependencies, then leaves the image.
COPY scripts/compiled.py scripts/
RUN /opt/fleetmq/bin/pip install "mypy==${MYPY}" \
 && /opt/fleetmq/bin/python scripts/compiled.py --into "$(/opt/fleetmq/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && /opt/fleetmq/bin/pip uninstall -y mypy

# The broker and operator image, ahead of the pipeline's stages: `--target broker` builds it without them
# (Docker's legacy builder builds every stage before its target); the last stage, the default, repeats it.
FROM ${PYTHON} AS broker
ENV PATH=/opt/fleetmq/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 fleetmq \
 && useradd --system --uid 10001 --gid fleetmq --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fleetmq
COPY --from=build /opt/fleetmq /opt/fleetmq
USER 10001:10001
# MQTT (tcp, ws) and /metrics /healthz /readyz; the listeners themselves come from the config
EXPOSE 1883 8083 9100
ENTRYPOINT ["fleetmq-broker"]

# The pipeline image (the chart's CronJob): PySpark in local mode needs a Java runtime.
FROM build AS build-pipeline
RUN /opt/fleetmq/bin/pip install "$(ls /dist/fleetmq-*.whl)[pipeline]"

FROM ${PYTHON} AS pipeline
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 fleetmq \
 && useradd --system --uid 10001 --gid fleetmq --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin fleetmq
# Spark writes its scratch files under HOME and /tmp: an emptyDir in the CronJob
ENV PATH=/opt/fleetmq/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
COPY --from=build-pipeline /opt/fleetmq /opt/fleetmq
USER 10001:10001
ENTRYPOINT ["fleetmq-pipeline"]

# The default target: the broker and operator image.
FROM broker
