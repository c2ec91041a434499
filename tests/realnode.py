"""A real Kubernetes node for the test control plane (tests/kubeapi.py): Debian's containerd (with runc and
the CNI plugins), a kubelet and kube-proxy of the control plane's release (`make envtest`) and CoreDNS (Go
module proxy, scripts/tools.sh), so pods run real containers, Services route (kube-proxy, nftables mode), DNS
resolves, in-cluster clients reach the API server through the `kubernetes` Service, and PersistentVolumeClaims
bind (static local volumes of a default StorageClass).

    cp = ControlPlane(workdir).start(controllers=True, real_node=True)   # makes and starts cp.node
    cp.node.import_images([archive, ...])     # `docker save` archives (scripts/image.sh IMAGE_SAVE=...)
    cp.node.node_ip, cp.node.pod_cidr, cp.service_cidr                    # routed from the host
    cp.stop()                                 # the node first, then the control plane

How it stays off the machine: the node lives in a network and a mount namespace of its own, held by one
process (`unshare --net --mount` running the pause program) that containerd, the kubelet and kube-proxy
join (`nsenter`):
- network: its own loopback, bridge, pod veths, nftables rules (kube-proxy's), ip_forward and conntrack. One
  veth pair links it to the host (host end LINK.1/30, where the API server listens; node end LINK.2, the
  node's IP), and the host routes the pod and Service ranges through it. All of it goes with the namespace.
- mounts: tmpfs on /run (shim sockets, runc state, the pods' network namespaces), /var/log (pod logs) and the
  CNI cache; the machine-wide sysctls the kubelet wants (kernel.panic, vm.overcommit_memory, ...) are bind-
  mounted from files that already hold its values, so it writes none of them. Mounts made in there (volumes,
  container root filesystems) never reach the machine's mount table.
- cgroups: every container and containerd shim runs under /fleetmq-<id> in each hierarchy, removed at stop.
- files: state, images, logs and volumes under the node's work folder.
stop() kills by pid: kube-proxy, the kubelet, every process in the node's cgroups or namespaces (containers,
shims), containerd, the holder; then removes the cgroups and checks that the link and its routes are gone.
machine_state() snapshots what the node could have touched, to compare before and after (the e2e does).

Needs root, Linux with cgroups, overlayfs, veth and bridge, and the Debian packages of
`scripts/system-deps.sh node`; preflight() says what is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.kubeapi import ControlPlane

ROOT = Path(__file__).resolve().parent.parent
NODE_NAME = "fleetmq-node"
PAUSE_IMAGE = "fleetmq.local/pause:1"
# the CoreDNS that scripts/tools.sh builds (pinned there)
COREDNS_VERSION = re.search(r"^COREDNS_VERSION=(\S+)", (ROOT / "scripts" / "tools.sh").read_text(), re.M)[1]
COREDNS_IMAGE = f"fleetmq.local/coredns:{COREDNS_VERSION}"
# the metrics-server that scripts/tools.sh builds: the resource metrics API (pods' CPU) an HPA scales on
METRICS_SERVER_VERSION = re.search(
    r"^METRICS_SERVER_VERSION=(\S+)", (ROOT / "scripts" / "tools.sh").read_text(), re.M
)[1]
METRICS_SERVER_IMAGE = f"fleetmq.local/metrics-server:{METRICS_SERVER_VERSION}"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
STORAGE_CLASS = "local"
STATIC_VOLUMES = 12
# What the kubelet sets unless protectKernelDefaults (pkg/kubelet/cm/container_manager_linux.go): served to it
# from files holding these very values, so it leaves the machine's alone.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
# Machine-wide settings the e2e checks are untouched.
WATCHED_SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
    *KUBELET_SYSCTLS,
)
DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "nftables", "iproute2", "util-linux")


class NodeError(RuntimeError):
    pass


def run(*argv: str | Path, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and cp.returncode != 0:
        raise NodeError(
            f"{' '.join(map(str, argv))} exited {cp.returncode}: {cp.stderr.strip() or cp.stdout}"
        )
    return cp


# ------------------------------------------------------------------------------------------ preflight
def preflight() -> list[str]:
    """What this machine lacks to run the node (empty: nothing): each item says what and how to get it."""
    missing: list[str] = []
    if os.uname().sysname != "Linux":
        return [f"Linux (this is {os.uname().sysname})"]
    if os.geteuid() != 0:
        missing.append("root: the node makes network and mount namespaces, cgroups and mounts")
    tools = {
        "containerd": "containerd",
        "ctr": "containerd",
        "runc": "runc",
        "nft": "nftables",
        "ip": "iproute2",
        "unshare": "util-linux",
        "nsenter": "util-linux",
    }
    for tool, pkg in tools.items():
        if shutil.which(tool) is None:
            missing.append(f"{tool}: Debian package {pkg} (scripts/system-deps.sh node)")
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(f"{CNI_BIN_DIR}/{plugin}", os.X_OK):
            missing.append(f"CNI plugin {CNI_BIN_DIR}/{plugin}: Debian package containernetworking-plugins")
    filesystems = Path("/proc/filesystems").read_text() if Path("/proc/filesystems").exists() else ""
    if "overlay" not in filesystems:
        missing.append("overlayfs in the kernel (containerd's snapshotter)")
    if not cgroup_mounts():
        missing.append("cgroups: nothing of type cgroup or cgroup2 is mounted (/proc/self/mountinfo)")
    if os.geteuid() == 0 and not missing:
        probe = run(
            "unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c",
            "ip link add fmqprobe0 type veth peer name fmqprobe1 && ip link add fmqprobe2 type bridge"
            " && mount -t tmpfs probe /mnt",
            check=False,
        )  # fmt: skip
        if probe.returncode != 0:
            missing.append(
                "namespaces, veth, bridge and mounts: `unshare --net --mount` then `ip link add ... type "
                f"veth` / `type bridge` / `mount -t tmpfs` failed: {probe.stderr.strip()}"
            )
    return missing


# ------------------------------------------------------------------------------------------ machine state
def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            if post.split(" ", 1)[0] in ("cgroup", "cgroup2"):
                out.append(Path(pre.split()[4]))
    return out


def machine_state() -> dict[str, Any]:
    """What the node could change on the machine: links, addresses, routes, nftables rules, mounts, top-level
    cgroups, sysctls, and the stray folders containerd, the kubelet or the CNI plugins would make by default."""
    state: dict[str, Any] = {}
    state["links"] = sorted(ln["ifname"] for ln in json.loads(run("ip", "-j", "link", "show").stdout or "[]"))
    state["addresses"] = sorted(
        f"{a['ifname']} {i['local']}/{i['prefixlen']}"
        for a in json.loads(run("ip", "-j", "addr", "show").stdout or "[]")
        for i in a.get("addr_info", [])
    )
    state["routes"] = sorted(run("ip", "route", "show", "table", "all").stdout.splitlines())
    nft = run("nft", "list", "ruleset", check=False) if shutil.which("nft") else None
    state["nft"] = nft.stdout if nft is not None and nft.returncode == 0 else "(nft not available)"
    state["mounts"] = sorted(
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
    state["cgroups"] = sorted(str(d) for m in cgroup_mounts() for d in m.iterdir() if d.is_dir())
    state["sysctls"] = {
        k: (Path("/proc/sys", k).read_text().strip() if Path("/proc/sys", k).exists() else None)
        for k in WATCHED_SYSCTLS
    }
    stray = ("/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/var/lib/cni", "/etc/cni/net.d",
             "/opt/containerd", "/var/log/pods", "/var/log/containers", "/run/netns",
             "/usr/libexec/kubernetes", "/etc/kubernetes")  # fmt: skip
    state["paths"] = {p: os.path.exists(p) for p in stray}
    return state


def diff_state(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Human-readable differences between two machine_state() snapshots."""
    out = []
    for key in before:
        b, a = before[key], after.get(key)
        if b == a:
            continue
        if isinstance(b, list) and isinstance(a, list):
            added, removed = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            out.append(f"{key}: added {added}, removed {removed}")
        elif isinstance(b, dict) and isinstance(a, dict):
            out.append(
                f"{key}: " + ", ".join(f"{k} {b.get(k)!r} -> {a.get(k)!r}" for k in b if b.get(k) != a.get(k))
            )
        else:
            out.append(f"{key}: {b!r} -> {a!r}")
    return out


# ------------------------------------------------------------------------------------------ addresses
def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in run("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        dst = line.split()[0] if line.split() else ""
        if dst in ("default", "broadcast", "local", "unreachable", "multicast"):
            dst = line.split()[1] if len(line.split()) > 1 else ""
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(dst, strict=False))
    for a in json.loads(run("ip", "-j", "-4", "addr", "show").stdout or "[]"):
        for i in a.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{i['local']}/{i['prefixlen']}", strict=False))
    return [n for n in nets if n.version == 4 and n.prefixlen > 0]


def free_network(candidates: list[str]) -> str:
    """The first candidate (in random order) overlapping no route or address of the machine."""
    used = _used_networks()
    pool = list(candidates)
    random.shuffle(pool)
    for c in pool:
        net = ipaddress.ip_network(c)
        if not any(net.overlaps(u) for u in used):
            return c
    raise NodeError(f"no free private network among {len(candidates)} candidates like {candidates[0]}")


# ------------------------------------------------------------------------------------------ images
def image_archive(path: Path, name: str, files: dict[str, Path], entrypoint: list[str], user: str) -> Path:
    """A `docker save` style archive of a one-layer image holding `files` ({path in image: source}), for
    `ctr images import`: the node's own images (pause, CoreDNS), made without Docker."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        dirs: set[str] = set()
        for target in sorted(files):
            parts = target.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    layer.addfile(info)
                    dirs.add(d)
            data = files[target].read_bytes()
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            layer.addfile(info, io.BytesIO(data))
    layer_bytes = layer_buf.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "User": user, "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/realnode.py image_archive"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [f"{diff_id}/layer.tar"]}]
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as out:
        for arcname, data in (
            (config_name, config_bytes),
            (f"{diff_id}/layer.tar", layer_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime = len(data), 0
            out.addfile(info, io.BytesIO(data))
    tmp.replace(path)
    return path


def tool_binary(name: str) -> Path:
    """A tool of scripts/tools.sh (coredns, metrics-server), built with Go from the module proxy into the
    tools cache when missing."""
    cp = run("bash", ROOT / "scripts" / "tools.sh", name, timeout=1800)
    return Path(cp.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ the node
@dataclass(eq=False)
class RealNode:
    """One node (NODE_NAME) whose files live in workdir; see the module docstring."""

    workdir: Path
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    link_cidr: str = ""  # LINK.0/30 between the host and the node's network namespace
    pod_cidr: str = ""
    service_cidr: str = ""
    procs: dict[str, Any] = field(default_factory=dict)  # name -> kubeapi._Proc
    detached: bool = False

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()

    # -- names and addresses
    @property
    def host_ip(self) -> str:
        return str(ipaddress.ip_network(self.link_cidr)[1])

    @property
    def node_ip(self) -> str:
        return str(ipaddress.ip_network(self.link_cidr)[2])

    @property
    def host_link(self) -> str:
        return f"fmq{self.id[:6]}h"  # at most 15 characters, like every Linux interface name

    @property
    def node_link(self) -> str:
        return f"fmq{self.id[:6]}n"

    @property
    def cgroup(self) -> str:
        return f"fleetmq-{self.id}"

    @property
    def dns_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr)[10])

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def holder_pid(self) -> int:
        return self.procs["holder"].pid

    def log(self, name: str, tail: int = 4000) -> str:
        p = self.procs.get(name)
        return p.log(tail) if p else ""

    # -- lifecycle
    def prepare(self, detach: bool = False) -> str:
        """Make the node's namespaces and the link to the host; returns the host's address on the link, where
        the API server must listen for the node and its pods to reach it."""
        missing = preflight()
        if missing:
            raise NodeError("this machine cannot run the real node: " + "; ".join(missing))
        self.detached = detach
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.link_cidr = self.link_cidr or free_network(
            [f"10.254.{i}.{j}/30" for i in range(256) for j in (0, 4)]
        )
        self.pod_cidr = self.pod_cidr or free_network(
            [f"10.{b}.{c}.0/24" for b in (244, 245) for c in range(256)]
        )
        sysctl_dir = self.workdir / "sysctl"
        sysctl_dir.mkdir(exist_ok=True)
        binds = []
        for key, value in KUBELET_SYSCTLS.items():
            f = sysctl_dir / key.replace("/", ".")
            f.write_text(value + "\n")
            if Path("/proc/sys", key).exists():
                binds.append(f"mount --bind {f} /proc/sys/{key}")
        cni_cache = "/var/lib/cni" if Path("/var/lib/cni").is_dir() else "/var/lib"
        setup = " && ".join(
            [
                "mount -t tmpfs -o mode=0755 fleetmq-node /run",
                "mount -t tmpfs -o mode=0755 fleetmq-node /var/log",
                f"mount -t tmpfs -o mode=0755 fleetmq-node {cni_cache}",
                *binds,
                "ip link set lo up",
                "sysctl -qw net.ipv4.ip_forward=1",  # of the node's network namespace only
            ]
        )
        from tests import kubeapi

        pause = kubeapi.binary("pause")
        if pause is None:
            raise NodeError(f"no pause program in {kubeapi.bin_dir()}: run `make envtest NODE=real`")
        # the holder: keeps both namespaces alive; everything else of the node joins them
        self._spawn("holder", ["unshare", "--net", "--mount", "--propagation", "private", "--", pause])
        deadline = time.monotonic() + 10
        while self._ns("net") == _own_ns("net"):
            if not self.procs["holder"].alive() or time.monotonic() > deadline:
                raise NodeError(f"the node's namespaces did not come up: {self.log('holder')}")
            time.sleep(0.02)
        self.nsenter("sh", "-ec", setup)
        run("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", self.node_link,
            "netns", str(self.holder_pid))  # fmt: skip
        prefix = ipaddress.ip_network(self.link_cidr).prefixlen
        run("ip", "addr", "add", f"{self.host_ip}/{prefix}", "dev", self.host_link)
        run("ip", "link", "set", self.host_link, "up")
        self.nsenter("sh", "-ec", f"ip addr add {self.node_ip}/{prefix} dev {self.node_link}"
                     f" && ip link set {self.node_link} up && ip route add default via {self.host_ip}")  # fmt: skip
        run("ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", self.host_link)
        self._save_state()
        return self.host_ip

    def route_services(self, service_cidr: str) -> None:
        """Route the cluster's Service range from the host to the node, where kube-proxy translates it."""
        self.service_cidr = service_cidr
        run("ip", "route", "add", service_cidr, "via", self.node_ip, "dev", self.host_link)
        self._save_state()

    def start(self, cp: ControlPlane, timeout: float = 180.0) -> RealNode:
        """Start containerd, the kubelet and kube-proxy against `cp` (prepare() and route_services() done),
        then the cluster's DNS and storage; returns once the node is Ready and DNS answers."""
        t0 = time.monotonic()
        try:
            self._make_cgroups()
            self._write_configs(cp)
            self._start_containerd(timeout)
            self._import_node_images()
            self._start("kubelet", [self._bin("kubelet"), f"--config={self.workdir / 'kubelet.yaml'}",
                                    f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                                    f"--root-dir={self.workdir / 'kubelet'}",
                                    f"--cert-dir={self.workdir / 'kubelet' / 'pki'}",
                                    f"--node-ip={self.node_ip}", f"--hostname-override={NODE_NAME}",
                                    "--node-labels=topology.kubernetes.io/zone=zone-a", "--v=1"])  # fmt: skip
            self._start("kube-proxy", [self._bin("kube-proxy"), f"--config={self.workdir / 'kube-proxy.yaml'}",
                                       "--v=1"])  # fmt: skip
            self._wait_ready(cp, timeout - (time.monotonic() - t0))
            cp.apply(*self._cluster_addons())
            self._wait_dns(cp, timeout - (time.monotonic() - t0))
        except BaseException:
            self.stop()
            raise
        self._save_state()
        return self

    def stop(self, timeout: float = 30.0) -> list[str]:
        """Stop everything of the node by pid and undo what it made on the machine; returns what could not
        be undone (empty when the machine is as the node found it)."""
        for name in ("kube-proxy", "kubelet"):
            if name in self.procs:
                self.procs[name].stop(timeout)
        problems = _teardown(self.workdir, self._state(), timeout)
        for p in self.procs.values():
            p.kill()
        self.procs.clear()
        return problems

    # -- images
    def import_images(self, archives: list[Path], timeout: float = 900) -> None:
        """Import `docker save` archives into the node's containerd (namespace k8s.io, as the kubelet uses)."""
        for archive in archives:
            run("ctr", f"--address={self.socket}", "--namespace=k8s.io", "images", "import",
                "--no-unpack=false", archive, timeout=timeout)  # fmt: skip

    def images(self) -> list[str]:
        out = run("ctr", f"--address={self.socket}", "--namespace=k8s.io", "images", "list", "--quiet")
        return out.stdout.split()

    def _import_node_images(self) -> None:
        from tests import kubeapi

        images = self.workdir / "images"
        images.mkdir(exist_ok=True)
        pause = image_archive(images / "pause.tar", PAUSE_IMAGE, {"/pause": Path(kubeapi.binary("pause"))},
                              ["/pause"], "65535:65535")  # fmt: skip
        coredns = image_archive(images / "coredns.tar", COREDNS_IMAGE, {"/coredns": tool_binary("coredns")},
                                ["/coredns"], "65532:65532")  # fmt: skip
        metrics = image_archive(images / "metrics-server.tar", METRICS_SERVER_IMAGE,
                                {"/metrics-server": tool_binary("metrics-server")}, ["/metrics-server"],
                                "65534:65534")  # fmt: skip
        self.import_images([pause, coredns, metrics])

    # -- processes
    def _bin(self, name: str) -> str:
        from tests import kubeapi

        path = kubeapi.binary(name)
        if path is None:
            raise NodeError(f"{name} missing in {kubeapi.bin_dir()}: run `make envtest NODE=real`")
        return path

    def _spawn(self, name: str, argv: list[str]):
        from tests import kubeapi

        proc = kubeapi._Proc(name, [str(a) for a in argv], self.workdir / f"{name}.log")
        proc.spawn(self.detached)
        self.procs[name] = proc
        return proc

    def _start(self, name: str, argv: list[str]):
        """Run argv in the node's namespaces (nsenter execs it: the pid is the program's)."""
        env_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return self._spawn(name, ["nsenter", f"--target={self.holder_pid}", "--net", "--mount", "--",
                                  "env", f"PATH={env_path}", *argv])  # fmt: skip

    def nsenter(self, *argv: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run a command in the node's network and mount namespaces (as the node's processes see things)."""
        return run("nsenter", f"--target={self.holder_pid}", "--net", "--mount", "--", *argv,
                   timeout=timeout, check=check)  # fmt: skip

    def _ns(self, kind: str) -> str:
        try:
            return os.readlink(f"/proc/{self.holder_pid}/ns/{kind}")
        except OSError:
            return ""

    # -- cgroups
    def _make_cgroups(self) -> None:
        """/fleetmq-<id> and /fleetmq-<id>/shims in every hierarchy: the kubelet's cgroupRoot (it insists the
        root exists) and where containerd puts its shims, so stop() finds every process by its cgroup."""
        for mount in cgroup_mounts():
            for rel in (self.cgroup, f"{self.cgroup}/shims"):
                d = mount / rel
                d.mkdir(exist_ok=True)
                # a v1 cpuset child starts with no CPUs or memory nodes: give it its parent's
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if (d / knob).exists() and not (d / knob).read_text().strip():
                        (d / knob).write_text((d.parent / knob).read_text())

    # -- configuration
    def _write_configs(self, cp: ControlPlane) -> None:
        wd = self.workdir
        for d in ("cni", "cni-ipam", "containerd", "kubelet", "volumes", "volume-plugins"):
            (wd / d).mkdir(parents=True, exist_ok=True)
        cni = {
            "cniVersion": "1.0.0",
            "name": "fleetmq",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,  # the host routes the pod range to the node: no address translation
                    "hairpinMode": True,  # a pod reaching itself through its Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(wd / "cni-ipam"),
                    },
                }
            ],
        }
        (wd / "cni" / "10-fleetmq.conflist").write_text(json.dumps(cni, indent=2) + "\n")
        (wd / "containerd.toml").write_text(
            f"""# the real node's containerd (tests/realnode.py); state on the node's own /run tmpfs
version = 2
root = "{wd / "containerd" / "root"}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "{wd / "containerd" / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root may not give the pause container -998 here (no CAP_SYS_RESOURCE): let it keep its own score
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        ShimCgroup = "/{self.cgroup}/shims"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{wd / "cni"}"
"""
        )
        # certificates: the kubelet's client (Node authorizer) and serving certificate, kube-proxy's client
        kubelet_kc = cp.kubeconfig_for(f"system:node:{NODE_NAME}", ["system:nodes"], name="kubelet")
        shutil.copy(kubelet_kc, wd / "kubelet.kubeconfig")
        proxy_kc = cp.kubeconfig_for("system:kube-proxy", name="kube-proxy")
        shutil.copy(proxy_kc, wd / "kube-proxy.kubeconfig")
        crt, key = cp.serving_certificate(f"system:node:{NODE_NAME}", dns=[NODE_NAME], ips=[self.node_ip])
        (wd / "kubelet-serving.crt").write_bytes(crt)
        (wd / "kubelet-serving.key").write_bytes(key)
        (wd / "kubelet-serving.key").chmod(0o600)
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "tlsCertFile": str(wd / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(wd / "kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cp.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",  # containerd 1.6 cannot tell the kubelet which one it uses
            "cgroupRoot": f"/{self.cgroup}",
            "failCgroupV1": False,  # a cgroup v1 (hybrid) machine
            "failSwapOn": False,
            "protectKernelDefaults": False,  # it reads its values from the files prepare() bound
            "makeIPTablesUtilChains": False,
            "clusterDNS": [self.dns_ip],
            "clusterDomain": "cluster.local",
            "podCIDR": self.pod_cidr,
            "volumePluginDir": str(wd / "volume-plugins"),
            "imageGCHighThresholdPercent": 100,  # images come from `ctr import`: never collect them
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "rotateCertificates": False,
            "fileCheckFrequency": "5s",
            "syncFrequency": "10s",  # how soon a changed ConfigMap reaches a mounted volume, with the TTL
            "nodeStatusUpdateFrequency": "5s",
            "shutdownGracePeriod": "0s",
        }
        (wd / "kubelet.yaml").write_text(json.dumps(kubelet, indent=2) + "\n")
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(wd / "kube-proxy.kubeconfig")},
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": self.pod_cidr,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # 0: leave the machine-wide conntrack table size and timeouts as they are
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (wd / "kube-proxy.yaml").write_text(json.dumps(proxy, indent=2) + "\n")

    def _start_containerd(self, timeout: float) -> None:
        proc = self._start("containerd", ["containerd", f"--config={self.workdir / 'containerd.toml'}"])
        deadline = time.monotonic() + timeout
        while True:
            if not proc.alive():
                raise NodeError(f"containerd exited:\n{proc.log()}")
            if self.socket.exists():
                ok = run("ctr", f"--address={self.socket}", "version", check=False, timeout=10)
                if ok.returncode == 0:
                    return
            if time.monotonic() > deadline:
                raise NodeError(f"containerd not answering within {timeout}s:\n{proc.log()}")
            time.sleep(0.1)

    def _wait_ready(self, cp: ControlPlane, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 10)
        last = ""
        while True:
            for name in ("containerd", "kubelet", "kube-proxy"):
                if not self.procs[name].alive():
                    raise NodeError(f"{name} exited:\n{self.log(name)}")
            out = cp.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode == 0:
                conds = {c["type"]: c for c in json.loads(out.stdout)["status"].get("conditions", [])}
                ready = conds.get("Ready", {})
                if ready.get("status") == "True":
                    return
                last = ready.get("message", "")
            if time.monotonic() > deadline:
                raise NodeError(
                    f"node {NODE_NAME} not Ready within {timeout:.0f}s ({last}):\n{self.log('kubelet')}"
                )
            time.sleep(0.5)

    def _wait_dns(self, cp: ControlPlane, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 30)
        while True:
            out = cp.kubectl("get", "deployment", "coredns", "-n", "kube-system", "-o", "json", check=False)
            if out.returncode == 0 and json.loads(out.stdout).get("status", {}).get("readyReplicas"):
                return
            if time.monotonic() > deadline:
                pods = cp.kubectl("get", "pods", "-n", "kube-system", "-o", "wide", check=False).stdout
                logs = cp.kubectl("logs", "-n", "kube-system", "deploy/coredns", "--tail=30", check=False)
                raise NodeError(
                    f"CoreDNS not Ready within {timeout:.0f}s:\n{pods}\n{logs.stdout}{logs.stderr}"
                )
            time.sleep(1)

    # -- cluster add-ons: DNS and storage
    def _cluster_addons(self) -> list[dict[str, Any]]:
        ns = "kube-system"
        labels = {"k8s-app": "kube-dns"}
        corefile = "\n".join(
            [
                ".:1053 {",
                "    errors",
                "    health :8080",
                "    ready :8181",
                "    kubernetes cluster.local in-addr.arpa ip6.arpa {",
                "        pods insecure",
                "        fallthrough in-addr.arpa ip6.arpa",
                "        ttl 30",
                "    }",
                "    cache 30",
                "    reload",
                "    loadbalance",
                "}",
                "",
            ]
        )
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": ns}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "fleetmq:coredns"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["endpoints", "services", "pods", "namespaces"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["list", "watch"],
                    },
                ],
            },
            _binding(
                "ClusterRoleBinding",
                "fleetmq:coredns",
                "ClusterRole",
                "fleetmq:coredns",
                {"kind": "ServiceAccount", "name": "coredns", "namespace": ns},
            ),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "coredns", "namespace": ns},
                "data": {"Corefile": corefile},
            },
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "coredns", "namespace": ns, "labels": labels},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "serviceAccountName": "coredns",
                            "dnsPolicy": "Default",
                            "priorityClassName": "system-cluster-critical",
                            "securityContext": {
                                "runAsNonRoot": True,
                                "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "containers": [
                                {
                                    "name": "coredns",
                                    "image": COREDNS_IMAGE,
                                    "imagePullPolicy": "Never",
                                    "args": ["-conf", "/etc/coredns/Corefile"],
                                    "ports": [
                                        {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                                        {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"},
                                    ],
                                    "readinessProbe": {
                                        "httpGet": {"path": "/ready", "port": 8181},
                                        "periodSeconds": 2,
                                    },
                                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}},
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]},
                                    },
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                                }
                            ],
                            "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                        },
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": ns, "labels": labels},
                "spec": {
                    "clusterIP": self.dns_ip,
                    "selector": labels,
                    "ports": [
                        {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"},
                    ],
                },
            },
        ]
        objs += _metrics_server()
        paths = [self.workdir / "volumes" / f"pv-{i}" for i in range(STATIC_VOLUMES)]
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # the kubelet makes local volumes the pod's fsGroup's; any user may start
        objs += local_storage(NODE_NAME, [str(p) for p in paths])
        return objs

    # -- state for `down` (make dev-cluster-down) and for a stop() after a crash
    def _state(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cgroup": self.cgroup,
            "host_link": self.host_link,
            "link_cidr": self.link_cidr,
            "pod_cidr": self.pod_cidr,
            "service_cidr": self.service_cidr,
            "node_ip": self.node_ip if self.link_cidr else "",
            "pids": {n: p.pid for n, p in self.procs.items()},
            "namespaces": {k: self._ns(k) for k in ("net", "mnt")} if "holder" in self.procs else {},
        }

    def _save_state(self) -> None:
        (self.workdir / "node.json").write_text(json.dumps(self._state(), indent=2) + "\n")


def _binding(
    kind: str, name: str, role_kind: str, role: str, subject: dict[str, str], namespace: str | None = None
) -> dict[str, Any]:
    """A (Cluster)RoleBinding of `role` to one subject, as the cluster add-ons' manifests have them."""
    rbac = "rbac.authorization.k8s.io"
    meta: dict[str, Any] = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": f"{rbac}/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": role_kind, "name": role}, "subjects": [subject]}  # fmt: skip


def _metrics_server() -> list[dict[str, Any]]:
    """metrics-server as clusters run it (its release manifest's objects): a Deployment behind the
    APIService v1beta1.metrics.k8s.io, reading each node's kubelet (/metrics/resource, its serving
    certificate checked against the cluster CA), so `kubectl top` and an HPA's CPU targets work."""
    ns, name = "kube-system", "metrics-server"
    labels = {"k8s-app": name}
    rbac = "rbac.authorization.k8s.io"
    sa = {"kind": "ServiceAccount", "name": name, "namespace": ns}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:metrics-server"},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        },
        _binding("ClusterRoleBinding", "system:metrics-server", "ClusterRole", "system:metrics-server", sa),
        _binding(
            "ClusterRoleBinding",
            "metrics-server:system:auth-delegator",
            "ClusterRole",
            "system:auth-delegator",
            sa,
        ),
        _binding(
            "RoleBinding",
            "metrics-server-auth-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            sa,
            ns,
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "priorityClassName": "system-cluster-critical",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": name,
                                "image": METRICS_SERVER_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": [
                                    "--cert-dir=/tmp",
                                    "--secure-port=4443",
                                    "--kubelet-preferred-address-types=InternalIP",
                                    "--kubelet-use-node-status-port",
                                    "--kubelet-certificate-authority="
                                    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                                    "--metric-resolution=15s",
                                ],
                                "ports": [{"name": "https", "containerPort": 4443}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/readyz", "port": "https", "scheme": "HTTPS"},
                                    "periodSeconds": 5,
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                            }
                        ],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "https", "port": 443, "targetPort": "https"}]},
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"name": name, "namespace": ns, "port": 443},
                "insecureSkipTLSVerify": True,  # (its certificate is self-signed at start, as upstream's)
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


def _own_ns(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


def _pid_ns(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _node_pids(state: dict[str, Any]) -> set[int]:
    """Every live process of the node: in its cgroups (containers, shims) or its namespaces (containerd,
    kubelet, kube-proxy, the holder)."""
    pids: set[int] = set()
    for mount in cgroup_mounts():
        root = mount / state["cgroup"]
        # os.walk, not rglob: a pod's cgroup can go while it is walked (rglob raises, walk skips it)
        for folder, _dirs, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in Path(folder, "cgroup.procs").read_text().split())
    ns = state.get("namespaces") or {}
    if ns.get("net") or ns.get("mnt"):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                pid = int(entry.name)
                in_net = bool(ns.get("net")) and _pid_ns(pid, "net") == ns["net"]
                if in_net or (bool(ns.get("mnt")) and _pid_ns(pid, "mnt") == ns["mnt"]):
                    pids.add(pid)
    pids.discard(os.getpid())
    return pids


# the program each recorded pid must still run, so a pid the kernel gave to something else is left alone
PROGRAMS = {"kube-proxy": "kube-proxy", "kubelet": "kubelet", "containerd": "containerd", "holder": "pause"}


def _verified(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with only the pids that still run the node's programs, and its namespaces only while one of
    those is still in them (namespace numbers are reused once a namespace is gone)."""
    pids = {}
    for name, pid in (state.get("pids") or {}).items():
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except (OSError, TypeError):
            continue
        if os.path.basename(argv0) == PROGRAMS.get(name):
            pids[name] = pid
    ns = state.get("namespaces") or {}
    live = {k: v for k, v in ns.items() if any(_pid_ns(pid, k) == v for pid in pids.values())}
    return {**state, "pids": pids, "namespaces": live}


def _teardown(workdir: Path, state: dict[str, Any], timeout: float = 30.0) -> list[str]:
    """Stop the node described by `state` (RealNode._state() or its node.json) and undo its changes."""
    order = ["kube-proxy", "kubelet", "containerd", "holder"]
    state = _verified(state)
    pids = state["pids"]
    for name in order[:2]:
        _signal_and_wait([pids[name]] if pids.get(name) else [], signal.SIGTERM, timeout)
    # containers and shims: killed outright (what a power cut does to a node; the e2e drains pods itself)
    for _ in range(3):
        victims = _node_pids(state) - {pids.get("containerd"), pids.get("holder")} - {None}
        if not victims:
            break
        _signal_and_wait(sorted(victims), signal.SIGKILL, 10)
    for name in order[2:]:
        _signal_and_wait([pids[name]] if pids.get(name) else [], signal.SIGTERM, timeout)
    leftovers = _node_pids(state)
    _signal_and_wait(sorted(leftovers), signal.SIGKILL, 10)
    problems = []
    if leftovers := _node_pids(state):
        problems.append(f"processes of the node still running: {sorted(leftovers)}")
    # cgroups: deepest first; a cgroup with no processes left can be removed
    for mount in cgroup_mounts():
        root = mount / state["cgroup"]
        if not root.is_dir():
            continue
        for folder, dirs, _files in os.walk(root, topdown=False):  # (children first)
            for d in dirs:
                with contextlib.suppress(OSError):
                    Path(folder, d).rmdir()
        try:
            root.rmdir()
        except OSError as e:
            problems.append(f"cgroup {root} not removed: {e}")
    # the link (and its routes) goes with the namespace; make sure, and delete it if it did not
    # (the kernel dismantles a namespace in the background: give it a moment)
    link = state.get("host_link")
    deadline = time.monotonic() + 10
    while link and run("ip", "link", "show", link, check=False).returncode == 0:
        if time.monotonic() > deadline:
            run("ip", "link", "delete", link, check=False)
            problems.append(f"link {link} outlived the node's network namespace (deleted now)")
            break
        time.sleep(0.2)
    (workdir / "node.json").unlink(missing_ok=True)
    return problems


def _signal_and_wait(pids: list[int], sig: int, timeout: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie waits for its parent to reap it: nothing of it runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def down(workdir: Path) -> list[str] | None:
    """Stop a node that a detached start left in workdir (node.json); None when there was none."""
    f = Path(workdir) / "node.json"
    if not f.exists():
        return None
    return _teardown(Path(workdir), json.loads(f.read_text()))


def local_storage(node: str, paths: list[str]) -> list[dict[str, Any]]:
    """The default StorageClass `local` and a static local PersistentVolume on `node` for each of `paths`
    (directories any user may write to): PersistentVolumeClaims bind as they would to a provisioner's."""
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Retain",
        }
    ]
    for i, path in enumerate(paths):
        selector = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{node}-pv-{i}"},
                "spec": {
                    "capacity": {"storage": "20Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "local": {"path": path},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [selector]}]}},
                },
            }
        )
    return objs
