"""A small asyncio Kubernetes client for what kopf does not do: server-side apply, status patches, events.

Where the apiserver is and how to authenticate come from the `kubernetes` package's config loading
(kubeconfig with token, client certificate, exec plugin or auth-provider users; or the pod's
ServiceAccount), not from our own kubeconfig parsing: managed clusters (EKS, GKE, AKS) authenticate
through exec plugins whose tokens expire. Only the user's `as` fields, which that package ignores, are
read here (as Impersonate-* headers). One Connection serves kopf's watches and our own requests, and
asks that package for the Authorization header on every request, so expiring tokens are refreshed (the
plugin is run again) for both. Objects are plain dicts; the paths of the few kinds the operator touches
are listed in KINDS.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import ssl
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")

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
    "NetworkPolicy": ("apis/networking.k8s.io/v1", "networkpolicies", True),
    "HorizontalPodAutoscaler": ("apis/autoscaling/v2", "horizontalpodautoscalers", True),
    "ServiceMonitor": ("apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "Certificate": ("apis/cert-manager.io/v1", "certificates", True),
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


class Connection:
    """The apiserver's address, TLS material and credentials, as a `kubernetes` Configuration holds them.

    The Authorization header is asked of the Configuration for every request: its refresh hook runs an
    exec plugin again (or re-reads the ServiceAccount's projected token) once the credential expires. A
    plugin is a process, so that runs in a thread, one request at a time (one plugin run per expiry).
    """

    def __init__(
        self,
        configuration: k8s_client.Configuration,
        namespace: str | None = None,
        impersonation: list[tuple[str, str]] | None = None,
    ) -> None:
        self.configuration = configuration
        self.server: str = configuration.host.rstrip("/")
        self.namespace = namespace
        #: Impersonate-* headers of the kubeconfig user's `as`, `as-uid`, `as-groups`, `as-user-extra`
        self.impersonation = impersonation or []
        self._auth_lock = asyncio.Lock()

    def authorization(self) -> str | None:
        """The Authorization header's value now, refreshed when expired (blocking: may run a plugin)."""
        auth = self.configuration.auth_settings().get("BearerToken")
        return str(auth["value"]) if auth and auth["value"] else None

    async def headers(self) -> dict[str, str]:
        async with self._auth_lock:
            value = await asyncio.to_thread(self.authorization)
        return {"Authorization": value} if value else {}

    def ssl_context(self) -> ssl.SSLContext:
        cfg = self.configuration
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file and cfg.key_file:  # from the kubeconfig or an exec plugin's clientCertificateData
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def session(self, **kwargs: Any) -> aiohttp.ClientSession:
        """An aiohttp session to the apiserver whose every request carries the current credentials."""

        async def authorize(
            request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
        ) -> aiohttp.ClientResponse:
            request.headers.update(await self.headers())
            for header, value in self.impersonation:
                request.headers.add(header, value)
            if session.closed:  # meanwhile (kopf closes a session on a 401): what aiohttp would raise
                raise aiohttp.ClientConnectionError("Connector is closed.")
            if self.configuration.tls_server_name:
                request.server_hostname = self.configuration.tls_server_name
            return await handler(request)

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=self.ssl_context()),
            middlewares=(authorize,),
            proxy=self.configuration.proxy or None,
            **kwargs,
        )
        return session


def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    *,
    sa_dir: Path = SA_DIR,
    environ: Mapping[str, str] = os.environ,
) -> Connection:
    """A Connection from `kubeconfig` ($KUBECONFIG, ~/.kube/config), else from the pod's ServiceAccount.

    The kubeconfig is never written back (persist_config=False): in a pod it is a read-only Secret.
    """
    config_file = str(kubeconfig) if kubeconfig else environ.get("KUBECONFIG") or None
    if config_file is None and DEFAULT_KUBECONFIG.expanduser().is_file():
        config_file = str(DEFAULT_KUBECONFIG.expanduser())
    configuration = k8s_client.Configuration()
    if config_file is None:
        loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(sa_dir / "token"), cert_filename=str(sa_dir / "ca.crt"), environ=environ
        )
        try:
            loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException as e:
            raise k8s_config.ConfigException(
                f"no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod: {e}"
            ) from e
        ns_file = sa_dir / "namespace"
        return Connection(configuration, ns_file.read_text().strip() if ns_file.is_file() else None)
    merged = KubeConfigMerger(config_file).config  # type: ignore[no-untyped-call]
    if merged is None:
        raise k8s_config.ConfigException(f"no kubeconfig in {config_file}")
    kubeconfig_loader = KubeConfigLoader(merged, active_context=context, config_base_path=None)  # type: ignore[no-untyped-call]
    kubeconfig_loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    active: dict[str, Any] = kubeconfig_loader.current_context.get("context") or {}
    user_name = active.get("user")
    user = merged["users"].get_with_name(user_name, safe=True) if user_name and "users" in merged else None
    impersonation = _impersonation(user["user"].value if user and "user" in user else {})
    return Connection(configuration, active.get("namespace"), impersonation)


def _impersonation(user: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Impersonate-* headers kubectl and client-go send for a kubeconfig user's `as` fields (the
    kubernetes package reads none of them): an admin credential acting as a ServiceAccount, say."""
    headers: list[tuple[str, str]] = []
    if user.get("as"):
        headers.append(("Impersonate-User", str(user["as"])))
    if user.get("as-uid"):
        headers.append(("Impersonate-Uid", str(user["as-uid"])))
    headers += [("Impersonate-Group", str(g)) for g in user.get("as-groups") or []]
    for key, values in (user.get("as-user-extra") or {}).items():
        headers += [(f"Impersonate-Extra-{quote(str(key), safe='')}", str(v)) for v in values or []]
    return headers


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
    """asyncio apiserver client (one aiohttp session of `conn`; call close())."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self.conn.session(timeout=aiohttp.ClientTimeout(total=30))
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
        url = self.conn.server + path + (f"?{urlencode(params)}" if params else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
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
        self, kind: str, namespace: str | None, selector: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else {}
        if fields:
            params["fieldSelector"] = fields
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
        return await self._patch_meta(kind, namespace, name, "labels", labels)

    async def patch_annotations(self, kind: str, namespace: str, name: str, values: dict[str, str]) -> Any:
        """Merge-patch some annotations of an object the operator does not apply (a pod)."""
        return await self._patch_meta(kind, namespace, name, "annotations", values)

    async def patch_owners(
        self, kind: str, namespace: str, name: str, owners: Sequence[dict[str, Any]]
    ) -> Any:
        """Set the owner references of an object the operator does not apply (cert-manager's Secret)."""
        return await self.request(
            "PATCH",
            path_of(kind, namespace, name),
            {"metadata": {"ownerReferences": [*owners]}},
            content_type="application/merge-patch+json",
        )

    async def _patch_meta(
        self, kind: str, namespace: str, name: str, field: str, values: dict[str, str]
    ) -> Any:
        return await self.request(
            "PATCH",
            path_of(kind, namespace, name),
            {"metadata": {field: values}},
            content_type="application/merge-patch+json",
        )

    async def scale(self, obj: dict[str, Any], replicas: int) -> Any:
        """Set spec.replicas of an object as it was read (ApiError 409 if it changed since: someone else
        decided meanwhile, and the next reconcile sees what)."""
        meta = obj["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "spec": {"replicas": replicas}}
        return await self.request(
            "PATCH", path_of(obj["kind"], meta["namespace"], meta["name"]), body,
            content_type="application/merge-patch+json",
        )  # fmt: skip

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
