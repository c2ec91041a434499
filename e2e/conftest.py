"""The e2e cluster, chosen by E2E_CLUSTER (e2e/run.sh, `make e2e`, sets it and checks the preconditions):

- real (default): the project's test control plane with a real node (tests/realnode.py): containerd, kubelet,
  kube-proxy, CoreDNS; the images (scripts/image.sh IMAGE_SAVE=...) imported into its containerd from the
  archives in FLEETMQ_IMAGE_ARCHIVES. Pod and Service addresses are routed from this machine, so clients
  connect to them directly. At the end the machine must be as the node found it (links, addresses, routes,
  nftables, mounts, cgroups, sysctls), else the session ends in an error.
- kind: a kind cluster (scripts/kind.sh: the machine's Docker engine, else a private Debian dockerd; the
  node image built locally, E2E_NODE_IMAGE), the images loaded with `kind load`; clients go through
  `kubectl port-forward`.
- existing: the cluster of `make dev-cluster NODE=real` (E2E_DEV_DIR, default ~/.cache/fleetmq/dev-cluster),
  left running afterwards; for working on the tests.

E2E_KEEP=1 keeps the cluster (real: detached, in ~/.cache/fleetmq/e2e-kept, not in pytest's temporary
folders, which pytest deletes a few runs later; run more tests on it with E2E_CLUSTER=existing
E2E_DEV_DIR=that folder, stop it with `python -m tests.kubeapi down --dir` that folder).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "fleetmq"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"fleetmq/broker:{VERSION}"  # the default of the chart and of BrokerFleet.spec.image
KIND_CLUSTER = "fleetmq-e2e"
KIND_SERVICE_CIDR = "10.96.0.0/16"  # kind's default serviceSubnet
RELEASE, RELEASE_NS, APP_NS = "fleetmq", "fleetmq-system", "mqtt"
CLUSTER = os.environ.get("E2E_CLUSTER", "real")
CACHE = Path(os.environ.get("CACHE") or Path.home() / ".cache" / "fleetmq")


def run(*argv: Any, timeout: float = 600, check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    cp = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return cp


def tool(name: str) -> str:
    path = os.environ.get(f"FLEETMQ_{name.upper()}")
    if not path:
        pytest.fail(f"FLEETMQ_{name.upper()} is not set: run the e2e with `make e2e` (e2e/run.sh)")
    return path


def wait_for(
    pred, timeout: float = 180.0, interval: float = 1.0, msg: str | Callable[[], str] = "condition"
) -> Any:
    """`pred()` once it is true; an AssertionError naming `msg` (a callable: what it says then) after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except Exception as e:  # retried until the deadline, then reported
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    said = msg() if callable(msg) else msg
    raise AssertionError(f"timed out after {timeout}s waiting for {said} (last: {last!r})")


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_bin: str
    helm_bin: str
    kind: str  # real | kind | existing
    node: Any = None  # tests.realnode.RealNode on a real node
    service_cidr: str = ""
    routed: bool = False  # a kind node this machine routes the pod and Service networks to

    @property
    def routable(self) -> bool:
        """Pod and Service addresses reach the pods from this machine (a real node, a routed kind node)."""
        return self.node is not None or self.routed

    def kubectl(self, *args: Any, input: str | None = None, check: bool = True, timeout: float = 300):
        return run(
            self.kubectl_bin,
            f"--kubeconfig={self.kubeconfig}",
            *args,
            input=input,
            check=check,
            timeout=timeout,
        )

    def helm(self, *args: Any, check: bool = True, timeout: float = 600):
        return run(self.helm_bin, f"--kubeconfig={self.kubeconfig}", *args, check=check, timeout=timeout)

    def env(self) -> dict[str, str]:
        """The environment of a person at a shell with this cluster: KUBECONFIG, kubectl and helm on PATH."""
        path = os.pathsep.join([str(Path(self.kubectl_bin).parent), str(Path(self.helm_bin).parent)])
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": path + os.pathsep + os.environ["PATH"],
        }

    def get(self, kind: str, name: str, ns: str = APP_NS) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pods(self, selector: str, ns: str = APP_NS) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json")
        return json.loads(out.stdout)["items"]

    def readyz(self, pod: str, port: int = 9100, ns: str = APP_NS) -> dict[str, Any]:
        """A broker's /readyz, through the apiserver's pod proxy."""
        out = self.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/readyz")
        return json.loads(out.stdout)

    def condition(self, kind: str, name: str, type_: str, ns: str = APP_NS) -> dict[str, Any]:
        obj = self.get(kind, name, ns) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    def endpoint(self, target: str, port: int, ns: str = APP_NS) -> Endpoint:
        """How this machine reaches `target` ("svc/NAME" or "pod/NAME") on `port`: directly on a real node,
        through `kubectl port-forward` elsewhere."""
        return Direct(self, target, port, ns) if self.routable else PortForward(self, target, port, ns)

    def diagnose(self) -> list[tuple[str, str]]:
        """What a person would look at when a test fails: the fleet's objects and status, the pods and
        their labels, the client Services' endpoints, recent events, and the operator's and the brokers'
        latest log lines (as report sections: title, text)."""

        def out(*args: Any, timeout: float = 30) -> str:
            try:
                cp = self.kubectl(*args, check=False, timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"<kubectl {' '.join(map(str, args))}: no answer in {timeout}s>"
            return (cp.stdout + cp.stderr).strip() or "<empty>"

        objects = out(
            "get", "brokerfleets,mqttzones,statefulsets,pods", "-n", APP_NS, "-o", "wide", "--show-labels"
        )
        events = out("get", "events", "-n", APP_NS, "--sort-by=.lastTimestamp").splitlines()[-40:]
        sections = [
            ("fleet objects", objects),
            (
                "brokerfleet status",
                out("get", "brokerfleets", "-n", APP_NS, "-o", "jsonpath={.items[*].status}"),
            ),
            ("client Services' endpoints", out("get", "endpointslices", "-n", APP_NS, "-o", "wide")),
            ("events (latest)", "\n".join(events)),
            (
                "operator log (tail)",
                out("logs", "-n", RELEASE_NS, "deployment/fleetmq-operator", "--tail=80"),
            ),
        ]
        pods = out("get", "pods", "-n", APP_NS, "-l", "app.kubernetes.io/component=broker", "-o", "name")
        for pod in pods.split() if pods.startswith("pod/") else []:
            sections.append((f"{pod} log (tail)", out("logs", "-n", APP_NS, pod, "--tail=40")))
        return sections

    def tag_image(self, src: str, dst: str) -> None:
        """Make image `dst` a second name of `src` on the node(s), as pushing a new tag would."""
        if self.node is not None:
            src_ref, dst_ref = normalize(src), normalize(dst)
            if dst_ref not in self.node.images():
                run(
                    "ctr",
                    f"--address={self.node.socket}",
                    "--namespace=k8s.io",
                    "images",
                    "tag",
                    src_ref,
                    dst_ref,
                )
        else:  # in the kind node's containerd (the images came as archives: the engine has none of them)
            node = f"{KIND_CLUSTER}-control-plane"
            ctr = ("docker", "exec", node, "ctr", "--namespace=k8s.io", "images")
            run(*ctr, "tag", "--force", normalize(src), normalize(dst))

    def run_pod(
        self,
        name: str,
        image: str,
        command: list[str],
        ns: str = "default",
        *,
        spec: dict[str, Any] | None = None,
        timeout: float = 180,
    ) -> tuple[str, str]:
        """Run a one-off pod to completion; returns (phase, logs)."""
        spec = dict(spec or {})
        container = {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": command}
        container.update(*spec.pop("containers", []))  # what the caller adds to the one container
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec},
        }
        self.kubectl("delete", "pod", name, "-n", ns, "--ignore-not-found", "--wait")
        self.kubectl("apply", "-f", "-", input=json.dumps(pod))
        phase = wait_for(
            lambda: (
                (self.get("pod", name, ns) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")
                and self.get("pod", name, ns)["status"]["phase"]
            ),
            timeout=timeout,
            msg=f"pod {ns}/{name} to finish",
        )
        logs = self.kubectl("logs", "-n", ns, name, check=False)
        return phase, logs.stdout + logs.stderr


def normalize(ref: str) -> str:
    """An image reference as containerd stores it (Docker's normalization): fleetmq/broker:1 is
    docker.io/fleetmq/broker:1, redis:7 is docker.io/library/redis:7."""
    first, sep, _ = ref.partition("/")
    if not sep:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


@dataclass
class Direct:
    """A Service's ClusterIP or a pod's IP, reached without a tunnel (the real node routes them here)."""

    cluster: Cluster
    target: str
    port: int
    ns: str = APP_NS
    host: str = ""

    @property
    def local(self) -> int:
        return self.port

    def start(self) -> Direct:
        kind, _, name = self.target.partition("/")
        obj = self.cluster.get("service" if kind == "svc" else "pod", name, self.ns)
        if obj is None:
            raise RuntimeError(f"{self.target} not found")
        if kind == "svc":
            self.host = obj["spec"]["clusterIP"]
        else:
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in obj["status"].get("conditions", [])
            )
            if not ready or not obj["status"].get("podIP") or obj["metadata"].get("deletionTimestamp"):
                raise RuntimeError(f"{self.target} is not ready")
            self.host = obj["status"]["podIP"]
        return self

    def alive(self) -> bool:
        if not self.host:
            return False
        if self.target.startswith("svc/"):
            return True
        with contextlib.suppress(RuntimeError):
            return Direct(self.cluster, self.target, self.port, self.ns).start().host == self.host
        return False

    def stop(self) -> None:
        pass


@dataclass
class PortForward:
    """`kubectl port-forward TARGET :PORT` on a free local port; restarted by whoever needs it again."""

    cluster: Cluster
    target: str
    port: int
    ns: str = APP_NS
    local: int = 0
    host: str = "127.0.0.1"
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> PortForward:
        c = self.cluster
        self.proc = subprocess.Popen(
            [
                c.kubectl_bin,
                f"--kubeconfig={c.kubeconfig}",
                "port-forward",
                "-n",
                self.ns,
                self.target,
                f":{self.port}",
                "--address=127.0.0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 1883"
        m = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"port-forward {self.target}: {line}")
        self.local = int(m.group(1))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


Endpoint = Direct | PortForward


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the cluster's state at that moment (Cluster.diagnose): CI keeps
    only the output, and the cluster is gone by the time anyone reads it."""
    rep = yield
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if rep.failed and rep.when == "call" and isinstance(cluster, Cluster):
        try:
            rep.sections.extend((f"cluster at failure: {t}", text) for t, text in cluster.diagnose())
        except Exception as e:  # the report of the failure itself comes first
            rep.sections.append(("cluster at failure", f"<cannot read the cluster: {e!r}>"))
    return rep


@pytest.fixture(autouse=True)
def _collect_clients() -> Iterator[None]:
    """A test's MQTT clients are collected when it ends: paho keeps two sockets per client until then,
    and a process past 1,024 descriptors leaves new paho clients hanging (load.fd_room)."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    if CLUSTER == "kind":
        yield from _kind_cluster(tmp_path_factory)
    elif CLUSTER == "real":
        yield from _real_cluster(tmp_path_factory)
    elif CLUSTER == "existing":
        yield from _existing_cluster()
    else:
        pytest.fail(f"E2E_CLUSTER={CLUSTER}: real, kind or existing")


def _archives() -> list[Path]:
    archives = [Path(p) for p in os.environ.get("FLEETMQ_IMAGE_ARCHIVES", "").split(os.pathsep) if p]
    if not archives:
        pytest.fail("FLEETMQ_IMAGE_ARCHIVES is not set: run the e2e with `make e2e` (e2e/run.sh)")
    return archives


def _real_cluster(tmp_path_factory) -> Iterator[Cluster]:
    from tests import kubeapi, realnode

    missing = realnode.preflight()
    if missing:
        pytest.fail("this machine cannot run the real node: " + "; ".join(missing))
    keep = bool(os.environ.get("E2E_KEEP"))
    before = realnode.machine_state()
    workdir = CACHE / "e2e-kept" if keep else tmp_path_factory.mktemp("kube")
    if keep and workdir.exists():
        kubeapi.down(workdir)
        shutil.rmtree(workdir)
    cp = kubeapi.ControlPlane(workdir)
    try:
        t0 = time.monotonic()
        cp.start(real_node=True, detach=keep, timeout=120)
        cp.node.import_images(_archives())
        print(f"\nreal node up with the images in {time.monotonic() - t0:.0f}s: {cp.url}, {cp.workdir}")
        yield Cluster(cp.kubeconfig, tool("kubectl"), tool("helm"), "real", cp.node, cp.service_cidr)
    finally:
        if keep:
            print(f"\nE2E_KEEP: export KUBECONFIG={cp.kubeconfig}; more tests: E2E_CLUSTER=existing "
                  f"E2E_DEV_DIR={workdir}; stop: python -m tests.kubeapi down --dir {workdir}")  # fmt: skip
        else:
            problems = cp.stop()
            diff = realnode.diff_state(before, realnode.machine_state())
            assert not problems and not diff, f"the machine is not as the node found it: {problems} {diff}"


def _existing_cluster() -> Iterator[Cluster]:
    from tests import realnode

    workdir = Path(os.environ.get("E2E_DEV_DIR") or CACHE / "dev-cluster")
    state = json.loads((workdir / "state.json").read_text())
    node_state = json.loads((workdir / "node" / "node.json").read_text())
    node = realnode.RealNode(workdir / "node", id=node_state["id"], link_cidr=node_state["link_cidr"],
                             pod_cidr=node_state["pod_cidr"], service_cidr=node_state["service_cidr"])  # fmt: skip
    node.import_images(_archives())  # what changed since it started (the images of this run)
    yield Cluster(
        Path(state["kubeconfig"]), tool("kubectl"), tool("helm"), "existing", node, state["service_cidr"]
    )


def _kind_cluster(tmp_path_factory) -> Iterator[Cluster]:
    kind = tool("kind")
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    existing = run(kind, "get", "clusters").stdout.split()
    if KIND_CLUSTER in existing:
        run(kind, "delete", "cluster", "--name", KIND_CLUSTER)
    node_image = os.environ.get("E2E_NODE_IMAGE")
    run(
        kind,
        "create",
        "cluster",
        "--name",
        KIND_CLUSTER,
        f"--kubeconfig={kubeconfig}",
        "--wait=180s",
        *([f"--image={node_image}"] if node_image else []),
        timeout=900,
    )
    try:
        for archive in _archives():
            run(kind, "load", "image-archive", archive, "--name", KIND_CLUSTER, timeout=600)
        cluster = Cluster(kubeconfig, tool("kubectl"), tool("helm"), "kind")
        _kind_as_the_real_node(cluster)
        yield cluster
    finally:
        if not os.environ.get("E2E_KEEP"):
            run(kind, "delete", "cluster", "--name", KIND_CLUSTER, check=False)


def _kind_as_the_real_node(c: Cluster) -> None:
    """What the real node has and a kind node built here lacks. Storage: kind's fallback class provisions
    host paths only root may write to (its local-path provisioner is an image no registry serves here), so
    static local volumes any user may write to, as on the real node (realnode.local_storage). DNS: the
    node has no way out (its engine adds no NAT), so CoreDNS answers for the cluster alone instead of
    forwarding, as on the real node; forwarded, a search-domain query timed out and a pod's lookup of a
    Service failed."""
    from tests import realnode

    node = f"{KIND_CLUSTER}-control-plane"
    paths = [f"/var/local-volumes/pv-{i}" for i in range(realnode.STATIC_VOLUMES)]
    run("docker", "exec", node, "sh", "-c", f"mkdir -p {' '.join(paths)} && chmod 0777 {' '.join(paths)}")
    c.kubectl("annotate", "storageclass", "standard", "storageclass.kubernetes.io/is-default-class-",
              check=False)  # fmt: skip
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                   "items": realnode.local_storage(node, paths)}))  # fmt: skip
    corefile = json.loads(c.kubectl("get", "configmap", "coredns", "-n", "kube-system", "-o", "json").stdout)
    text = re.sub(r"\n\s*forward \. [^{\n]*(\{[^}]*\})?", "", corefile["data"]["Corefile"])
    c.kubectl("patch", "configmap", "coredns", "-n", "kube-system", "--type=merge",
              "-p", json.dumps({"data": {"Corefile": text}}))  # fmt: skip
    c.kubectl("rollout", "restart", "deployment/coredns", "-n", "kube-system")
    c.kubectl("rollout", "status", "deployment/coredns", "-n", "kube-system", "--timeout=120s")
    # CPU: the real node's control plane runs outside it, kind's in static pods on the node, whose CPU
    # requests (850m with CoreDNS) left the README's fleet one sentinel short on 2 cores; they go (the
    # pods keep running as before, only the scheduler's books change), and CoreDNS runs once
    c.kubectl("scale", "deployment/coredns", "-n", "kube-system", "--replicas=1")
    # (then nothing until the API server is back: restarting, it refused requests it had not yet the
    # authorization caches for)
    run("docker", "exec", node, "sh", "-c",
        r"sed -i -E '/^ *cpu: [0-9]+m?$/d' /etc/kubernetes/manifests/*.yaml")  # fmt: skip

    def requests_dropped() -> bool:
        out = c.kubectl("get", "pods", "-n", "kube-system", "-o", "json", check=False)
        if out.returncode != 0:
            return False  # (the API server restarting)
        pods = [p for p in json.loads(out.stdout)["items"] if p["metadata"]["name"].endswith(node)]
        return len(pods) == 4 and all(
            "cpu" not in ((ctr.get("resources") or {}).get("requests") or {})
            and any(cs.get("ready") for cs in (p.get("status") or {}).get("containerStatuses") or [])
            for p in pods
            for ctr in p["spec"]["containers"]
        )

    wait_for(requests_dropped, timeout=180, msg="the control plane's static pods without CPU requests")
    # kube-proxy's watches broke with the API server's restart; until they are back it still rejects
    # Services made since (a first run found a new Service refusing connections): started afresh
    c.kubectl("rollout", "restart", "daemonset/kube-proxy", "-n", "kube-system")
    c.kubectl("rollout", "status", "daemonset/kube-proxy", "-n", "kube-system", "--timeout=120s")
    # Routes: clients reach pods and Services directly, as on the real node, not through `kubectl
    # port-forward`, which pins a forwarded Service to one pod (no spread to rebalance, a rollout breaks
    # it). The node's kube-proxy takes Service addresses coming in; the routes go with kind's bridge.
    if shutil.which("ip") and os.geteuid() == 0:
        inspect = run(
            "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", node
        )
        node_ip = inspect.stdout.strip()
        pod_cidr = c.kubectl("get", "node", node, "-o", "jsonpath={.spec.podCIDR}").stdout.strip()
        for cidr in (pod_cidr, KIND_SERVICE_CIDR):
            run("ip", "route", "replace", cidr, "via", node_ip)
        c.routed, c.service_cidr = True, KIND_SERVICE_CIDR


@pytest.fixture
def endpoints() -> Iterator[list[Endpoint]]:
    """Endpoints a test opened (port-forwards are stopped at its end)."""
    started: list[Endpoint] = []
    yield started
    for ep in started:
        ep.stop()


def manifests(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
