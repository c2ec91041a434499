"""A real Kubernetes control plane for tests, the way controller-runtime's envtest does it: etcd and
kube-apiserver (and, with controllers=True, kube-controller-manager, kube-scheduler and kwok with fake
nodes, so that Deployments and StatefulSets get Running pods) on free loopback ports.

    cp = ControlPlane(tmp_path / "kube")
    cp.start()                         # etcd + kube-apiserver, RBAC on, returns once /readyz says ok
    cp.kubectl("get", "ns")            # CompletedProcess (text); kubectl with the admin kubeconfig
    cp.kubeconfig, cp.url, cp.ca_file  # admin kubeconfig (O=system:masters), https://127.0.0.1:PORT, CA
    cp.kubeconfig_for("alice", ["devs"])                    # client certificate for a user and groups
    cp.serviceaccount_kubeconfig("ns/name")                 # bearer token of a real ServiceAccount
    cp.impersonating_kubeconfig(service_account="ns/name")  # admin certificate + `as:` impersonation
    cp.stop()                          # SIGTERM by pid, SIGKILL after a timeout; files stay in workdir
    cp.start(controllers=True, nodes=3)  # + controller-manager, scheduler, kwok and 3 Ready fake nodes
    cp.start(controllers=True, real_node=True)  # + a real node instead (tests/realnode.py): containerd,
                                       # kubelet, kube-proxy, CoreDNS; the API server listens on the link
                                       # to the node (cp.host) so pods reach it through the kubernetes Service

Binaries come from `make envtest` (scripts/envtest.sh): $ENVTEST_BIN_DIR, default
~/.cache/fleetmq/envtest/<k8s version>/bin (the version is the one tests/envtest/go.mod requires).
Certificates (CA, serving, client, service-account keys) are generated with `cryptography` into
workdir/pki once and reused when the same workdir is started again; the etcd data stays in workdir/etcd.

Every started process is tracked in LIVE_PROCS and killed by pid at interpreter exit as a last resort.

Outside pytest (make dev-cluster / dev-cluster-down):

    python -m tests.kubeapi up --dir DIR [--controllers yes|no|auto] [--nodes N] [--node kwok|real]
    python -m tests.kubeapi down --dir DIR
    python -m tests.kubeapi status --dir DIR
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import free_port, stop_process

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
ENVTEST_MODULE = ROOT / "tests" / "envtest"
SERVICE_CIDR = "10.96.0.0/12"
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.1/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KWOK = "kwok"
ETCD = "etcd"
CONTROLLER_BINARIES = (CONTROLLER_MANAGER, SCHEDULER, KWOK)
REAL_NODE_BINARIES = ("kubelet", "kube-proxy", "pause")  # ENVTEST_COMPONENTS of `make envtest NODE=real`


# ------------------------------------------------------------------ binaries
def k8s_version() -> str:
    """The k8s.io/kubernetes release tests/envtest/go.mod builds (e.g. "v1.33.13")."""
    m = re.search(r"^require\s+k8s\.io/kubernetes\s+(\S+)", (ENVTEST_MODULE / "go.mod").read_text(), re.M)
    if not m:
        raise RuntimeError(f"no `require k8s.io/kubernetes` line in {ENVTEST_MODULE / 'go.mod'}")
    return m.group(1)


def bin_dir() -> Path:
    """Where `make envtest` puts the binaries: $ENVTEST_BIN_DIR, else $FLEETMQ_CACHE (default
    ~/.cache/fleetmq)/envtest/<k8s version>/bin."""
    if d := os.environ.get("ENVTEST_BIN_DIR"):
        return Path(d)
    cache = Path(os.environ.get("FLEETMQ_CACHE") or Path.home() / ".cache" / "fleetmq")
    return cache / "envtest" / k8s_version() / "bin"


def label_selector(selector: dict[str, Any]) -> str:
    """A LabelSelector as `kubectl -l` takes it (matchLabels, and matchExpressions with In)."""
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        if e["operator"] != "In":
            raise ValueError(f"only In expressions: {e}")
        terms.append(f"{e['key']} in ({','.join(e['values'])})")
    return ",".join(terms)


def wait_established(kubectl: Any, crds: list[str] | None = None, timeout: float = 60.0) -> None:
    """Wait until the CRDs (names; None: every CRD there is) are Established. `kubectl wait --for
    condition=established` is no help right after the apply: a CRD whose status the API server has not
    written yet makes it fail at once (".status.conditions accessor error: <nil>") instead of waiting, which
    a CI run under load hit. `kubectl` is a ControlPlane's or an e2e Cluster's method."""
    if crds is None:
        out = kubectl("get", "crd", "-o", "jsonpath={.items[*].metadata.name}").stdout
        crds = out.split()
    deadline = time.monotonic() + timeout
    established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    for name in crds:
        while (
            kubectl("get", "crd", name.removeprefix("crd/"), "-o", established, check=False).stdout.strip()
            != "True"
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established within {timeout:.0f}s")
            time.sleep(0.2)


def binary(name: str) -> str | None:
    """Path of an executable binary of the control plane, or None. etcd and kubectl may also come from PATH
    (etcd from Debian's etcd-server; kubectl is built by `make envtest` only when none is on PATH)."""
    p = bin_dir() / name
    if p.is_file() and os.access(p, os.X_OK):
        return str(p)
    if name == ETCD:
        return os.environ.get("ETCD_BIN") or shutil.which(ETCD)
    if name == "kubectl":
        return shutil.which("kubectl")
    return None


def missing_binaries(controllers: bool = False, real_node: bool = False) -> list[str]:
    names = [ETCD, APISERVER, *(CONTROLLER_BINARIES if controllers or real_node else ())]
    names += REAL_NODE_BINARIES if real_node else ()
    return [n for n in names if binary(n) is None]


def controllers_available() -> bool:
    return not missing_binaries(controllers=True)


# ------------------------------------------------------------------ certificates
def _pki():
    # imported lazily: `cryptography` comes with the test extra, the module itself must import without it
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _key_pem(key) -> bytes:
    _, _, serialization, _, _, _ = _pki()
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _new_cert(
    subject_cn: str,
    *,
    orgs: list[str] | tuple[str, ...] = (),
    ca: tuple | None = None,
    is_ca: bool = False,
    server: bool = False,
    client: bool = False,
    dns: list[str] | tuple[str, ...] = (),
    ips: list[str] | tuple[str, ...] = (),
    days: int = 3650,
):
    """A fresh EC P-256 key and a certificate for it, self-signed when ca is None, else signed by
    ca = (ca_cert, ca_key). Returns (cert, key)."""
    x509, hashes, _, ec, eku, NameOID = _pki()
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, subject_cn))
    name = x509.Name(attrs)
    issuer_cert, issuer_key = ca if ca else (None, key)
    now = datetime.datetime.now(datetime.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if is_ca:
        b = b.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        b = b.add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
        usages = ([eku.SERVER_AUTH] if server else []) + ([eku.CLIENT_AUTH] if client else [])
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if issuer_cert is not None:
        b = b.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    if dns or ips:
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(issuer_key, hashes.SHA256()), key


def _cert_pem(cert) -> bytes:
    _, _, serialization, _, _, _ = _pki()
    return cert.public_bytes(serialization.Encoding.PEM)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ------------------------------------------------------------------ processes
# every running control-plane process (so nothing outlives pytest; see _kill_leftovers)
LIVE_PROCS: list[_Proc] = []


@dataclass(eq=False)
class _Proc:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None
    detached: bool = False

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def spawn(self, detach: bool = False) -> None:
        self.detached = detach
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=detach,  # make dev-cluster: survive the terminal and `up` exiting
            )
        if not detach:
            LIVE_PROCS.append(self)

    def log(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, SIGKILL after `timeout`; reaped."""
        if self.popen is None:
            return None
        code = stop_process(self.popen, timeout)
        if self in LIVE_PROCS:
            LIVE_PROCS.remove(self)
        return code

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
        if self in LIVE_PROCS:
            LIVE_PROCS.remove(self)


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


# ------------------------------------------------------------------ the control plane
@dataclass(eq=False)
class ControlPlane:
    """etcd + kube-apiserver (+ controllers) whose files (pki/, etcd/, logs, kubeconfigs) live in workdir."""

    workdir: Path
    procs: dict[str, _Proc] = field(default_factory=dict)
    etcd_port: int = 0
    etcd_peer_port: int = 0
    port: int = 0
    controllers: bool = False
    nodes: int = 0
    host: str = HOST  # where the API server listens (a real node's link address, else loopback)
    service_cidr: str = SERVICE_CIDR
    node: Any = None  # the RealNode, with real_node=True

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()

    # -- addresses and files
    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def etcd_url(self) -> str:
        return f"http://{HOST}:{self.etcd_port}"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate CN=admin, O=system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def kubernetes_service_ip(self) -> str:
        """The ClusterIP of the `kubernetes` Service: the first address of the Service range."""
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def version(self) -> str:
        return k8s_version()

    def log(self, name: str = APISERVER, tail: int = 6000) -> str:
        p = self.procs.get(name)
        return p.log(tail) if p else ""

    def alive(self) -> bool:
        return bool(self.procs) and all(p.alive() for p in self.procs.values())

    # -- lifecycle
    def start(
        self,
        controllers: bool = False,
        nodes: int = 3,
        timeout: float = 90.0,
        detach: bool = False,
        real_node: bool = False,
    ) -> ControlPlane:
        """Start etcd and kube-apiserver (and with controllers=True kube-controller-manager, kube-scheduler,
        kwok and `nodes` fake nodes); return once the apiserver's /readyz is ok (and the nodes Ready).
        real_node=True: the controllers and one real node (tests/realnode.py) instead of kwok's.
        detach=True: the processes are not killed when this interpreter exits (make dev-cluster)."""
        if self.procs and any(p.alive() for p in self.procs.values()):
            raise RuntimeError(f"control plane in {self.workdir} is already running")
        missing = missing_binaries(controllers, real_node)
        if missing:
            raise RuntimeError(
                f"control plane binaries missing in {bin_dir()}: {', '.join(missing)} "
                f"(run `make envtest{' NODE=real' if real_node else ''}`; etcd comes from Debian's "
                "etcd-server, `make deps`)"
            )
        controllers = controllers or real_node
        self.controllers, self.nodes = controllers, (0 if real_node else nodes) if controllers else 0
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if real_node:
                from tests.realnode import RealNode, free_network

                self.node = RealNode(self.workdir / "node")
                self.host = self.node.prepare(detach)
                self.service_cidr = free_network([f"10.{96 + i}.0.0/16" for i in range(16)])
                self.node.route_services(self.service_cidr)
            self._ensure_pki()
            self._start_etcd(detach, timeout)
            self._start_apiserver(detach, timeout)
            self._write_kubeconfig(self.kubeconfig, "admin", self._admin_cert_data())
            if controllers:
                self._start_controllers(detach, timeout)
            if self.node is not None:
                self._write_state()
                self.node.start(self, timeout=max(timeout, 180))
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> list[str]:
        """Stop every process (reverse start order) by pid, a real node first; the workdir keeps logs, PKI
        and etcd data. Returns what the node could not undo on the machine (empty: nothing)."""
        problems = self.node.stop() if self.node is not None else []
        for name in reversed(list(self.procs)):
            self.procs[name].stop()
        with contextlib.suppress(OSError):
            for pidfile in self.workdir.glob("*.pid"):
                pidfile.unlink()
        return problems

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # (what a real node could not undo is in its log; callers who care call stop())

    def _spawn(self, name: str, argv: list[str], detach: bool) -> _Proc:
        proc = _Proc(name, argv, self.workdir / f"{name}.log")
        proc.spawn(detach)
        self.procs[name] = proc
        (self.workdir / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc

    def _start_retrying(self, name: str, choose_ports, argv_fn, wait_fn, detach: bool) -> None:
        """Start `name` on freshly chosen free ports; if another process took a port between choosing and
        binding ("address already in use"), choose again (three tries)."""
        for attempt in range(3):
            choose_ports()
            proc = self._spawn(name, argv_fn(), detach)
            try:
                wait_fn(proc)
                return
            except RuntimeError:
                exited = not proc.alive()
                proc.stop()
                if exited and attempt < 2 and "address already in use" in proc.log().lower():
                    continue
                raise

    # -- etcd
    def _start_etcd(self, detach: bool, timeout: float) -> None:
        data = self.workdir / "etcd"

        def ports():
            self.etcd_port, self.etcd_peer_port = free_port(), free_port()

        def argv():
            peer = f"http://{HOST}:{self.etcd_peer_port}"
            return [
                binary(ETCD),
                "--name", "default",
                "--data-dir", str(data),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"default={peer}",
                "--initial-cluster-state", "new",
                "--logger", "zap",
                "--log-level", "warn",
                "--quota-backend-bytes", str(2 * 1024**3),
                "--snapshot-count", "50000",
            ]  # fmt: skip

        self._start_retrying(ETCD, ports, argv, lambda p: self._wait_etcd(p, timeout), detach)

    def _wait_etcd(self, proc: _Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            if not proc.alive():
                raise RuntimeError(f"etcd exited with {proc.popen.returncode}:\n{proc.log()}")
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                    last = r.read().decode()
                    if json.loads(last).get("health") == "true":
                        return
            except (OSError, ValueError) as e:
                last = e
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"etcd not healthy within {timeout}s ({last!r}):\n{proc.log()}")
            time.sleep(0.05)

    # -- kube-apiserver
    def _start_apiserver(self, detach: bool, timeout: float) -> None:
        def ports():
            self.port = free_port()

        def argv():
            pki = self.pki
            args = [
                binary(APISERVER),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                f"--secure-port={self.port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_file}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ]
            if self.node is None:
                # the "kubernetes" Service's Endpoints may not point at a loopback address
                args.append("--endpoint-reconciler-type=none")
            else:
                # logs, exec and port-forward go to the kubelet, which checks who asks (x509, Webhook)
                args += [
                    f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                    f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                    f"--kubelet-certificate-authority={self.ca_file}",
                    "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
                    # aggregated APIs (metrics-server) reached at their pods' addresses, routed from here
                    "--enable-aggregator-routing=true",
                ]
            if not self.controllers:
                # No controller-manager creates each namespace's "default" ServiceAccount, so pods would be
                # refused by the ServiceAccount admission plugin (envtest disables it for the same reason).
                args.append("--disable-admission-plugins=ServiceAccount")
            return args

        self._start_retrying(APISERVER, ports, argv, lambda p: self._wait_ready(p, timeout), detach)

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the CA and presents the admin client certificate."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET path as admin: (status, body). HTTP errors are returned, not raised."""
        try:
            with urllib.request.urlopen(self.url + path, context=self.ssl_context(), timeout=timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def _wait_ready(self, proc: _Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            if not proc.alive():
                raise RuntimeError(f"kube-apiserver exited with {proc.popen.returncode}:\n{proc.log()}")
            try:
                status, body = self.get("/readyz", timeout=5)
                if status == 200:
                    return
                last = (status, body[-2000:])
            except OSError as e:
                last = e
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"kube-apiserver not ready within {timeout}s ({last!r}):\n{proc.log()}")
            time.sleep(0.1)

    # -- controllers
    def _start_controllers(self, detach: bool, timeout: float) -> None:
        pki = self.pki
        kcm_kc = self.kubeconfig_for("system:kube-controller-manager", name="kube-controller-manager")
        sched_kc = self.kubeconfig_for("system:kube-scheduler", name="kube-scheduler")
        self._spawn(
            CONTROLLER_MANAGER,
            [
                binary(CONTROLLER_MANAGER),
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                f"--bind-address={HOST}",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--controllers=*,-nodeipam",
                "--profiling=false",
                "--v=1",
            ],
            detach,
        )
        self._spawn(
            SCHEDULER,
            [
                binary(SCHEDULER),
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                f"--bind-address={HOST}",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
            detach,
        )
        if self.node is None:
            self._start_kwok(detach)
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if not proc.alive():
                    raise RuntimeError(f"{name} exited with {proc.popen.returncode}:\n{proc.log()}")
            # the "default" ServiceAccount shows the controller-manager works; Ready nodes that kwok does
            sa = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
            ready = self._ready_nodes()
            if sa.returncode == 0 and len(ready) >= self.nodes:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"controllers not working within {timeout}s (default ServiceAccount: {sa.stderr.strip()!r}, "
                    f"Ready nodes: {ready})\n--- {CONTROLLER_MANAGER}:\n{self.log(CONTROLLER_MANAGER, 3000)}"
                    f"\n--- {KWOK}:\n{self.log(KWOK, 3000)}"
                )
            time.sleep(0.3)

    def _start_kwok(self, detach: bool) -> None:
        kwok_config = self.workdir / "kwok.yaml"
        # an explicit (empty) configuration, so a ~/.kwok/kwok.yaml of the user's does not leak in; with no
        # Stage in it kwok uses its default fast stages (nodes Ready at once, pods Running once scheduled)
        kwok_config.write_text("apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\n")
        self._spawn(
            KWOK,
            [
                binary(KWOK),
                f"--config={kwok_config}",
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector={}={}".format(*KWOK_NODE_ANNOTATION),
                f"--cidr={POD_CIDR}",
                f"--node-ip={HOST}",
                f"--server-address={HOST}:{free_port()}",
                "--node-lease-duration-seconds=40",
            ],
            detach,
        )
        for i in range(self.nodes):
            self.add_node(f"kwok-node-{i}", zone=f"zone-{'abc'[i % 3]}")

    def _ready_nodes(self) -> list[str]:
        out = self.kubectl("get", "nodes", "-o", "json", check=False)
        if out.returncode != 0:
            return []
        ready = []
        for n in json.loads(out.stdout)["items"]:
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                ready.append(n["metadata"]["name"])
        return ready

    def add_node(self, name: str, zone: str = "zone-a", cpu: str = "32", memory: str = "256Gi") -> None:
        """A fake Node that kwok keeps Ready (and whose pods it marks Running); not tainted, so any pod
        may land on it. Labels: kubernetes.io/hostname, topology.kubernetes.io/zone, type=kwok."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {
                    KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                    "node.alpha.kubernetes.io/ttl": "0",
                },
                "labels": {
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/hostname": name,
                    "topology.kubernetes.io/zone": zone,
                    "type": "kwok",
                },
            },
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            },
        }
        self.apply(node)

    # -- PKI and kubeconfigs
    def _ensure_pki(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        pki = self.pki
        pki.mkdir(parents=True, exist_ok=True)
        if not (pki / "front-proxy-client.key").exists():
            # the aggregation layer's client CA (requestheader authentication), which controller-manager and
            # scheduler read from kube-system/extension-apiserver-authentication
            fp_ca_cert, fp_ca_key = _new_cert("fleetmq-envtest-front-proxy-ca", is_ca=True)
            fp_cert, fp_key = _new_cert("front-proxy-client", ca=(fp_ca_cert, fp_ca_key), client=True)
            self._write_pki(
                {
                    "front-proxy-ca.crt": _cert_pem(fp_ca_cert),
                    "front-proxy-ca.key": _key_pem(fp_ca_key),
                    "front-proxy-client.crt": _cert_pem(fp_cert),
                    "front-proxy-client.key": _key_pem(fp_key),
                }
            )
        if (pki / "admin.key").exists():
            # made by an earlier start of this workdir: kubeconfigs handed out stay valid; the serving
            # certificate is made again when the API server's addresses changed (a real node's link)
            self._ensure_serving_cert()
            return
        ca_cert, ca_key = _new_cert("fleetmq-envtest-ca", is_ca=True)
        server_cert, server_key = self._new_serving_cert((ca_cert, ca_key))
        admin_cert, admin_key = _new_cert("admin", orgs=["system:masters"], ca=(ca_cert, ca_key), client=True)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        files = {
            "ca.crt": _cert_pem(ca_cert),
            "ca.key": _key_pem(ca_key),
            "apiserver.crt": _cert_pem(server_cert),
            "apiserver.key": _key_pem(server_key),
            "admin.crt": _cert_pem(admin_cert),
            "sa.key": _key_pem(sa_key),
            "sa.pub": sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            "admin.key": _key_pem(admin_key),  # last: its presence means the set is complete
        }
        self._write_pki(files)
        self._ensure_serving_cert()

    def _serving_ips(self) -> list[str]:
        return sorted({HOST, self.host, KUBERNETES_SERVICE_IP, self.kubernetes_service_ip})

    def _new_serving_cert(self, ca: tuple):
        dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
        dns.append("kubernetes.default.svc.cluster.local")
        return _new_cert("kube-apiserver", ca=ca, server=True, dns=dns, ips=self._serving_ips())

    def _ensure_serving_cert(self) -> None:
        x509, _, _, _, _, _ = _pki()
        cert = x509.load_pem_x509_certificate((self.pki / "apiserver.crt").read_bytes())
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            have = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
        except x509.ExtensionNotFound:
            have = set()
        if not set(self._serving_ips()) <= have:
            crt, key = self._new_serving_cert(self._ca())
            self._write_pki({"apiserver.crt": _cert_pem(crt), "apiserver.key": _key_pem(key)})
        if not (self.pki / "apiserver-kubelet-client.key").exists():
            # the API server's client certificate towards kubelets (logs, exec, port-forward)
            crt, key = _new_cert("kube-apiserver-kubelet-client", orgs=["system:masters"], ca=self._ca(),
                                 client=True)  # fmt: skip
            self._write_pki({"apiserver-kubelet-client.crt": _cert_pem(crt),
                             "apiserver-kubelet-client.key": _key_pem(key)})  # fmt: skip

    def serving_certificate(
        self, cn: str, *, dns: list[str] | tuple[str, ...] = (), ips: list[str] | tuple[str, ...] = ()
    ) -> tuple[bytes, bytes]:
        """A server certificate signed by the cluster's CA (PEM certificate, PEM key): a kubelet's."""
        crt, key = _new_cert(cn, ca=self._ca(), server=True, dns=dns, ips=ips, days=365)
        return _cert_pem(crt), _key_pem(key)

    def _write_pki(self, files: dict[str, bytes]) -> None:
        for fname, data in files.items():
            path = self.pki / fname
            path.write_bytes(data)
            if fname.endswith(".key"):
                path.chmod(0o600)

    def _ca(self):
        x509, _, serialization, _, _, _ = _pki()
        cert = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        key = serialization.load_pem_private_key((self.pki / "ca.key").read_bytes(), None)
        return cert, key

    def _admin_cert_data(self) -> dict:
        return {
            "client-certificate-data": _b64((self.pki / "admin.crt").read_bytes()),
            "client-key-data": _b64((self.pki / "admin.key").read_bytes()),
        }

    def _write_kubeconfig(
        self, path: Path, user: str, user_entry: dict, namespace: str | None = None
    ) -> Path:
        """A kubeconfig (JSON, which is YAML) with the CA and the server embedded, one user, one context."""
        ctx: dict = {"cluster": "envtest", "user": user}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": _b64(self.ca_file.read_bytes()),
                    },
                }
            ],
            "users": [{"name": user, "user": user_entry}],
            "contexts": [{"name": "envtest", "context": ctx}],
            "current-context": "envtest",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        path.chmod(0o600)
        return path

    def _safe(self, text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "user"

    def kubeconfig_for(
        self, user: str, groups: list[str] | tuple[str, ...] = (), *, name: str | None = None
    ) -> Path:
        """A kubeconfig authenticating as `user` in `groups` with a client certificate signed by the CA
        (CN=user, O=groups). Nothing is bound to it: RBAC decides what it may do."""
        cert, key = _new_cert(user, orgs=list(groups), ca=self._ca(), client=True, days=365)
        entry = {"client-certificate-data": _b64(_cert_pem(cert)), "client-key-data": _b64(_key_pem(key))}
        fname = name or self._safe("user-" + "-".join([user, *groups]))
        return self._write_kubeconfig(self.workdir / "kubeconfigs" / f"{fname}.kubeconfig", user, entry)

    @staticmethod
    def _split_sa(service_account: str) -> tuple[str, str]:
        ns, sep, name = service_account.partition("/")
        if not sep or not ns or not name:
            raise ValueError(f"service account must be 'namespace/name', not {service_account!r}")
        return ns, name

    @staticmethod
    def serviceaccount_username(service_account: str) -> str:
        ns, name = ControlPlane._split_sa(service_account)
        return f"system:serviceaccount:{ns}:{name}"

    def impersonating_kubeconfig(self, service_account: str) -> Path:
        """A kubeconfig whose admin certificate impersonates the ServiceAccount "ns/name" (user
        system:serviceaccount:ns:name, groups system:serviceaccounts, system:serviceaccounts:ns,
        system:authenticated), so every request is authorized as that ServiceAccount by RBAC. The
        ServiceAccount need not exist. kubectl, client-go and the operator's client (operator/kube.py)
        honour `as`/`as-groups`; the Python kubernetes client alone ignores them."""
        ns, _ = self._split_sa(service_account)
        entry = {
            **self._admin_cert_data(),
            "as": self.serviceaccount_username(service_account),
            "as-groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        }
        fname = self._safe("as-" + service_account)
        return self._write_kubeconfig(
            self.workdir / "kubeconfigs" / f"{fname}.kubeconfig", self._safe(service_account), entry, ns
        )

    def serviceaccount_token(self, service_account: str, duration: str = "24h") -> str:
        """A token of the existing ServiceAccount "ns/name" (TokenRequest API, `kubectl create token`)."""
        ns, name = self._split_sa(service_account)
        return self.kubectl("create", "token", name, "-n", ns, f"--duration={duration}").stdout.strip()

    def serviceaccount_kubeconfig(self, service_account: str, *, create: bool = False) -> Path:
        """A kubeconfig with a bearer token of the ServiceAccount "ns/name", which must exist (create=True
        creates it when missing). The apiserver authenticates it as that very ServiceAccount, so this works
        with any client (kopf, the Python kubernetes client, kubectl). Default namespace: ns."""
        ns, name = self._split_sa(service_account)
        if create:
            sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}
            self.apply(sa)
        entry = {"token": self.serviceaccount_token(service_account)}
        fname = self._safe("sa-" + service_account)
        return self._write_kubeconfig(
            self.workdir / "kubeconfigs" / f"{fname}.kubeconfig", self._safe(service_account), entry, ns
        )

    # -- kubectl
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess:
        """Run the machine's kubectl with the admin kubeconfig (or `kubeconfig`); text output. A non-zero
        exit raises KubectlError (with stdout and stderr in its message) unless check=False."""
        kubectl = binary("kubectl")
        if kubectl is None:
            raise RuntimeError(f"kubectl not found on PATH nor in {bin_dir()} (make envtest builds one)")
        argv = [
            kubectl,
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",  # not ~/.kube/cache
            *map(str, args),
        ]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        cp = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env)
        if check and cp.returncode != 0:
            raise KubectlError(cp.returncode, argv, cp.stdout, cp.stderr)
        return cp

    def apply(self, *objs: dict | str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """`kubectl apply -f -` of manifests: dicts (sent as one JSON List) or YAML/JSON text."""
        if all(isinstance(o, dict) for o in objs):
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
        else:
            text = "\n---\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs)
        return self.kubectl("apply", "-f", "-", input=text, check=check, **kw)

    def create_namespace(self, name: str, timeout: float = 30.0) -> str:
        """Create namespace `name`; with controllers, wait for its "default" ServiceAccount (pods need it)."""
        self.kubectl("create", "namespace", name)
        if self.controllers:
            deadline = time.monotonic() + timeout
            while self.kubectl("get", "sa", "default", "-n", name, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no default ServiceAccount in namespace {name} after {timeout}s")
                time.sleep(0.2)
        return name

    # -- state for the CLI
    def _write_state(self) -> None:
        state = {
            "url": self.url,
            "kubeconfig": str(self.kubeconfig),
            "version": self.version,
            "controllers": self.controllers,
            "node": "real" if self.node is not None else ("kwok" if self.nodes else "none"),
            "service_cidr": self.service_cidr,
            "pids": {n: p.pid for n, p in self.procs.items()},
        }
        if self.node is not None and self.node.pod_cidr:
            state["pod_cidr"] = self.node.pod_cidr
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    def __repr__(self) -> str:
        state = "running" if self.alive() else "stopped"
        return f"<ControlPlane {self.url} {state} procs={list(self.procs)} dir={self.workdir}>"


@atexit.register
def _kill_leftovers() -> None:
    for p in list(LIVE_PROCS):
        with contextlib.suppress(Exception):
            p.kill()


# ------------------------------------------------------------------ CLI (make dev-cluster)
def _pid_running(pid: int, binary_name: str) -> bool:
    """True when pid is alive and still runs `binary_name` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(cmdline) == binary_name or cmdline.endswith("/" + binary_name)


_ORDER = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK)


def _running_pids(workdir: Path) -> dict[str, int]:
    out = {}
    for name in _ORDER:
        with contextlib.suppress(OSError, ValueError):
            pid = int((workdir / f"{name}.pid").read_text())
            if _pid_running(pid, name):
                out[name] = pid
    return out


def down(workdir: Path, timeout: float = 15.0) -> list[str]:
    """Stop the processes a detached `up` left in workdir (pid files), newest first, a real node's first.
    Returns their names."""
    from tests import realnode

    stopped = []
    problems = realnode.down(workdir / "node")
    if problems is not None:
        stopped.append("real node")
        for p in problems:
            print(f"real node: {p}", file=sys.stderr)
    running = _running_pids(workdir)
    for name in reversed(_ORDER):
        pid = running.get(name)
        if pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_running(pid, name) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_running(pid, name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stopped.append(name)
    for name in _ORDER:
        with contextlib.suppress(OSError):
            (workdir / f"{name}.pid").unlink()
    return stopped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.kubeapi", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--dir", type=Path, required=True, help="work folder (PKI, etcd data, logs, kubeconfig)")
    ap.add_argument("--controllers", choices=["yes", "no", "auto"], default="auto",
                    help="also start controller-manager, scheduler and kwok (auto: when built)")  # fmt: skip
    ap.add_argument("--nodes", type=int, default=3, help="fake kwok nodes with --controllers (default 3)")
    ap.add_argument("--node", choices=["kwok", "real"], default="kwok",
                    help="real: one real node (containerd, kubelet, kube-proxy, CoreDNS) instead of kwok's")  # fmt: skip
    ap.add_argument(
        "--images", type=Path, help="with --node real: import every *.tar image archive of this folder"
    )
    a = ap.parse_args(argv)
    workdir = a.dir.resolve()
    kubeconfig = workdir / "admin.kubeconfig"
    if a.command == "down":
        stopped = down(workdir)
        print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running in {workdir}")
        return 0
    running = _running_pids(workdir)
    if a.command == "status":
        if not running:
            print(f"not running ({workdir})")
            return 1
        state = json.loads((workdir / "state.json").read_text())
        print(
            f"running: {state['url']} ({state['version']}) "
            + " ".join(f"{n}={p}" for n, p in running.items())
        )
        if state.get("node") == "real":
            print(f"real node: pods {state.get('pod_cidr')}, Services {state['service_cidr']}")
        print(f"export KUBECONFIG={kubeconfig}")
        return 0
    if running:
        print(f"already running in {workdir}: " + " ".join(f"{n}={p}" for n, p in running.items()))
        print(f"export KUBECONFIG={kubeconfig}")
        return 0
    real = a.node == "real"
    controllers = real or a.controllers == "yes" or (a.controllers == "auto" and controllers_available())
    t0 = time.monotonic()
    cp = ControlPlane(workdir).start(controllers=controllers, nodes=a.nodes, detach=True, real_node=real)
    what = "etcd, kube-apiserver" + (", kube-controller-manager, kube-scheduler" if controllers else "")
    if real:
        what += f", a real node (containerd, kubelet, kube-proxy, CoreDNS; pods {cp.node.pod_cidr}, "
        what += f"Services {cp.service_cidr}, both routed from this machine)"
    elif controllers:
        what += ", kwok"
    if real and a.images:
        archives = sorted(a.images.glob("*.tar"))
        cp.node.import_images(archives)
        what += f"; images: {', '.join(cp.node.images())}"
    print(f"{what} {cp.version} up at {cp.url} in {time.monotonic() - t0:.1f}s (logs and pids in {workdir})")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
