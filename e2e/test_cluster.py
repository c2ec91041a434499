"""The cluster the e2e runs on, before fleetmq: pods run real containers, Services route (from this machine
where the node routes them, and from pods), DNS resolves, in-cluster clients reach the API server through
the `kubernetes` Service, PersistentVolumeClaims bind and keep their data, and logs and exec work."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from .conftest import IMAGE, Cluster, wait_for

NS = "e2e-cluster"
pytestmark = pytest.mark.timeout(600)

# an HTTP server answering with its pod's name (the project's image has Python, nothing else is needed)
WEB = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["POD_NAME"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""
# what a pod sees: names resolved by the cluster DNS, the Service, and the API server through `kubernetes`
PROBE = """
import json, socket, ssl, time, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
out = {"web_ip": socket.gethostbyname("web.e2e-cluster.svc.cluster.local"),
       "kubernetes_ip": socket.gethostbyname("kubernetes.default.svc")}
seen, deadline = set(), time.monotonic() + 60
while len(seen) < 2 and time.monotonic() < deadline:  # both pods behind the Service
    seen.add(urllib.request.urlopen("http://web", timeout=5).read().decode())
out["web"] = sorted(seen)
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc/version",
                             headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
out["version"] = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"]
print(json.dumps(out))
"""


def test_pods_run_services_route_dns_resolves_and_pods_reach_the_api_server(cluster: Cluster):
    c = cluster
    c.kubectl("create", "namespace", NS)
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    web = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": IMAGE,
                            "command": ["python", "-c", WEB],
                            "env": env,
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                        }
                    ]
                },
            },
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    c.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [web, svc]}))
    c.kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=180s")
    pods = sorted(p["metadata"]["name"] for p in c.pods("app=web", NS))
    cluster_ip = c.get("service", "web", NS)["spec"]["clusterIP"]
    if c.routable:  # from this machine, through kube-proxy's rules, to both pods (once both are in them)
        seen: set[str] = set()

        def both() -> bool:
            seen.add(urllib.request.urlopen(f"http://{cluster_ip}", timeout=5).read().decode())
            return sorted(seen) == pods

        wait_for(both, timeout=60, interval=0.1, msg=f"answers from both pods {pods} (so far {seen})")
    phase, logs = c.run_pod("probe", IMAGE, ["python", "-c", PROBE], NS)
    assert phase == "Succeeded", logs
    seen = json.loads(logs.strip().splitlines()[-1])
    kubernetes_ip = c.get("service", "kubernetes", "default")["spec"]["clusterIP"]
    assert seen["web_ip"] == cluster_ip and seen["kubernetes_ip"] == kubernetes_ip
    assert seen["web"] == pods
    assert (
        seen["version"]
        == json.loads(c.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    )
    # the kubelet serves logs and exec
    out = c.kubectl("exec", "-n", NS, pods[0], "--", "python", "-c", "print(6 * 7)")
    assert out.stdout.strip() == "42"


def test_persistent_volume_claims_bind_and_keep_their_data(cluster: Cluster):
    c = cluster
    token = uuid.uuid4().hex
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    c.kubectl("apply", "-f", "-", input=json.dumps(pvc))
    spec = {
        # a non-root user, as the project's pods run: the volume is made writable for its group
        "securityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        "containers": [{"volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
    }
    write = f"open('/data/token', 'w').write('{token}')"
    phase, logs = c.run_pod("writer", IMAGE, ["python", "-c", write], NS, spec=spec)
    assert phase == "Succeeded", logs
    assert wait_for(lambda: c.get("pvc", "data", NS)["status"]["phase"] == "Bound", msg="PVC Bound")
    c.kubectl("delete", "pod", "writer", "-n", NS, "--wait")
    phase, logs = c.run_pod(
        "reader", IMAGE, ["python", "-c", "print(open('/data/token').read())"], NS, spec=spec
    )
    assert phase == "Succeeded" and logs.strip() == token, logs
    c.kubectl("delete", "namespace", NS, "--wait=false")
