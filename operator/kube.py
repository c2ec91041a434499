"""A small asyncio Kubernetes client for what kopf does not do: server-side apply, status patches, events.

It reads the same credentials kopf logs in with (a kubeconfig or the pod's ServiceAccount), so the
operator talks to the apiserver as one identity. Objects are plain dicts; the paths of the few kinds the
operator touches are listed in KINDS.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: kind -> (api prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "ConfigMap": ("api/v1", "configmaps", True),
    "Secret": ("api/v1", "secrets", True),
    "Service": ("api/v1", "services", True),
    "Event": ("api/v1", "events", True),
    "Pod": ("api/v1", "pods", True),
    "StatefulSet": ("apis/apps/v1", "statefulsets", True),
    "Job": ("apis/batch/v1", "jobs", True),
    "PodDisruptionBudget": ("apis/policy/v1", "poddisruptionbudgets", True),
    "ServiceMonitor": ("apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "BrokerFleet": ("apis/fleetmq.io/v1alpha1", "brokerfleets", True),
    "MqttZone": ("apis/fleetmq.io/v1alpha1", "mqttzones", True),
    "MqttBridge": ("apis/fleetmq.io/v1alpha1", "mqttbridges", True),
    "MqttUser": ("apis/fleetmq.io/v1alpha1", "mqttusers", True),
    "CustomResourceDefinition": ("apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)
        super().__init__(f"{what}: HTTP {status}: {message}")


@dataclass
class Credentials:
    """Where and how to reach the apiserver (the subset of kubeconfig the operator supports)."""

    server: str
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    impersonate: str | None = None
    impersonate_groups: list[str] = field(default_factory=list)
    namespace: str | None = None
    insecure: bool = False

    def headers(self) -> dict[str, str]:
        out = {}
        token = self.token
        if self.token_file:  # projected tokens rotate: read on use
            token = Path(self.token_file).read_text().strip()
        if token:
            out["Authorization"] = f"Bearer {token}"
        if self.impersonate:
            out["Impersonate-User"] = self.impersonate
        return out

    def header_items(self) -> list[tuple[str, str]]:
        return [*self.headers().items(), *(("Impersonate-Group", g) for g in self.impersonate_groups)]

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_data.decode() if self.ca_data else None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_data and self.key_data:
            with tempfile.TemporaryDirectory() as d:
                cert, key = Path(d, "c"), Path(d, "k")
                cert.write_bytes(self.cert_data)
                key.write_bytes(self.key_data)
                ctx.load_cert_chain(cert, key)
        return ctx


def _data(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        return (base / entry[key]).read_bytes()
    return None


def load_kubeconfig(path: str | os.PathLike[str] | None = None, context: str | None = None) -> Credentials:
    """Credentials from a kubeconfig ($KUBECONFIG or ~/.kube/config), else the pod's ServiceAccount."""
    if path is None:
        path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or None
    if path is None and (Path.home() / ".kube" / "config").is_file():
        path = Path.home() / ".kube" / "config"
    if path is None:
        return in_cluster()
    path = Path(path)
    cfg = yaml.safe_load(path.read_text())
    ctx_name = context or cfg.get("current-context")
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next((u["user"] for u in cfg.get("users", []) if u["name"] == ctx.get("user")), {}) or {}
    base = path.parent
    return Credentials(
        server=cluster["server"].rstrip("/"),
        ca_data=_data(cluster, "certificate-authority", base),
        cert_data=_data(user, "client-certificate", base),
        key_data=_data(user, "client-key", base),
        token=user.get("token"),
        token_file=user.get("tokenFile"),
        impersonate=user.get("as"),
        impersonate_groups=list(user.get("as-groups") or []),
        namespace=ctx.get("namespace"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def in_cluster() -> Credentials:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not running in a pod")
    return Credentials(
        server=f"https://{host}:{port}",
        ca_data=(SA_DIR / "ca.crt").read_bytes(),
        token_file=str(SA_DIR / "token"),
        namespace=(SA_DIR / "namespace").read_text().strip(),
    )


def path_of(kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural, namespaced = KINDS[kind]
    p = f"/{prefix}"
    if namespaced and namespace:
        p += f"/namespaces/{namespace}"
    p += f"/{plural}"
    if name:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p


class Kube:
    """asyncio apiserver client (one aiohttp session; call close())."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.creds.ssl_context()),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        url = self.creds.server + path + (f"?{urlencode(params)}" if params else "")
        headers = [*self.creds.header_items(), ("Accept", "application/json")]
        data = None
        if body is not None:
            headers.append(("Content-Type", content_type))
            data = json.dumps(body)
        async with self._http().request(method, url, data=data, headers=headers) as resp:
            text = await resp.text()
            try:
                payload = json.loads(text) if text else None
            except ValueError:
                payload = text
            if resp.status >= 400:
                raise ApiError(resp.status, payload, f"{method} {path}")
            return payload

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path_of(kind, namespace, name))  # type: ignore[no-any-return]
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, kind: str, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        out = await self.request("GET", path_of(kind, namespace), params=params)
        items: list[dict[str, Any]] = out.get("items", [])
        return items

    async def apply(self, obj: dict[str, Any], manager: str, *, force: bool = True) -> dict[str, Any]:
        """Server-side apply: this manager owns exactly the fields in `obj`; others' fields are kept."""
        meta = obj["metadata"]
        path = path_of(obj["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": manager, "force": "true" if force else "false"}
        return await self.request(  # type: ignore[no-any-return]
            "PATCH", path, obj, content_type="application/apply-patch+yaml", params=params
        )

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create `obj`; ApiError 409 if it exists (for what must be made once and never overwritten)."""
        meta = obj["metadata"]
        return await self.request("POST", path_of(obj["kind"], meta.get("namespace")), obj)  # type: ignore[no-any-return]

    async def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> Any:
        """Merge-patch .status (status subresource): explicit, never through kopf's handler results."""
        return await self.request(
            "PATCH",
            path_of(kind, namespace, name, "status"),
            {"status": status},
            content_type="application/merge-patch+json",
        )

    async def patch_labels(self, kind: str, namespace: str, name: str, labels: dict[str, str]) -> Any:
        """Merge-patch some labels of an object the operator does not apply (a pod)."""
        return await self.request(
            "PATCH",
            path_of(kind, namespace, name),
            {"metadata": {"labels": labels}},
            content_type="application/merge-patch+json",
        )

    async def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        try:
            await self.request("DELETE", path_of(kind, namespace, name), {"propagationPolicy": "Background"})
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    async def has_kind(self, group_version: str, kind: str) -> bool:
        """Whether the apiserver serves `kind` (e.g. ServiceMonitor only where Prometheus' CRDs exist)."""
        try:
            out = await self.request("GET", f"/apis/{group_version}")
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("kind") == kind for r in out.get("resources", []))

    async def event(
        self, obj: dict[str, Any], reason: str, message: str, *, type_: str = "Normal", component: str
    ) -> None:
        """Record a Kubernetes Event on `obj` (what the operator did, for `kubectl describe`)."""
        meta = obj["metadata"]
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self.request("POST", path_of("Event", meta["namespace"]), body)
