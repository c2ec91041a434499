#!/usr/bin/env bash
# kind for `E2E_CLUSTER=kind make e2e` (e2e/run.sh) on a machine with no registry and no Docker engine:
#   scripts/kind.sh build        the binaries the node image needs (Go, into the cache): the release's
#                                control plane, kubelet, kube-proxy, kubeadm, kubectl and pause program
#                                (scripts/envtest.sh), etcd 3.5 (e2e/kind/etcd), CoreDNS and kind
#                                (scripts/tools.sh); prints kind's path
#   scripts/kind.sh up           build, a Docker engine for kind, the node image (made when missing or its
#                                recipe changed), kind's network; prints `export` lines for DOCKER_HOST and
#                                E2E_NODE_IMAGE (e2e/conftest.py gives that image to `kind create cluster`)
#   scripts/kind.sh down         the private engine's containers and kind's network gone, the engine stopped
#                                by pid, the cgroups and the bridge it left removed
#   scripts/kind.sh node-image   up, then down: the node image only (timed)
#
# The engine is the machine's where `docker info` answers (down then leaves it alone); else Debian's
# dockerd (docker.io) started here as in scripts/image.sh: its own socket, data in $CACHE/kind/docker, its
# mounts in a private mount namespace, its containers under the cgroup /fleetmq-kind, no iptables rules,
# no ip_forward. What differs from image.sh's, for kind:
#   - runc wrapped (e2e/kind/runc-wrapper) to leave out the capabilities this machine's bounding set lacks:
#     dockerd 20.10 asks for all of them in a --privileged container, and a kind node is one
#   - the userland proxy on: kind publishes the API server on 127.0.0.1 through it (there is no iptables)
#   - a bridge network named kind made here (bridge fleetmq-kind0), which kind then uses
# The node image, fleetmq.local/kind-node:<release> (e2e/kind/node.Dockerfile), needs no registry: kind's
# base image remade on the project's Debian base (scripts/image.sh base), and the images kubeadm runs
# preloaded, made from the binaries above (FROM scratch; kube-proxy on Debian, e2e/kind/kube-proxy.Dockerfile).
# Its label fleetmq.kind holds a digest of its recipe and inputs; a stale or missing image is made again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CACHE:-$HOME/.cache/fleetmq}"
export CACHE
KIND_DIR="$CACHE/kind"
ENGINE="$KIND_DIR/docker" # the private engine: data/, run/ (socket, exec root), dockerd.log, dockerd.pid
RUN="$ENGINE/run"
CGROUP_PARENT="fleetmq-kind"
BRIDGE="fleetmq-kind0"
K8S_VERSION="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$ROOT/tests/envtest/go.mod")"
NODE_IMAGE="fleetmq.local/kind-node:$K8S_VERSION"
DEBIAN_IMAGE="fleetmq.local/debian:bookworm" # scripts/image.sh's
ETCD_VERSION="$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {print $3}' "$ROOT/e2e/kind/etcd/go.mod")"
export DOCKER_BUILDKIT=0 # the legacy builder, as scripts/image.sh

log() { echo "kind: $*" >&2; }
die() { log "$*"; exit 1; }

# ------------------------------------------------------------------------------------------------ binaries
ENVTEST_BIN="$(bash "$ROOT/scripts/envtest.sh" --path)"
NODE_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm kubectl pause"
ETCD_BIN="$KIND_DIR/bin/etcd-$ETCD_VERSION"

build_binaries() {
  ENVTEST_COMPONENTS="$NODE_COMPONENTS" bash "$ROOT/scripts/envtest.sh" >/dev/null
  if [[ ! -x "$ETCD_BIN" ]]; then
    log "building etcd $ETCD_VERSION (e2e/kind/etcd) ..."
    local t0=$SECONDS
    mkdir -p "$KIND_DIR/bin"
    (cd "$ROOT/e2e/kind/etcd" &&
      GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOTOOLCHAIN=local CGO_ENABLED=0 \
        GOFLAGS="-mod=readonly -buildvcs=false -trimpath" go build -ldflags="-s -w" -o "$ETCD_BIN.tmp" .)
    mv "$ETCD_BIN.tmp" "$ETCD_BIN"
    log "built $ETCD_BIN in $((SECONDS - t0))s"
  fi
  mapfile -t TOOLS < <(bash "$ROOT/scripts/tools.sh" coredns kind)
  COREDNS="${TOOLS[0]}" KIND="${TOOLS[1]}"
}

# kind's base image files (images/base/files of its module, which scripts/tools.sh downloaded to build it)
kind_base_files() {
  local version
  version="$(basename "$(dirname "$KIND")")" # kind-vX.Y.Z
  GOMODCACHE="$CACHE/go/mod" go mod download -json "sigs.k8s.io/kind@${version#kind-}" |
    jq -r .Dir
}

# -------------------------------------------------------------------------------------------------- engine
private_engine() { [[ -s "$ENGINE/dockerd.pid" ]]; }

engine_pid() { # the private dockerd's pid, when that process is still it
  local pid
  pid="$(cat "$ENGINE/dockerd.pid" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && grep -qs -- "$RUN/exec" "/proc/$pid/cmdline" && echo "$pid"
}

# the capabilities dockerd hands a privileged container (every one the kernel knows) that this process's
# bounding set lacks, by name, as a JSON list (runc-wrapper's drop-caps)
missing_caps() {
  local names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT
    SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE
    AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ
    PERFMON BPF CHECKPOINT_RESTORE)
  local bnd last i out=()
  bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  last="$(cat /proc/sys/kernel/cap_last_cap)"
  for ((i = 0; i <= last && i < ${#names[@]}; i++)); do
    ((bnd >> i & 1)) || out+=("\"CAP_${names[i]}\"")
  done
  local IFS=,
  echo "[${out[*]}]"
}

start_engine() {
  if docker info >/dev/null 2>&1; then
    log "using the Docker engine at ${DOCKER_HOST:-the default socket}"
    return
  fi
  [[ -z "${DOCKER_HOST:-}" ]] || die "DOCKER_HOST=$DOCKER_HOST does not answer \`docker info\`"
  [[ "$(id -u)" == 0 ]] || die "no Docker engine runs, and starting Debian's dockerd needs root"
  if private_engine; then stop_engine; fi # what a run that was killed left
  rm -rf "$RUN"
  mkdir -p "$RUN" "$ENGINE/data"
  printf '{"deprecated-key-path": "%s"}\n' "$RUN/key.json" >"$RUN/daemon.json"
  local runtime=() drop
  drop="$(missing_caps)"
  if [[ "$drop" != "[]" ]]; then
    cp "$ROOT/e2e/kind/runc-wrapper" "$RUN/runc-wrapper"
    echo "$drop" >"$RUN/drop-caps"
    runtime=(--add-runtime "fleetmq-runc=$RUN/runc-wrapper" --default-runtime fleetmq-runc)
    log "runc leaves out $drop: this machine's capability bounding set lacks them"
  fi
  # /run: dockerd makes /run/docker/plugins there; a tmpfs of its own mount namespace takes it instead.
  # Detached (setsid, no inherited descriptors): it outlives this script until `down`.
  setsid unshare --mount --propagation private -- sh -c 'mount -t tmpfs fleetmq-kind /run && exec "$@"' sh \
    dockerd --data-root "$ENGINE/data" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
    --host "unix://$RUN/docker.sock" --config-file "$RUN/daemon.json" \
    --bridge=none --iptables=false --ip-forward=false --ip-masq=false --userland-proxy=true \
    --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "/$CGROUP_PARENT" "${runtime[@]}" \
    --log-level=warn </dev/null >"$ENGINE/dockerd.log" 2>&1 8>&- 9>&- &
  echo $! >"$ENGINE/dockerd.pid" # unshare and sh exec: this is dockerd's pid
  export DOCKER_HOST="unix://$RUN/docker.sock"
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && { log "started dockerd (pid $!, $DOCKER_HOST)"; return; }
    kill -0 $! 2>/dev/null || break
    sleep 0.5
  done
  tail -20 "$ENGINE/dockerd.log" >&2
  die "dockerd did not come up (log: $ENGINE/dockerd.log)"
}

stop_engine() {
  local pid cpid d
  if pid="$(engine_pid)"; then
    # every container is this engine's (kind nodes, with their /var volumes), and its networks
    export DOCKER_HOST="unix://$RUN/docker.sock"
    if docker info >/dev/null 2>&1; then
      mapfile -t ids < <(docker ps -aq)
      ((${#ids[@]} == 0)) || docker rm -f -v "${ids[@]}" >/dev/null || true
      docker network rm kind >/dev/null 2>&1 || true
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    log "stopped dockerd (pid $pid)"
  fi
  # the containerd dockerd ran, should it have outlived dockerd
  cpid="$(cat "$RUN/exec/containerd/containerd.pid" 2>/dev/null || true)"
  if [[ -n "$cpid" ]] && grep -qs -- "$RUN/exec" "/proc/$cpid/cmdline"; then kill -KILL "$cpid" 2>/dev/null || true; fi
  # the cgroups its containers ran in (the containers are gone: only empty folders are left)
  for d in /sys/fs/cgroup/*/"$CGROUP_PARENT" /sys/fs/cgroup/"$CGROUP_PARENT"; do
    [[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  # the bridge of kind's network, should dockerd have left it
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link delete "$BRIDGE" || true
  rm -f "$ENGINE/dockerd.pid"
}

# kind's network, made before kind makes one: a bridge with a name of its own (so `down` finds it) on a
# subnet no route of this machine uses
make_network() {
  docker network inspect kind >/dev/null 2>&1 && return
  local n
  for n in $(seq 99 127); do
    ip -4 route | grep -q "^172\.30\.$n\." && continue
    docker network create -d bridge --subnet "172.30.$n.0/24" \
      -o "com.docker.network.bridge.name=$BRIDGE" kind >/dev/null
    log "made the docker network kind (172.30.$n.0/24, bridge $BRIDGE)"
    return
  done
  die "no free subnet in 172.30.99-127.0/24 for kind's network"
}

# --------------------------------------------------------------------------------------------- node image
# the images kubeadm runs (`kubeadm config images list`), made from the binaries and saved to <archive>
component_images() {
  local archive="$1" ctx tags=() ref name
  ctx="$(mktemp -d "$KIND_DIR/.components.XXXXXX")"
  mapfile -t refs < <("$ENVTEST_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
  for ref in "${refs[@]}"; do
    name="${ref##*/}"
    name="${name%%:*}"
    case "$name" in
      kube-apiserver | kube-controller-manager | kube-scheduler) scratch_image "$ref" "$ENVTEST_BIN/$name" ;;
      pause) scratch_image "$ref" "$ENVTEST_BIN/pause" ;;
      coredns) scratch_image "$ref" "$COREDNS" ;;
      etcd)
        [[ "${ref##*:}" == "${ETCD_VERSION#v}-"* ]] ||
          die "kubeadm runs $ref: set e2e/kind/etcd/go.mod to that version (\`go get\`, \`go mod tidy\`)"
        scratch_image "$ref" "$ETCD_BIN" etcd ;;
      kube-proxy)
        cp "$ROOT/e2e/kind/kube-proxy.Dockerfile" "$ctx/Dockerfile"
        cp "$ENVTEST_BIN/kube-proxy" "$ctx/"
        docker build --network host -t "$ref" "$ctx" >"$KIND_DIR/build-kube-proxy.log" 2>&1 ||
          { tail -30 "$KIND_DIR/build-kube-proxy.log" >&2; die "building $ref failed"; }
        rm -f "$ctx/Dockerfile" "$ctx/kube-proxy" ;;
      *) die "kubeadm runs $ref, which scripts/kind.sh does not know how to make" ;;
    esac
    tags+=("$ref")
  done
  docker save -o "$archive" "${tags[@]}"
  docker rmi "${tags[@]}" >/dev/null # only the node image holds them (the names are registry.k8s.io's)
  rm -rf "$ctx"
}

scratch_image() { # scratch_image <ref> <binary> [name in the image]: the binary alone, as the entry point
  local ref="$1" bin="$2" name="${3:-$(basename "$2")}" dir
  dir="$(mktemp -d "$KIND_DIR/.scratch.XXXXXX")"
  mkdir -p "$dir/usr/local/bin" "$dir/tmp"
  chmod 1777 "$dir/tmp"
  cp "$bin" "$dir/usr/local/bin/$name"
  tar --numeric-owner --owner=0 --group=0 -C "$dir" -c . |
    docker import --change "ENTRYPOINT [\"/usr/local/bin/$name\"]" \
      --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$ref" >/dev/null
  rm -rf "$dir"
}

build_node_image() { # build_node_image <kind base files> <recipe digest>
  local base="$1" digest="$2" ctx t0=$SECONDS
  log "making $NODE_IMAGE (a few minutes) ..."
  ctx="$(mktemp -d "$KIND_DIR/.node.XXXXXX")"
  mkdir -p "$ctx/bin" "$ctx/files/kind/images"
  # kind's base files, less its sysctl.d (the host's sysctls stay as they are); containerd is Debian's,
  # and it may not lower a process's oom_score_adj (that needs CAP_SYS_RESOURCE, which it may not have)
  cp -r "$base/." "$ctx/files/"
  chmod -R u+w "$ctx/files" # the module cache's files are read-only
  rm -rf "$ctx/files/etc/sysctl.d"
  sed -i 's#^ExecStart=/usr/local/bin/containerd#ExecStart=/usr/bin/containerd#' \
    "$ctx/files/etc/systemd/system/containerd.service"
  sed -i 's#^\( *restrict_oom_score_adj =\) false#\1 true#' "$ctx/files/etc/containerd/config.toml"
  grep -q '^ExecStart=/usr/bin/containerd' "$ctx/files/etc/systemd/system/containerd.service" &&
    grep -q 'restrict_oom_score_adj = true' "$ctx/files/etc/containerd/config.toml" ||
    die "kind's base files changed: adapt build_node_image in scripts/kind.sh"
  cp -r "$ROOT/e2e/kind/files/." "$ctx/files/"
  echo "$K8S_VERSION" >"$ctx/files/kind/version"
  cp "$ROOT/e2e/kind/node.Dockerfile" "$ctx/Dockerfile"
  cp "$ENVTEST_BIN/kubelet" "$ENVTEST_BIN/kubeadm" "$ENVTEST_BIN/kubectl" "$ctx/bin/"
  component_images "$ctx/files/kind/images/images.tar"
  docker build --network host --label "fleetmq.kind=$digest" -t "$NODE_IMAGE" "$ctx" \
    >"$KIND_DIR/build-node.log" 2>&1 ||
    { tail -40 "$KIND_DIR/build-node.log" >&2; rm -rf "$ctx"; die "building $NODE_IMAGE failed"; }
  rm -rf "$ctx"
  log "made $NODE_IMAGE in $((SECONDS - t0))s"
}

node_image() {
  local base digest have
  base="$(kind_base_files)"
  [[ -d "$base/images/base/files" ]] || die "kind's module has no images/base/files (in $base)"
  # the recipe (these functions, e2e/kind/) and its inputs (the binaries, kind's base files)
  digest="$( {
    declare -f component_images scratch_image build_node_image
    echo "$base"
    (cd "$ROOT/e2e/kind" && find . -type f ! -path './etcd/*' -print0 | sort -z | xargs -0 sha256sum)
    for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubeadm kubectl pause; do
      stat -c '%n %s %Y' "$ENVTEST_BIN/$c"
    done
    stat -c '%n %s %Y' "$ETCD_BIN" "$COREDNS"
  } | sha256sum | cut -c1-16)"
  have="$(docker image inspect -f '{{index .Config.Labels "fleetmq.kind"}}' "$NODE_IMAGE" 2>/dev/null || true)"
  if [[ "$have" == "$digest" ]]; then
    log "$NODE_IMAGE is up to date"
    return
  fi
  if ! docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
    local tar="$CACHE/images/base/debian-bookworm-minbase.tar"
    # scripts/image.sh makes the rootfs in its own engine (a registry's debian is not used: same base
    # everywhere), this engine imports it
    if [[ ! -s "$tar" ]]; then
      (if private_engine; then unset DOCKER_HOST; fi && bash "$ROOT/scripts/image.sh" base) >&2
    fi
    docker import --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "$DEBIAN_IMAGE" >/dev/null
  fi
  build_node_image "$base/images/base/files" "$digest"
}

# ---------------------------------------------------------------------------------------------------- main
system_deps() {
  command -v docker >/dev/null && command -v jq >/dev/null && return
  [[ "$(id -u)" == 0 ]] || docker info >/dev/null 2>&1 || die "needs docker and jq (scripts/system-deps.sh kind)"
  bash "$ROOT/scripts/system-deps.sh" kind
}

up() {
  system_deps
  build_binaries
  start_engine
  [[ -n "${E2E_NODE_IMAGE:-}" ]] || node_image
  if private_engine; then
    make_network
    echo "export DOCKER_HOST=$DOCKER_HOST"
  fi
  echo "export E2E_NODE_IMAGE=${E2E_NODE_IMAGE:-$NODE_IMAGE} FLEETMQ_KIND=$KIND"
}

mkdir -p "$KIND_DIR"
case "${1:-}" in
  build)
    build_binaries
    echo "$KIND"
    ;;
  up) up ;;
  down) stop_engine ;;
  node-image)
    t0=$SECONDS
    system_deps
    build_binaries
    start_engine
    trap stop_engine EXIT
    node_image
    log "node image ready in $((SECONDS - t0))s"
    ;;
  *) die "usage: scripts/kind.sh build|up|down|node-image" ;;
esac
