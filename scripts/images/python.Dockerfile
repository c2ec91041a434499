# Stand-in for python:3.11-slim-bookworm where no registry can be reached (scripts/image.sh builds it only
# when `docker pull` fails): Debian bookworm's own Python 3.11 on the locally made Debian base, with what the
# official image offers the project's Dockerfile: `python`, `pip`, `python -m venv`.
ARG BASE=fleetmq.local/debian:bookworm
FROM ${BASE}
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip python-is-python3 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV LANG=C.UTF-8
CMD ["python3"]
