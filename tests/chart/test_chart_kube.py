"""The Helm chart against a real kube-apiserver (tests/kubeapi.py): every rendered manifest validated by the
server (`kubectl apply --dry-run=server --validate=strict`, in a namespace enforcing the "restricted" Pod
Security Standard), and `helm install`, after which the operator, started with the chart's Deployment's own
command line and a token of the chart's ServiceAccount, reconciles the chart's example fleet: the chart's
RBAC is enough. `helm uninstall` then leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kubeapi
from tests.operator.conftest import wait_for
from tests.support import free_port

from .conftest import CHART, CUSTOM, EXAMPLES, MONITORING, find

pytestmark = pytest.mark.envtest

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no Prometheus Operator CRDs here


@pytest.fixture(scope="session")
def chart_crds(control_plane) -> None:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    kubeapi.wait_established(control_plane.kubectl)


@pytest.fixture
def ns(control_plane, kube_namespace) -> str:
    control_plane.kubectl("label", "namespace", kube_namespace, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    return kube_namespace


def get(cp, kind: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
    out = cp.kubectl("get", kind, name, *(["-n", ns] if ns else []), "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


# --------------------------------------------------------------------------------- server validation
VALUE_SETS = {
    "defaults": (None, ()),
    "examples": (EXAMPLES, ()),
    "monitoring": (None, MONITORING),
    "custom": (CUSTOM, ()),
    "pipeline": ({"pipeline": {"enabled": True, "redisPasswordSecretRef": {"name": "redis"}}}, ()),
    "standalone-no-dashboards": (
        {"operator": {"peering": {"name": ""}}, "dashboards": {"enabled": False}},
        (),
    ),
}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_manifests_pass_the_apiserver(helm, control_plane, chart_crds, ns, name):
    values, extra = VALUE_SETS[name]
    if values is CUSTOM:  # its KopfPeerings go to the watched namespaces, which must exist
        values = {**CUSTOM, "operator": {**CUSTOM["operator"], "watchNamespaces": [ns]}}
    manifests = helm.template(values, *extra, release=f"r{uuid.uuid4().hex[:6]}", namespace=ns)
    checked = [m for m in manifests if m["kind"] not in MONITORING_KINDS]
    assert {m["kind"] for m in manifests} - {m["kind"] for m in checked} == (
        MONITORING_KINDS if extra else set()
    )
    out = control_plane.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input="\n---\n".join(yaml.safe_dump(m) for m in checked),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(checked) and all(line.endswith("(server dry run)") for line in lines), out.stdout
    # nothing the restricted Pod Security Standard would refuse (Pods are refused, Deployments warned)
    assert "PodSecurity" not in out.stderr, out.stderr


def test_the_default_view_and_edit_roles_let_users_read_and_change_fleetmq_resources(
    helm, control_plane, chart_crds, ns
):
    """The chart's aggregated ClusterRoles, applied to a control plane whose controller-manager aggregates
    roles: a user with `view` in a namespace reads BrokerFleets there and changes nothing; one with `edit`
    creates them and scales them."""
    cp = control_plane
    if not cp.controllers:
        pytest.skip("needs kube-controller-manager's ClusterRole aggregation (make envtest)")
    release = f"r{uuid.uuid4().hex[:6]}"
    roles = [m for m in helm.template(release=release, namespace=ns)
             if m["kind"] == "ClusterRole" and m["metadata"]["name"].endswith(("-view", "-edit"))]  # fmt: skip
    assert len(roles) == 2
    cp.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(r) for r in roles))
    users = {role: f"{role}er-{release}" for role in ("view", "edit")}
    try:
        for role, user in users.items():
            cp.kubectl("create", "rolebinding", user, f"--clusterrole={role}", f"--user={user}", "-n", ns)

        def can(user: str, verb: str, resource: str) -> bool:
            kc = cp.kubeconfig_for(user)
            out = cp.kubectl("auth", "can-i", verb, resource, "-n", ns, kubeconfig=kc, check=False)
            return out.stdout.strip() == "yes"

        wait_for(lambda: can(users["view"], "list", "brokerfleets.fleetmq.io"), timeout=60,
                 msg="view aggregated the fleetmq roles")  # fmt: skip
        wait_for(lambda: can(users["edit"], "create", "brokerfleets.fleetmq.io"), timeout=60,
                 msg="edit aggregated the fleetmq roles")  # fmt: skip
        for resource in ("mqttzones", "mqttbridges", "mqttusers"):
            assert can(users["view"], "get", f"{resource}.fleetmq.io") and can(
                users["edit"], "delete", f"{resource}.fleetmq.io"
            )
            assert not can(users["view"], "patch", f"{resource}.fleetmq.io")
        assert can(users["edit"], "patch", "brokerfleets.fleetmq.io/scale")
        assert not can(users["view"], "create", "brokerfleets.fleetmq.io")
    finally:
        for r in roles:
            cp.kubectl("delete", "clusterrole", r["metadata"]["name"], "--ignore-not-found")


def test_bad_example_spec_is_refused_by_the_crd(helm, control_plane, chart_crds, ns):
    """The values schema leaves the example specs to the CRDs, which refuse them with the field's path."""
    values = {"examples": {"enabled": True, "fleet": {"spec": {"replicas": -1, "redis": {"managed": True}}}}}
    manifests = helm.template(values, namespace=ns)
    fleet = find(manifests, "BrokerFleet")
    out = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(fleet), check=False)
    assert out.returncode != 0
    assert "spec.replicas" in out.stderr and "should be greater than or equal to 0" in out.stderr


def notes(helm, cp, ns: str, *args: str, chart: Path = CHART) -> str:
    out = helm("install", "fleetmq", chart, "--dry-run=server", "-n", ns, *args, kubeconfig=cp.kubeconfig)
    return out.stdout[out.stdout.index("NOTES:") :]


def test_notes_tell_the_next_steps(helm, control_plane, chart_crds, ns):
    text = notes(helm, control_plane, ns)
    assert f"kubectl -n {ns} rollout status deployment/fleetmq-operator" in text
    assert "kind: BrokerFleet" in text and "kind: MqttZone" in text and "kubectl apply -f -" in text
    dashboards = len(list((CHART / "dashboards").glob("*.json")))
    assert f"{dashboards} dashboards (ConfigMaps labelled grafana_dashboard=1 in namespace {ns})" in text
    assert "kubectl port-forward svc/edge-external-mqtt 1883:1883" in text
    # the console: the generated admin key and the API's Service (spec.api, shown in the fleet applied above)
    assert "api: {enabled: true}" in text
    assert f"kubectl -n {ns} get secret edge-api-keys -o jsonpath='{{.data.admin-key}}'" in text
    assert f"kubectl -n {ns} port-forward svc/edge-api 8081:8081" in text
    # (other tests on this API server may have installed the Prometheus Operator's CRDs)
    prometheus_operator = (
        control_plane.kubectl("get", "crd", "servicemonitors.monitoring.coreos.com", check=False).returncode
        == 0
    )
    if prometheus_operator:
        assert "Prometheus scrapes the operator through ServiceMonitor" in text
    else:
        assert "The Prometheus Operator is not installed" in text
    assert f"helm test fleetmq -n {ns}" in notes(helm, control_plane, ns, "--set", "examples.enabled=true")


def test_notes_without_dashboards(helm, control_plane, chart_crds, ns, tmp_path):
    chart = tmp_path / "fleetmq"
    shutil.copytree(CHART, chart)
    shutil.rmtree(chart / "dashboards")
    assert "no dashboards were installed" in notes(helm, control_plane, ns, chart=chart)
    assert "no dashboards were installed" in notes(
        helm, control_plane, ns, "--set", "dashboards.enabled=false"
    )


# ------------------------------------------------------------------------------ install and reconcile
def start_operator(args: list[str], kubeconfig: Path, log: Path) -> subprocess.Popen:
    """`fleetmq-operator ARGS`, run here (no kubelet) with a token of the chart's ServiceAccount instead of
    the one mounted in the pod."""
    exe = Path(sys.executable).with_name("fleetmq-operator")
    env = {**os.environ, "FLEETMQ_WATCH_SERVER_TIMEOUT": "60"}
    env.pop("KUBECONFIG", None)
    with log.open("w") as f:
        return subprocess.Popen([str(exe), *args, f"--kubeconfig={kubeconfig}"], stdout=f,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_helm_install_operator_as_chart_serviceaccount_reconciles_example_then_uninstall(
    helm, control_plane, ns, tmp_path
):
    cp = control_plane
    release = f"fq{uuid.uuid4().hex[:6]}"
    full = f"{release}-fleetmq"
    crds_before = cp.kubectl("get", "crd", "brokerfleets.fleetmq.io", check=False).returncode == 0
    metrics, liveness = free_port(), free_port()
    values = {
        # the managed Redis on emptyDirs: no volume provisioner in the test cluster
        "examples": {
            "enabled": True,
            "fleet": {"spec": {"replicas": 2, "redis": {"managed": True, "storage": ""}}},
        },
        "operator": {
            "replicas": 2,
            "watchNamespaces": [ns],
            "ports": {"metrics": metrics, "liveness": liveness},
            "resyncSeconds": 2,
        },
    }
    t0 = time.monotonic()
    out = helm(
        "install", release, CHART, "--namespace", ns, *helm.values_file(values), kubeconfig=cp.kubeconfig
    )
    assert "STATUS: deployed" in out.stdout and f"helm test {release} -n {ns}" in out.stdout
    for crd in ("brokerfleets.fleetmq.io", "mqttzones.fleetmq.io", "kopfpeerings.kopf.dev"):
        assert get(cp, "crd", crd), f"{crd} not installed (from the chart's crds/)"
    print(
        f"helm install: {time.monotonic() - t0:.1f}s (CRDs {'were there' if crds_before else 'installed'}; controllers {cp.controllers})"
    )
    assert get(cp, "clusterrole", f"{full}-operator") and get(cp, "kopfpeering", "fleetmq", ns)
    dep = get(cp, "deployment", f"{full}-operator", ns)
    assert dep, "no operator Deployment"
    pod = dep["spec"]["template"]["spec"]
    sa = pod["serviceAccountName"]
    assert get(cp, "serviceaccount", sa, ns)

    if cp.controllers:  # its pod is admitted in a namespace enforcing the restricted Pod Security Standard
        selector = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
        wait_for(
            lambda: cp.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "name").stdout.strip(),
            msg="operator pod created",
        )
    # two replicas, as the Deployment runs them: its command line, each with its own (random) priority; the
    # second one's probe and metrics ports moved, since here both share one network namespace
    container = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2 and container["command"] == ["fleetmq-operator"]
    other = [a.replace(f":{liveness}/", f":{free_port()}/").replace(f":{metrics}", f":{free_port()}")
             for a in container["args"]]  # fmt: skip
    assert other != container["args"]
    kubeconfig = cp.serviceaccount_kubeconfig(f"{ns}/{sa}")
    logs = [tmp_path / "operator-0.log", tmp_path / "operator-1.log"]
    procs = [
        start_operator(args, kubeconfig, log)
        for args, log in zip([container["args"], other], logs, strict=True)
    ]
    try:
        # children of the example fleet, owned by it
        fleet = wait_for(lambda: get(cp, "brokerfleet", "edge", ns), msg="example fleet")
        children = [
            ("configmap", "edge-config"),
            ("statefulset", "edge"),
            ("service", "edge-headless"),
            ("service", "edge-external-mqtt"),
            ("service", "edge-external-ws"),
            ("poddisruptionbudget", "edge"),
            ("statefulset", "edge-redis"),
            ("service", "edge-redis"),
            ("statefulset", "edge-redis-sentinel"),
            ("service", "edge-redis-sentinel"),
            ("secret", "edge-redis-auth"),
        ]
        for kind, name in children:
            obj = wait_for(lambda k=kind, n=name: get(cp, k, n, ns), msg=f"{kind} {name}")
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"]) == ("BrokerFleet", fleet["metadata"]["uid"])
        assert get(cp, "statefulset", "edge", ns)["spec"]["replicas"] == 2
        image = get(cp, "statefulset", "edge", ns)["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == pod["containers"][0]["image"]  # the brokers run the operator's image

        # status patched on both resources
        def conditions(kind: str, name: str) -> dict[str, dict[str, Any]]:
            obj = get(cp, kind, name, ns) or {}
            return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}

        conds = wait_for(lambda: (c := conditions("brokerfleet", "edge")) and len(c) == 5 and c, msg="status")
        assert set(conds) == {"Ready", "Progressing", "ConfigApplied", "Degraded", "StoreReady"}
        assert all(c["observedGeneration"] == fleet["metadata"]["generation"] for c in conds.values())
        assert conds["Degraded"]["status"] == "False"
        wait_for(
            lambda: conditions("mqttzone", "external")["Accepted"]["status"] == "True", msg="zone accepted"
        )

        # the probe and the metrics the Deployment declares answer where it says
        probe = pod["containers"][0]["livenessProbe"]["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
        assert (ports[probe["port"]], ports["metrics"]) == (liveness, metrics)
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{liveness}{probe['path']}")[0] == 200, msg="live")
        text = wait_for(lambda: http_get(f"http://127.0.0.1:{metrics}/metrics")[1], msg="metrics")
        assert 'fleetmq_operator_reconciles_total{result="ok"}' in text
        # kopf peering through the chart's KopfPeering: both replicas announce themselves, one stands by
        wait_for(lambda: len((get(cp, "kopfpeering", "fleetmq", ns) or {}).get("status") or {}) == 2,
                 msg="both replicas in the peering")  # fmt: skip

        # exactly one replica is active: kopf starts paused, logs "Resuming ..." when it takes the lead and
        # "Pausing ..." when it gives way (only if it had resumed), so a replica's last such line tells
        def active(text: str) -> bool:
            return text.rfind("Resuming operations") > text.rfind("Pausing operations")

        wait_for(lambda: sum(active(log.read_text()) for log in logs) == 1, msg="one active replica")
        time.sleep(2)  # and it stays so
        assert sum(active(log.read_text()) for log in logs) == 1, [log.read_text()[-3000:] for log in logs]
        for proc, log in zip(procs, logs, strict=True):
            text = log.read_text()
            assert proc.poll() is None, text[-4000:]
            assert "Forbidden" not in text and " 403" not in text, text[-6000:]

        # `helm uninstall`. Its pre-delete hook Job cannot run without a kubelet: its ServiceAccount and Role
        # are applied as helm would, and its kubectl command runs here, as that ServiceAccount.
        hooks = [
            h
            for h in yaml.safe_load_all(
                helm("get", "hooks", release, "-n", ns, kubeconfig=cp.kubeconfig).stdout
            )
            if h
        ]
        pre_delete = [h for h in hooks if h["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"]
        job = find(pre_delete, "Job")
        hook_rbac = [h for h in pre_delete if h is not job]
        cp.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(h) for h in hook_rbac))
        hook_sa = job["spec"]["template"]["spec"]["serviceAccountName"]
        (cleanup,) = job["spec"]["template"]["spec"]["containers"]
        assert cleanup["command"] == ["kubectl"]
        as_hook = cp.impersonating_kubeconfig(f"{ns}/{hook_sa}")
        t0 = time.monotonic()
        cp.kubectl(*cleanup["args"], kubeconfig=as_hook, timeout=260)  # --wait: until the finalizer is gone
        print(f"examples deleted by the hook's command in {time.monotonic() - t0:.1f}s")
        assert get(cp, "brokerfleet", "edge", ns) is None and get(cp, "mqttzone", "external", ns) is None
        cp.kubectl("delete", "-f", "-", input="\n---\n".join(yaml.safe_dump(h) for h in hook_rbac))
        helm("uninstall", release, "-n", ns, "--no-hooks", "--wait", kubeconfig=cp.kubeconfig)
    finally:
        for proc in procs:
            stop(proc)

    assert helm("list", "-n", ns, "-q", kubeconfig=cp.kubeconfig).stdout.strip() == ""
    left = cp.kubectl(
        "get",
        "all,configmaps,serviceaccounts,roles,rolebindings,kopfpeerings,brokerfleets,mqttzones",
        "-n",
        ns,
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
    ).stdout
    assert left.strip() == ""
    assert get(cp, "clusterrole", f"{full}-operator") is None
    assert get(cp, "clusterrolebinding", f"{full}-operator") is None
    if cp.controllers:  # garbage collection of the fleet's children by their owner references
        wait_for(lambda: get(cp, "statefulset", "edge", ns) is None, msg="children collected")
