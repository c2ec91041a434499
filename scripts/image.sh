#!/usr/bin/env bash
# `make image`: the project's Dockerfile built into the images the chart deploys, without needing a registry:
#     fleetmq/broker:<version>     the default target (broker pods and the operator)
#     fleetmq/pipeline:<version>   --target pipeline (the chart's pipeline CronJob)
# The Docker engine is the one `docker info` answers; where none runs, Debian's dockerd (docker.io) is
# started here for the build, private to it (own socket, data in $CACHE/docker, no bridge, no iptables, no
# ip_forward, its mounts in a private mount namespace, containers under its own cgroup) and stopped by pid
# when done. Builds use the host network (that dockerd has no bridge).
# The base image the Dockerfile names (ARG PYTHON) is pulled when a registry answers; else a stand-in is
# built from scripts/images/python.Dockerfile on a Debian base made here with debootstrap and `docker
# import`; the rootfs is cached in $CACHE/images/base and made again when missing. The Dockerfile itself is
# the one a Docker user builds.
#
#   scripts/image.sh [broker] [pipeline] [standins] [base]     default: broker pipeline
#       standins: the third-party images the chart and the operator run (the managed Redis, the mosquitto
#       clients of `helm test`, kubectl in the pre-delete hook): pulled, else stand-ins from scripts/images/
#       base: only the Debian base (its rootfs in $CACHE/images/base; scripts/kind.sh's node image uses it)
#   IMAGE_SAVE=DIR scripts/image.sh ...    also `docker save` every image to DIR/<name>.tar (the real node
#       imports them into its containerd) and print the archive paths, one a line
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
PY="${PY:-$ROOT/.venv/bin/python}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -1)"
PYTHON_IMAGE="$(sed -n 's/^ARG PYTHON=//p' "$ROOT/Dockerfile" | head -1)"
DEBIAN_IMAGE="fleetmq.local/debian:bookworm" # the locally made base of the stand-ins
STANDINS="$ROOT/scripts/images"
export DOCKER_BUILDKIT=0 # the legacy builder: Debian's dockerd 20.10 with any client, no buildx needed

log() { echo "image: $*" >&2; }
die() { log "$*"; exit 1; }

(($#)) || set -- broker pipeline
for t in "$@"; do
  case "$t" in broker | pipeline | standins | base) ;; *) die "unknown target $t (broker, pipeline, standins, base)" ;; esac
done
[[ -n "$VERSION" && -n "$PYTHON_IMAGE" ]] || die "no version in pyproject.toml or no ARG PYTHON in Dockerfile"

mkdir -p "$CACHE/docker" "$CACHE/images/base"
exec 9>"$CACHE/docker/.lock"
flock 9 # one build at a time per cache folder (the private engine's data is shared)

# ------------------------------------------------------------------------------------------------ engine
DOCKERD_PID=""
CGROUP_PARENT=""
stop_engine() {
  [[ -n "$DOCKERD_PID" ]] || return 0
  kill -TERM "$DOCKERD_PID" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$DOCKERD_PID" 2>/dev/null || true
  wait "$DOCKERD_PID" 2>/dev/null || true
  # the containerd dockerd ran for itself, should it have outlived dockerd
  local cpid
  cpid="$(cat "$CACHE/docker/run/exec/containerd/containerd.pid" 2>/dev/null || true)"
  if [[ -n "$cpid" ]] && grep -qs containerd "/proc/$cpid/cmdline"; then kill -KILL "$cpid" 2>/dev/null || true; fi
  # the cgroups its build containers ran in (every container is gone: only empty folders are left)
  local d
  for d in /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT"; do
    [[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  DOCKERD_PID=""
}

start_engine() {
  if docker info >/dev/null 2>&1; then
    log "using the Docker engine at ${DOCKER_HOST:-the default socket}"
    return
  fi
  [[ -z "${DOCKER_HOST:-}" ]] || die "DOCKER_HOST=$DOCKER_HOST does not answer \`docker info\`"
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    bash "$ROOT/scripts/system-deps.sh" image
  fi
  [[ "$(id -u)" == 0 ]] || die "no Docker engine runs, and starting Debian's dockerd needs root"
  local run="$CACHE/docker/run"
  rm -rf "$run"
  mkdir -p "$run" "$CACHE/docker/data"
  # not /etc/docker/daemon.json; dockerd 20.10 writes its identity key to /etc/docker/key.json unless told
  printf '{"deprecated-key-path": "%s"}\n' "$run/key.json" >"$run/daemon.json"
  CGROUP_PARENT="fleetmq-docker-$$"
  trap stop_engine EXIT
  trap 'exit 143' TERM INT # stopped from outside: the EXIT trap still stops dockerd
  # /run: dockerd makes /run/docker/plugins there; a tmpfs of its own mount namespace takes it instead
  unshare --mount --propagation private -- sh -c 'mount -t tmpfs fleetmq-docker /run && exec "$@"' sh dockerd \
    --data-root "$CACHE/docker/data" --exec-root "$run/exec" \
    --pidfile "$run/dockerd.pid" --host "unix://$run/docker.sock" --config-file "$run/daemon.json" \
    --bridge=none --iptables=false --ip-forward=false --ip-masq=false --userland-proxy=false \
    --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "/$CGROUP_PARENT" \
    --log-level=warn >"$CACHE/docker/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  export DOCKER_HOST="unix://$run/docker.sock"
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && { log "started dockerd (pid $DOCKERD_PID, $DOCKER_HOST)"; return; }
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$CACHE/docker/dockerd.log" >&2
  die "dockerd did not come up (log: $CACHE/docker/dockerd.log)"
}

# --------------------------------------------------------------------------------------------- stand-ins
have() { docker image inspect "$1" >/dev/null 2>&1; }
label() { docker image inspect -f "{{index .Config.Labels \"fleetmq.standin\"}}" "$1" 2>/dev/null || true; }

# pull <image>: true when the image is here or a registry gave it (a stand-in is made again when its recipe
# changed, so an old stand-in never hides a newer recipe)
pull() {
  local img="$1" sum="${2:-}"
  if have "$img"; then
    local l
    l="$(label "$img")"
    [[ -z "$l" || "$l" == "<no value>" || "$l" == "$sum" ]] && return 0
  fi
  timeout 120 docker pull -q "$img" >/dev/null 2>&1 && { log "pulled $img"; return 0; }
  return 1
}

debian_base() {
  local tar="$CACHE/images/base/debian-bookworm-minbase.tar"
  if [[ ! -s "$tar" ]]; then
    log "making the Debian bookworm base with debootstrap from $MIRROR (a few minutes) ..."
    local t0=$SECONDS work
    work="$(mktemp -d "$CACHE/images/base/.rootfs.XXXXXX")"
    # debootstrap mounts /proc and /sys inside the rootfs: in a private mount namespace they go with it
    unshare --mount --propagation private -- \
      debootstrap --variant=minbase --include=ca-certificates bookworm "$work/rootfs" "$MIRROR" \
      >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; rm -rf "$work"; die "debootstrap failed"; }
    local r="$work/rootfs"
    rm -f "$r/etc/apt/sources.list"
    cat >"$r/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # as in Debian's official images: packages installed in a build do not try to start services
    printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
    chmod 755 "$r/usr/sbin/policy-rc.d"
    # the machine's trusted CAs (a build's pip and apt go out through the same network as this machine),
    # kept where update-ca-certificates picks them up again when a package reruns it
    if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
      cp /etc/ssl/certs/ca-certificates.crt "$r/usr/local/share/ca-certificates/fleetmq-host.crt"
      cat /etc/ssl/certs/ca-certificates.crt >>"$r/etc/ssl/certs/ca-certificates.crt"
    fi
    rm -rf "$r/var/lib/apt/lists/"* "$r/var/cache/apt/archives/"*.deb "$r/dev/"* "$r/run/"* "$r/tmp/"*
    tar --numeric-owner -C "$r" -cf "$work/rootfs.tar" .
    mv "$work/rootfs.tar" "$tar"
    rm -rf "$work"
    log "made $tar in $((SECONDS - t0))s"
  fi
  if ! have "$DEBIAN_IMAGE"; then
    docker import --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "$DEBIAN_IMAGE" >/dev/null
    log "imported $DEBIAN_IMAGE from $tar"
  fi
}

# standin <image> <recipe>: the image, pulled, or else built from scripts/images/<recipe>.Dockerfile
standin() {
  local img="$1" recipe="$2" ctx sum
  ctx="$(mktemp -d)"
  cp "$STANDINS/$recipe.Dockerfile" "$ctx/Dockerfile"
  [[ "$recipe" != redis ]] || cp "$STANDINS/redis-entrypoint.sh" "$ctx/"
  if [[ "$recipe" == kubectl ]]; then
    local bin
    bin="$(ENVTEST_COMPONENTS=kubectl CACHE="$CACHE" bash "$ROOT/scripts/envtest.sh" | tail -1)"
    cp "$bin/kubectl" "$ctx/kubectl"
  fi
  sum="$(cd "$ctx" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
  if pull "$img" "$sum"; then
    rm -rf "$ctx"
    return
  fi
  log "cannot pull $img: building a stand-in from scripts/images/$recipe.Dockerfile"
  [[ "$recipe" == kubectl ]] || debian_base
  docker build --network host --label "fleetmq.standin=$sum" -t "$img" "$ctx" >"$ctx/build.log" 2>&1 ||
    { tail -30 "$ctx/build.log" >&2; rm -rf "$ctx"; die "building the stand-in $img failed"; }
  rm -rf "$ctx"
}

# ------------------------------------------------------------------------------------------------ builds
build() { # build <tag> [docker build args]
  local tag="$1" t0=$SECONDS
  shift
  log "building $tag ..."
  docker build --network host "$@" -t "$tag" "$ROOT" >"$CACHE/images/build-${tag//[\/:]/_}.log" 2>&1 ||
    { tail -40 "$CACHE/images/build-${tag//[\/:]/_}.log" >&2; die "docker build of $tag failed"; }
  log "built $tag in $((SECONDS - t0))s"
}

start_engine
images=()
want() { local t; for t in "${targets[@]}"; do [[ "$t" == "$1" ]] && return 0; done; return 1; }
targets=("$@")
if want broker || want pipeline; then
  standin "$PYTHON_IMAGE" python
  # the broker stage comes before the pipeline's in the Dockerfile: with --target broker the legacy
  # builder (which builds every stage before its target) skips the pipeline's Java and Spark
  if want pipeline; then build "fleetmq/pipeline:$VERSION" --target pipeline; images+=("fleetmq/pipeline:$VERSION"); fi
  if want broker; then build "fleetmq/broker:$VERSION" --target broker; images+=("fleetmq/broker:$VERSION"); fi
fi
if want base; then debian_base; fi
if want standins; then
  [[ -x "$PY" ]] || die "the project venv is missing ($PY): run \`make deps\`"
  # the names the chart and the operator use, from their own defaults
  mapfile -t names < <("$PY" - "$ROOT" <<'EOF'
import sys, yaml
from fleetmq.operator import crds
values = yaml.safe_load(open(f"{sys.argv[1]}/charts/fleetmq/values.yaml"))
print(crds.BrokerFleetSpec().redis.image)
print(values["tests"]["image"])
print(values["examples"]["cleanupImage"])
EOF
  )
  standin "${names[0]}" redis
  standin "${names[1]}" mosquitto
  standin "${names[2]}" kubectl
  images+=("${names[@]}")
fi

if [[ -n "${IMAGE_SAVE:-}" ]]; then
  mkdir -p "$IMAGE_SAVE"
  for img in "${images[@]}"; do
    out="$IMAGE_SAVE/${img//[\/:]/_}.tar"
    id="$(docker image inspect -f '{{.Id}}' "$img")"
    if [[ ! -s "$out" || "$(cat "$out.id" 2>/dev/null)" != "$id" ]]; then
      docker save -o "$out.tmp" "$img"
      mv "$out.tmp" "$out"
      echo "$id" >"$out.id"
    fi
    echo "$out"
  done
fi
stop_engine
log "done: ${images[*]}"
