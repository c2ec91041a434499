"""The Helm chart without a cluster: `helm lint`, what `helm template` renders for several value sets, the
values schema refusing bad values, and the generated parts (CRDs, RBAC rules, versions) being current.
The same renders go through a real kube-apiserver in test_chart_kube.py."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
import yaml
from fleetmq.operator import cli, crdgen, crds, rbac, render

from .conftest import CHART, CUSTOM, EXAMPLES, MONITORING, ROOT, find, kinds

DASHBOARDS = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))


def operator_container(manifests):
    return find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# ------------------------------------------------------------------------------------------ generated
def test_chart_crds_are_the_generated_crds():
    chart_crds = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert chart_crds == crdgen.render(), "run `make crds`"
    assert chart_crds == {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}


def test_rbac_rules_files_are_generated_from_operator_rbac():
    for path, text in rbac.chart_files().items():
        assert path.read_text() == text, f"{path.name}: run `python -m fleetmq.operator.rbac --write`"
    assert yaml.safe_load(rbac.CHART_RULES_FILES["all"].read_text()) == [rule for _, rule in rbac.RULES]


@pytest.mark.parametrize("watch", [[], ["team-a", "team-b"]], ids=["all-namespaces", "namespaced"])
def test_the_charts_roles_are_operator_rbacs_for_the_scope(helm, watch):
    """Watching every namespace: one ClusterRole with every rule. Watching given ones: a Role in each (the
    only place Secrets are readable) and a ClusterRole that only reads CRDs and namespaces."""
    m = helm.template({"operator": {"watchNamespaces": watch}}, release="mq", namespace="mq-system")
    got = {
        (o["kind"], o["metadata"].get("namespace")): o
        for o in m
        if o["kind"].endswith(("Role", "RoleBinding"))
    }
    want = {(o["kind"], o["metadata"].get("namespace")): o for o in rbac.manifests("mq-system", "x", watch)}
    want.pop(("ServiceAccount", "mq-system"))
    assert got.keys() == want.keys()
    for key, obj in got.items():
        assert obj.get("rules") == want[key].get("rules"), key
        if "subjects" in obj:
            assert obj["subjects"] == [
                {"kind": "ServiceAccount", "name": "mq-fleetmq-operator", "namespace": "mq-system"}
            ]
            assert obj["roleRef"]["kind"] == key[0].removesuffix("Binding")
    secrets_anywhere = [o for o in got.values() if o["kind"] == "ClusterRole"
                        and any("secrets" in r["resources"] for r in o["rules"])]  # fmt: skip
    assert bool(secrets_anywhere) == (not watch)


def test_versions_and_image_agree_with_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # the image a BrokerFleet runs by default is the one the chart runs the operator from (--broker-image)
    assert crds.BrokerFleetSpec().image is None
    assert render.broker_image(crds.BrokerFleetSpec()) == f"{values['image']['repository']}:{version}"


# ------------------------------------------------------------------------------------------- render
def test_defaults_render_operator_rbac_dashboards_and_nothing_optional(helm):
    m = helm.template()
    assert kinds(m) == sorted(
        ["ClusterKopfPeering", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"]
        + ["ClusterRole"] * 3  # (the operator's; fleetmq's resources in the default view and edit roles)
        + ["ConfigMap"] * len(DASHBOARDS)
    )
    dep = find(m, "Deployment")
    assert dep["metadata"]["name"] == "fleetmq-operator" and dep["metadata"]["namespace"] == "fleetmq-system"
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    c = operator_container(m)
    assert c["image"] == render.broker_image(crds.BrokerFleetSpec())  # (fleetmq/broker:<version>)
    assert c["command"] == ["fleetmq-operator"]
    assert c["args"] == [
        "--all-namespaces",
        "--peering=fleetmq",
        "--priority=random",
        "--liveness=http://0.0.0.0:8081/healthz",
        "--metrics=0.0.0.0:8080",
        "--resync=30",
        f"--broker-image={c['image']}",
        "--manage-crds",
    ]
    # the flags are the CLI's, and mean what the Deployment needs
    args = cli.parse_args(c["args"])
    kopf = cli.kopf_args(args)[3:]
    assert kopf[:4] == ["--all-namespaces", "--peering", "fleetmq", "--priority"]
    assert kopf[5:] == ["--liveness", "http://0.0.0.0:8081/healthz"]
    # each replica draws its own priority (kopf pauses all peers of equal priority)
    assert len({cli.parse_args(c["args"]).priority for _ in range(20)}) > 1
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "healthz": 8081}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    # RBAC: operator/rbac.py's rules, bound to the ServiceAccount the pods run as
    sa = find(m, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "fleetmq-operator"
    assert find(m, "ClusterRole", "fleetmq-operator")["rules"] == [rule for _, rule in rbac.RULES]
    binding = find(m, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "fleetmq-operator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fleetmq-operator", "namespace": "fleetmq-system"}
    ]
    assert find(m, "ClusterKopfPeering")["metadata"]["name"] == "fleetmq"
    svc = find(m, "Service")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_the_default_view_and_edit_roles_take_in_every_fleetmq_resource(helm):
    """Aggregated ClusterRoles: the CRDs' plurals (and status, and the fleet's scale) to view, edit and
    admin; changes to edit and admin only. Off with rbac.aggregateClusterRoles: false."""
    crds_ = [yaml.safe_load(f.read_text()) for f in sorted((CHART / "crds").glob("*.yaml"))]
    plurals = sorted(c["spec"]["names"]["plural"] for c in crds_ if c["spec"]["group"] == "fleetmq.io")
    m = helm.template()
    view, edit = find(m, "ClusterRole", "fleetmq-view"), find(m, "ClusterRole", "fleetmq-edit")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(aggregate) and v == "true"} == {
        aggregate + "view", aggregate + "edit", aggregate + "admin"}  # fmt: skip
    assert {k for k in edit["metadata"]["labels"] if k.startswith(aggregate)} == {
        aggregate + "edit",
        aggregate + "admin",
    }
    (read,) = view["rules"]
    assert read["verbs"] == ["get", "list", "watch"] and read["apiGroups"] == ["fleetmq.io"]
    assert sorted(read["resources"]) == sorted(
        [*plurals, *(f"{p}/status" for p in plurals), "brokerfleets/scale"]
    )
    (write,) = edit["rules"]
    assert sorted(write["resources"]) == sorted([*plurals, "brokerfleets/scale"])
    assert "get" not in write["verbs"] and {"create", "patch", "delete"} <= set(write["verbs"])
    off = helm.template({"rbac": {"aggregateClusterRoles": False}})
    assert [r["metadata"]["name"] for r in off if r["kind"] == "ClusterRole"] == ["fleetmq-operator"]


def test_the_operators_disruption_budget_comes_with_a_second_replica(helm):
    """A budget of one pod for one replica would stop every drain of its node: none then."""
    assert not [r for r in helm.template() if r["kind"] == "PodDisruptionBudget"]
    pdb = find(helm.template({"operator": {"replicas": 2}}), "PodDisruptionBudget")
    dep = find(helm.template({"operator": {"replicas": 2}}), "Deployment")
    assert pdb["spec"] == {"minAvailable": 1, "selector": dep["spec"]["selector"]}
    off = helm.template({"operator": {"replicas": 2, "podDisruptionBudget": {"enabled": False}}})
    assert not [r for r in off if r["kind"] == "PodDisruptionBudget"]


def test_dashboards_are_configmaps_for_the_grafana_sidecar(helm):
    maps = [d for d in helm.template() if d["kind"] == "ConfigMap"]
    assert DASHBOARDS, "charts/fleetmq/dashboards/ has no dashboard"
    by_key = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key,) = cm["data"]
        by_key[key] = cm
    assert sorted(by_key) == DASHBOARDS
    for name, cm in by_key.items():
        assert json.loads(cm["data"][name]) == json.loads((CHART / "dashboards" / name).read_text())
        assert cm["metadata"]["name"] == "fleetmq-dashboard-" + name.removesuffix(".json").removeprefix(
            "fleetmq-"
        )
    assert not [d for d in helm.template({"dashboards": {"enabled": False}}) if d["kind"] == "ConfigMap"]
    other = helm.template(
        {"dashboards": {"namespace": "monitoring", "annotations": {"grafana_folder": "MQTT"}}}
    )
    for cm in (d for d in other if d["kind"] == "ConfigMap"):
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "MQTT"}


@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_no_dashboards_renders_and_lints(helm, tmp_path, folder):
    chart = tmp_path / "fleetmq"
    shutil.copytree(CHART, chart)
    shutil.rmtree(chart / "dashboards")
    if folder == "empty":
        (chart / "dashboards").mkdir()
    assert "ConfigMap" not in kinds(helm.template(chart=chart))
    helm("lint", "--strict", chart)


def test_monitoring_crds_present_add_servicemonitor_selecting_the_metrics_service(helm):
    m = helm.template(None, *MONITORING)
    sm = find(m, "ServiceMonitor")
    svc = find(m, "Service")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["fleetmq-system"]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]} and endpoint["path"] == "/metrics"
    find(m, "PrometheusRule")
    off = {"metrics": {"serviceMonitor": {"enabled": False}}, "prometheusRule": {"enabled": False}}
    assert not {"ServiceMonitor", "PrometheusRule"} & set(kinds(helm.template(off, *MONITORING)))
    labelled = helm.template({"metrics": {"serviceMonitor": {"labels": {"release": "kps"}}}}, *MONITORING)
    assert find(labelled, "ServiceMonitor")["metadata"]["labels"]["release"] == "kps"


def test_examples_render_a_fleet_zone_test_pod_and_cleanup_hook(helm):
    m = helm.template(EXAMPLES, release="demo", namespace="mq")
    fleet = find(m, "BrokerFleet", "edge")
    zone = find(m, "MqttZone", "external")
    assert fleet["metadata"]["namespace"] == zone["metadata"]["namespace"] == "mq"
    assert fleet["spec"] == {
        "replicas": 3,
        "redis": {"managed": True},
        "image": render.broker_image(crds.BrokerFleetSpec()),
        "imagePullPolicy": "IfNotPresent",
    }
    assert zone["spec"]["fleetRef"] == {"name": "edge"}
    # the operator accepts them, and the Service the test pod connects to is one it renders
    fleet["metadata"]["uid"] = "uid"
    spec = crds.MqttZoneSpec.model_validate(zone["spec"])
    rendered = render.render(render.Fleet.parse(fleet), [render.Zone("external", 1, spec)])
    services = {o["metadata"]["name"]: o for o in rendered.manifests if o["kind"] == "Service"}
    pod = find(m, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env == {"HOST": "edge-external-mqtt", "PORT": "1883"}
    assert services["edge-external-mqtt"]["spec"]["ports"][0]["port"] == 1883
    script = pod["spec"]["containers"][0]["args"][0]
    assert "mosquitto_sub" in script and "mosquitto_pub" in script
    # a pre-delete hook deletes the examples while the operator (and its RBAC) still exist
    job = find(m, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["kubectl"]
    assert c["args"][-3:] == [f"pods/{pod['metadata']['name']}", "mqttzones.fleetmq.io/external",
                              "brokerfleets.fleetmq.io/edge"]  # fmt: skip
    role = find(m, "Role")
    assert role["rules"] == [
        {
            "apiGroups": ["fleetmq.io"],
            "resources": ["brokerfleets", "mqttzones"],
            "verbs": ["get", "list", "watch", "delete"],
        },
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": [pod["metadata"]["name"]],
            "verbs": ["get", "list", "watch", "delete"],
        },
    ]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        hook = find(m, kind, job["spec"]["template"]["spec"]["serviceAccountName"])
        assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
        assert int(hook["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0  # before the Job
    # a zone whose only listener is ws: nothing for mosquitto to connect to, so no test pod
    ws = {
        "examples": {
            "enabled": True,
            "zone": {
                "name": "web",
                "spec": {"listeners": [{"name": "ws", "port": 8083, "protocol": "ws", "path": "/mqtt"}]},
            },
        }
    }
    assert "Pod" not in kinds(helm.template(ws))


def test_helm_test_targets_the_zone_service_of_tests_target(helm):
    # a fleet applied after `helm install` (the README's flow): its zone's Service, in its namespace
    m = helm.template({"tests": {"target": "edge-external-mqtt.mqtt:1883"}})
    pod = find(m, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env == {"HOST": "edge-external-mqtt.mqtt", "PORT": "1883"}
    assert "BrokerFleet" not in kinds(m)  # no examples: only the test pod
    # helm keeps test pods after `helm test` (for --logs) and `helm uninstall` would too: a hook deletes it
    job = find(m, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-1] == f"pods/{pod['metadata']['name']}"
    role = find(m, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "resourceNames": [pod["metadata"]["name"]],
                              "verbs": ["get", "list", "watch", "delete"]}]  # fmt: skip


@pytest.mark.parametrize("values", [None, EXAMPLES, CUSTOM], ids=["defaults", "examples", "custom"])
def test_helm_lint_strict(helm, values):
    out = helm("lint", "--strict", CHART, *helm.values_file(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_custom_values_reach_the_deployment(helm):
    m = helm.template(CUSTOM, release="mq", namespace="mq-system")
    dep = find(m, "Deployment", "mq-fleetmq-operator")
    pod = dep["spec"]["template"]["spec"]
    c = operator_container(m)
    assert dep["spec"]["replicas"] == 2
    assert c["image"] == "registry.example.com/mq/fleetmq:0.1.0-rc1" and c["imagePullPolicy"] == "Always"
    assert c["args"] == [
        "--namespace=team-a",
        "--namespace=team-b",
        "--peering=mq-operators",
        "--priority=random",
        "--liveness=http://0.0.0.0:9091/healthz",
        "--metrics=0.0.0.0:9090",
        "--resync=10",
        "--broker-image=registry.example.com/mq/fleetmq:0.1.0-rc1",
        "--manage-crds",
        "--verbose",
    ]
    args = cli.parse_args(c["args"])
    assert args.namespace == ["team-a", "team-b"] and args.resync == 10 and args.verbose and args.manage_crds
    assert c["resources"] == CUSTOM["operator"]["resources"]
    assert c["securityContext"] == CUSTOM["operator"]["securityContext"]
    assert CUSTOM["operator"]["podSecurityContext"].items() <= pod["securityContext"].items()
    assert pod["serviceAccountName"] == "mq-operator" == find(m, "ServiceAccount")["metadata"]["name"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert (
        pod["nodeSelector"] == {"kubernetes.io/os": "linux"} and pod["tolerations"][0]["key"] == "dedicated"
    )
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert dep["spec"]["template"]["metadata"]["annotations"]["example.com/team"] == "mq"
    # one KopfPeering per watched namespace instead of the cluster-wide one
    peerings = [d for d in m if d["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in peerings} == {"mq-operators"}
    assert "ClusterKopfPeering" not in kinds(m)
    assert find(m, "Service")["spec"]["ports"][0]["port"] == 9090


def test_standalone_and_existing_serviceaccount(helm):
    m = helm.template(
        {
            "operator": {"peering": {"name": ""}, "logLevel": "warning"},
            "serviceAccount": {"create": False, "name": "byo"},
            "rbac": {"create": False},
        }
    )
    c = operator_container(m)
    assert "--standalone" in c["args"] and "--quiet" in c["args"]
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"} & set(kinds(m))
    assert find(m, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "byo"


BAD_VALUES = [
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"repository": ""}}, "/image/repository"),
    ({"operater": {"replicas": 2}}, "operater"),  # a typo is refused, not ignored
    ({"operator": {"replicas": "two"}}, "/operator/replicas"),
    ({"operator": {"replicas": -1}}, "/operator/replicas"),
    ({"operator": {"ports": {"metrics": 70000}}}, "/operator/ports/metrics"),
    ({"operator": {"logLevel": "trace"}}, "/operator/logLevel"),
    ({"operator": {"podDisruptionBudget": {"minAvailable": 2}}}, "/operator/podDisruptionBudget"),
    ({"rbac": {"aggregateClusterRoles": "yes"}}, "/rbac/aggregateClusterRoles"),
    ({"operator": {"watchNamespaces": ["Team A"]}}, "/operator/watchNamespaces/0"),
    ({"operator": {"peering": {"name": "Not_A_Name"}}}, "/operator/peering/name"),
    ({"operator": {"resources": {"requests": {"cpu": ["1"]}}}}, "/operator/resources/requests/cpu"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"dashboards": {"labels": {"grafana_dashboard": 1}}}, "/dashboards/labels/grafana_dashboard"),
    ({"examples": {"fleet": {"name": "Edge_1"}}}, "/examples/fleet/name"),
    ({"examples": {"zone": {"spec": {"fleetRef": {"name": "x"}}}}}, "/examples/zone/spec"),
    ({"tests": {"target": "edge-external-mqtt"}}, "/tests/target"),  # no port
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_values_schema_refuses_bad_values(helm, values, where):
    for command in (("template", "fleetmq"), ("lint", "--strict")):
        out = helm(*command, CHART, *helm.values_file(values), check=False)
        assert out.returncode != 0, out.stdout
        assert "values don't meet the specifications of the schema" in out.stderr + out.stdout
        assert where in out.stderr + out.stdout, out.stderr


def test_replicas_without_peering_are_refused_with_a_reason(helm):
    out = helm(
        "template",
        "fleetmq",
        CHART,
        "--set",
        "operator.replicas=2",
        "--set",
        "operator.peering.name=",
        check=False,
    )
    assert out.returncode != 0
    assert "operator.replicas > 1 needs operator.peering.name" in out.stderr


def test_pipeline_cronjob_runs_export_then_report_on_one_volume(helm):
    """The CronJob's commands are the real fleetmq-pipeline CLI's (parsed by its own parsers)."""
    from fleetmq.pipeline import cli, report

    values = {"pipeline": {"enabled": True, "fleet": "edge", "redisPasswordSecretRef": {"name": "redis"}}}
    manifests = helm.template(values, namespace="mq")
    cron = find(manifests, "CronJob")
    pvc = find(manifests, "PersistentVolumeClaim")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (export,), (rep,) = pod["initContainers"], pod["containers"]
    assert export["args"][0] == "export" and rep["args"][0] == "report"
    exp = cli.export_parser().parse_args(export["args"][1:])
    assert (exp.redis_url, exp.fleet, exp.out, exp.once) == (
        "redis://:$(REDIS_PASSWORD)@edge-redis.mq.svc:6379/0",
        "edge",
        "/data",
        True,
    )
    assert export["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "redis", "key": "password"}
    # the managed Redis by default: the password the operator generated for it
    default = find(helm.template({"pipeline": {"enabled": True, "fleet": "edge"}}, namespace="mq"), "CronJob")
    (export,) = default["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    assert export["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "edge-redis-auth", "key": "password"}
    assert cli.export_parser().parse_args(export["args"][1:]).redis_url == (
        "redis://:$(REDIS_PASSWORD)@edge-redis.mq.svc:6379/0"
    )
    r = report.parser().parse_args(rep["args"][1:])
    assert (r.in_dir, r.out_dir, r.window) == ("/data", "/data/report", "5m")
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    for c in (export, rep):
        assert c["image"].startswith("fleetmq/pipeline:") and c["securityContext"]["readOnlyRootFilesystem"]
    assert not [m for m in helm.template(None) if m["kind"] == "CronJob"]  # off by default
