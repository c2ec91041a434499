"""kopf handlers: every BrokerFleet is reconciled as a whole (the fleet, its zones and its children).

Any trigger (fleet created/changed/resumed, a zone created/changed/deleted, a child changed or deleted by
someone else, the resync timer) asks for one reconciliation of the fleet concerned; requests that arrive
while one runs are folded into one more pass, so a fleet is never reconciled twice at once. Status is
patched explicitly; handler return values are not used (kopf would store them in the object).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import hashlib
import logging
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from fleetmq.broker import apikeys
from fleetmq.broker.auth import hash_password, verify_password

from . import autoscale, crdsync, metrics, rebalance, render, rollout
from .crds import GROUP, VERSION, SecretKeyRef, fleet_ref
from .issuing import Issuer
from .kube import ApiError, Connection, Kube, connect
from .reports import ReportReader
from .status import (
    Autoscaled,
    Observed,
    bridge_status,
    condition,
    fleet_status,
    pod_generations,
    user_status,
    zone_status,
)
from .timestamps import epoch, now

log = logging.getLogger("fleetmq.operator")

FLEETS = (GROUP, VERSION, "brokerfleets")
ZONES = (GROUP, VERSION, "mqttzones")
BRIDGES = (GROUP, VERSION, "mqttbridges")
USERS = (GROUP, VERSION, "mqttusers")
#: (users-file hash, SHA-256 of a password) -> whether they match: the slow check once per password
VERIFIED_LIMIT = 10_000
#: a FailedCreate event older than this is taken for a mistake since fixed (the controller retries with backoff)
CREATE_FAILURE_WINDOW = 600.0
CHILD_LABELS = {render.L_MANAGED: render.MANAGER}
PRUNED_KINDS = (
    "Service",
    "StatefulSet",
    "Job",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "ConfigMap",
    "ServiceMonitor",
)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass
class Operator:
    """Shared state of one operator process (kept in kopf's memo)."""

    kube: Kube
    reconciling: set[tuple[str, str]] = field(default_factory=set)
    dirty: set[tuple[str, str]] = field(default_factory=set)
    readers: dict[tuple[str, str], ReportReader] = field(default_factory=dict)  # per fleet
    monitor_kind: tuple[float, bool] = (0.0, False)
    zone_counts: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    resync: float = 30.0
    last_reconcile: dict[tuple[str, str], float] = field(default_factory=dict)
    verified: dict[tuple[str, str], bool] = field(default_factory=dict)
    rechecks: set[asyncio.Task[None]] = field(default_factory=set)
    #: when the operator last changed a serving label of a fleet's pods (monotonic): a rollout lets an old
    #: pod go only once the Services had time to follow (rollout.STEER_SETTLE)
    steered_at: dict[tuple[str, str], float] = field(default_factory=dict)
    #: the autoscaler's per fleet: the pods' report totals (for rates) and its recent recommendations
    rates: dict[tuple[str, str], autoscale.Rates] = field(default_factory=dict)
    recommendations: dict[tuple[str, str], list[tuple[float, int]]] = field(default_factory=dict)
    scalings: dict[tuple[str, str], list[tuple[float, int]]] = field(default_factory=dict)
    #: each fleet's next look (_recheck): when it is due (monotonic), and its task
    due: dict[tuple[str, str], tuple[float, asyncio.Task[None]]] = field(default_factory=dict)
    #: where the operator's own pods run (the managed Redis' NetworkPolicy admits them); None outside
    namespace: str | None = None
    issuer: Issuer = field(init=False)

    def __post_init__(self) -> None:
        self.issuer = Issuer(self.kube, self._event)

    async def request(self, namespace: str, name: str) -> None:
        """Reconcile the fleet now, or once more after the pass that is running."""
        key = (namespace, name)
        self.dirty.add(key)
        if key in self.reconciling:
            return
        self.reconciling.add(key)
        try:
            while key in self.dirty:
                self.dirty.discard(key)
                await self.reconcile(namespace, name)
        finally:
            self.reconciling.discard(key)

    async def reconcile(self, namespace: str, name: str) -> None:
        started = time.monotonic()
        self.last_reconcile[(namespace, name)] = started
        try:
            result = await self._reconcile(namespace, name)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            log.exception("reconciling BrokerFleet %s/%s failed", namespace, name)
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        metrics.RECONCILES.labels(result).inc()

    async def _reconcile(self, namespace: str, name: str) -> str:
        kube = self.kube
        fleet = await kube.get("BrokerFleet", namespace, name)
        if fleet is None or fleet["metadata"].get("deletionTimestamp"):
            self.zone_counts.pop((namespace, name), None)
            if (reader := self.readers.pop((namespace, name), None)) is not None:
                await reader.close()
            metrics.forget_fleet(namespace, name)
            await self._zones_without_fleet(namespace, name)
            for user in await self._list_users(namespace):
                if fleet_ref(user) == name:
                    await self.user_without_fleet(user)
            return "gone"
        if render.paused(fleet):  # its status stays as it was: so do its gauges
            # (its spec is not read, so not validated either: a paused fleet is left as it is)
            replicas = int((fleet.get("spec") or {}).get("replicas", 3))
            metrics.set_fleet(namespace, name, fleet.get("status") or {}, replicas)
            return "paused"
        parsed = render.Fleet.parse(fleet)  # the one validation of the spec in a pass (raises if invalid)
        replicas = parsed.spec.replicas
        zones = [z for z in await kube.list("MqttZone", namespace) if fleet_ref(z) == name]
        bridge_objs = [b for b in await kube.list("MqttBridge", namespace) if fleet_ref(b) == name]
        cm_name = render.names(name)["config"]
        current_cm = await kube.get("ConfigMap", namespace, cm_name)
        accepted, rejected = render.select_zones(parsed, zones, render.applied_zones(current_cm))
        bridges, rejected_bridges = render.select_bridges(bridge_objs, render.applied_bridges(current_cm))
        bridges, missing, bridge_files = await self._bridges_with_secrets(
            namespace, bridges, render.applied_bridges(current_cm)
        )
        rejected_bridges |= missing
        user_objs = [u for u in await self._list_users(namespace) if fleet_ref(u) == name]
        users, rejected_users = render.select_users(user_objs, accepted)
        users, missing_pw, user_secrets = await self._users_with_passwords(namespace, name, users, user_objs)
        rejected_users |= missing_pw
        issued = await self.issuer.reconcile(
            parsed,
            accepted,
            users,
            {z["metadata"]["name"]: z for z in zones},
            {u["metadata"]["name"]: u for u in user_objs},
        )
        accepted, held = render.hold_back(accepted, issued.missing, render.applied_zones(current_cm))
        rejected |= {zone: render.Rejection("CertificatePending", why) for zone, why in held.items()}
        rejected_users |= {
            user: render.Rejection("IssuerConflict", why) for user, why in issued.user_problems.items()
        }
        if issued.next_due is not None:
            wait = (issued.next_due - datetime.datetime.now(datetime.UTC)).total_seconds()
            if wait < 3600:  # (later ones: a resync finds them due)
                self._recheck(namespace, name, max(wait, 0) + 1)
        self.zone_counts[(namespace, name)] = (len(accepted), len(rejected))
        metrics.ZONES.labels("accepted").set(sum(a for a, _ in self.zone_counts.values()))
        metrics.ZONES.labels("rejected").set(sum(r for _, r in self.zone_counts.values()))
        metrics.FLEETS.set(len(self.zone_counts))
        observed = Observed(rejected=rejected)
        sts_name = render.names(name)["statefulset"]
        before = await kube.get("StatefulSet", namespace, sts_name)
        pods_listed = True
        try:
            observed.pods = await kube.list("Pod", namespace, f"{render.L_FLEET}={name}")
        except ApiError:  # status without pod problems rather than no status
            metrics.RECONCILE_ERRORS.labels("pods").inc()
            pods_listed = False
        plan = self._rollout(parsed, before, observed.pods if pods_listed else None)
        observed.brokers = [f"{sts_name}-{i}" for i in plan.shape.ordinals()]
        rendered: render.Rendered | None = None
        render_error = ""
        passwords: tuple[str | None, str | None] = (None, None)
        try:
            if parsed.spec.redis.managed:
                existing = await kube.get("StatefulSet", namespace, render.names(name)["redis"])
                render.check_redis_topology(parsed.spec, existing)
            passwords = await self._redis_passwords(parsed)
            if parsed.spec.api.enabled and parsed.spec.api.keysSecretRef is None:
                await self._api_keys(parsed)
            rendered = render.render(
                parsed,
                accepted,
                history=render.history(current_cm),
                redis_password=passwords[0],
                service_monitor=await self._has_service_monitor(),
                bridges=bridges,
                bridge_files=bridge_files,
                users=users,
                user_history=render.user_history(current_cm),
                shape=plan.shape,
                operator_namespace=self.namespace,
            )
        except (render.RenderError, ValueError) as e:
            metrics.RECONCILE_ERRORS.labels("render").inc()
            render_error = str(e)
        except ApiError as e:
            metrics.RECONCILE_ERRORS.labels("render").inc()
            render_error = f"cannot read or create the Redis password: {e}"
        if rendered is not None:
            observed.apply_error = await self._apply(fleet, rendered, current_cm)
            observed.store_children = await self._store_children(rendered)
            if pods_listed and not observed.apply_error:
                await self._nudge(namespace, observed.pods, rendered.config_hash)
        observed.statefulset = await kube.get("StatefulSet", namespace, sts_name)
        observed.create_failures = await self._create_failures(namespace, observed)
        if rendered is not None:
            observed.nodeinfo, observed.nodeinfo_error = await self._nodeinfo(
                fleet, observed.brokers, rendered.config["store"], passwords
            )
        balancing = await self._rebalance(parsed, observed) if rendered is not None else None
        observed.autoscaling = await self._autoscale(parsed, observed)
        if pods_listed and rendered is not None:
            if balancing is not None and balancing.away and plan.progress is None:
                plan = self._rollout(parsed, before, observed.pods, balancing.away)
            await self._steer(parsed, plan)
        observed.rollout = plan.progress
        status = fleet_status(parsed, rendered, render_error, observed)
        if balancing is not None and balancing.status is not None:
            status["rebalance"] = _replacing(balancing.status, (fleet.get("status") or {}).get("rebalance"))
        await self._patch_status(fleet, status)
        metrics.set_fleet(namespace, name, status, replicas)
        await self._zone_statuses(parsed, zones, rejected, rendered, observed, status)
        await self._bridge_statuses(bridge_objs, rejected_bridges, rendered, observed)
        await self._user_statuses(
            user_objs, rejected_users, users, user_secrets, rendered, observed, observed.brokers
        )
        return "error" if render_error or observed.apply_error else "ok"

    async def _nudge(self, namespace: str, pods: list[dict[str, Any]], config_hash: str) -> None:
        """Tell each broker pod's kubelet that its config changed: a changed pod annotation makes it sync
        the pod's volumes now (the Kubernetes docs' way), where on its own it brings a changed ConfigMap
        within its sync period plus its cache TTL, a minute or more. So a deleted user's certificate is
        refused in seconds, and zone changes apply as fast."""
        for pod in _brokers(pods):
            meta = pod["metadata"]
            if (meta.get("annotations") or {}).get(render.A_CONFIG_HASH) == config_hash:
                continue
            try:
                await self.kube.patch_annotations(
                    "Pod", namespace, meta["name"], {render.A_CONFIG_HASH: config_hash}
                )
            except ApiError as e:  # (a pod going away; the next pass tries the others again)
                if e.status != 404:
                    log.warning("cannot annotate pod %s/%s: %s", namespace, meta["name"], e)

    async def _create_failures(self, namespace: str, observed: Observed) -> list[tuple[str, str]]:
        """What the API server said of the pod template of each of the fleet's StatefulSets that lacks
        pods (its latest FailedCreate event of the last CREATE_FAILURE_WINDOW seconds): a serviceAccountName
        that does not exist, a pod a PodSecurity level or quota refuses. None is asked for otherwise."""
        sets = [observed.statefulset] + [
            o for k, o in observed.store_children.items() if k.startswith("StatefulSet/")
        ]
        out: list[tuple[str, str]] = []
        for sts in sets:
            if sts is None:
                continue
            want = int((sts.get("spec") or {}).get("replicas") or 0)
            if int((sts.get("status") or {}).get("replicas") or 0) >= want:
                continue
            name = sts["metadata"]["name"]
            fields = f"involvedObject.kind=StatefulSet,involvedObject.name={name},reason=FailedCreate"
            try:
                events = await self.kube.list("Event", namespace, fields=fields)
            except ApiError as e:
                metrics.RECONCILE_ERRORS.labels("events").inc()
                log.warning("cannot read the events of StatefulSet %s: %s", name, e)
                continue
            since = time.time() - CREATE_FAILURE_WINDOW
            recent = [(t, e) for e in events if (t := _event_time(e)) is not None and t >= since]
            if recent:
                out.append((name, max(recent, key=lambda te: te[0])[1].get("message", "")))
        return out

    async def _rebalance(self, fleet: render.Fleet, observed: Observed) -> rebalance.Step | None:
        """Start, follow or end a rebalance (rebalance.py): write the pods' orders, record events, and
        look again when the orders should be carried out. None while the pods' reports cannot be read."""
        if observed.nodeinfo is None:
            return None
        meta, spec = fleet.obj["metadata"], fleet.spec
        key = (fleet.namespace, fleet.name)
        pods = observed.brokers
        sts = (observed.statefulset or {}).get("status") or {}
        steady = (
            int(sts.get("readyReplicas") or 0) == int(sts.get("replicas") or 0) == spec.replicas
            and sts.get("updateRevision") == sts.get("currentRevision")
            and spec.replicas > 0
            and all(pod in observed.nodeinfo for pod in pods)
        )
        wall = time.time()
        rules = spec.rebalance
        if spec.autoscaling is not None and not rules.afterScaleUp:  # (pods it adds would start empty)
            rules = rules.model_copy(update={"afterScaleUp": True})
        step = rebalance.step(
            rules,
            (fleet.obj.get("status") or {}).get("rebalance"),
            (meta.get("annotations") or {}).get(rebalance.ANNOTATION),
            steady,
            {pod: observed.nodeinfo[pod] for pod in pods if pod in observed.nodeinfo},
            wall,
            now(),
            uuid.uuid4().hex[:8],
            # (after a restart the operator does not know when labels last changed: it waits as if now)
            settled_for=time.monotonic() - self.steered_at.setdefault(key, time.monotonic()),
        )
        reader = self.readers.get(key)
        for pod, order in step.orders.items():
            try:
                assert reader is not None  # (nodeinfo was read through it)
                await reader.order(pod, order, wall)
            except Exception as e:  # Redis away: the pods do not move anyone; the status says so
                metrics.RECONCILE_ERRORS.labels("rebalance").inc()
                log.warning("cannot write the rebalance order of pod %s: %s", pod, e)
                if order is not None:
                    return None
        if step.event is not None:
            await self._event(fleet.obj, *step.event)
        if step.recheck is not None:
            self._recheck(*key, step.recheck)
        return step

    def _recheck(self, namespace: str, name: str, delay: float) -> None:
        """Reconcile the fleet again in `delay` seconds. One look per fleet is kept, the earliest: every
        pass asks again for what is still due (a rollout asks every pass)."""
        key = (namespace, name)
        due = time.monotonic() + delay
        pending = self.due.get(key)
        if pending is not None and not pending[1].done():
            if pending[0] <= due:
                return
            pending[1].cancel()

        async def later() -> None:
            await asyncio.sleep(delay)
            # no longer the next look: one the pass below asks for must get a timer of its own
            if self.due.get(key, (0.0, None))[1] is task:
                del self.due[key]
            with contextlib.suppress(Exception):  # (reconcile logged it; the next event or resync retries)
                await self.request(namespace, name)

        task = asyncio.get_running_loop().create_task(later())
        self.due[key] = (due, task)
        self.rechecks.add(task)
        task.add_done_callback(self.rechecks.discard)

    async def _autoscale(self, fleet: render.Fleet, observed: Observed) -> Autoscaled | None:
        """spec.autoscaling (autoscale.py): recommend from the pods' reports and set spec.replicas. It steps
        aside while a HorizontalPodAutoscaler targets the fleet. None without spec.autoscaling."""
        spec, key = fleet.spec.autoscaling, (fleet.namespace, fleet.name)
        if spec is None:
            self.rates.pop(key, None)
            self.recommendations.pop(key, None)
            self.scalings.pop(key, None)
            return None
        try:
            hpas = await self.kube.list("HorizontalPodAutoscaler", fleet.namespace)
        except ApiError as e:
            metrics.RECONCILE_ERRORS.labels("autoscaling").inc()
            return Autoscaled(None, "Unknown", f"cannot list HorizontalPodAutoscalers: {e}")
        for hpa in hpas:
            target = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if (target.get("kind"), target.get("name")) == ("BrokerFleet", fleet.name):
                name = hpa["metadata"]["name"]
                return Autoscaled(None, "HPAOwnsScale", f"HorizontalPodAutoscaler {name} scales this fleet")
        if observed.nodeinfo is None:
            return Autoscaled(None, "MetricsUnavailable", f"no pod reports: {observed.nodeinfo_error}")
        rates = self.rates.setdefault(key, autoscale.Rates())
        rates.update(observed.nodeinfo, time.monotonic())
        ready = {p["metadata"]["name"] for p in _brokers(observed.pods) if rollout.ready(p)}
        load = rates.load({p: i for p, i in observed.nodeinfo.items() if p in observed.brokers}, ready)
        replicas = fleet.spec.replicas
        wanted = autoscale.recommend(spec, replicas, load) if load.pods else None
        if wanted is None:
            self._recheck(*key, autoscale.MIN_INTERVAL + 1)
            return Autoscaled(None, "MetricsUnavailable", "waiting for two reports of every Ready pod", load)
        history = self.recommendations.setdefault(key, [])
        changes = self.scalings.setdefault(key, [])
        decision = autoscale.decide(spec, replicas, history, wanted, time.monotonic(), changes)
        self._recheck(*key, 15.0)  # (the brokers' reports come with no Kubernetes event)
        out = Autoscaled(decision.desired, decision.reason, "", load)
        if decision.replicas != replicas:
            try:
                await self.kube.scale(fleet.obj, decision.replicas)
            except ApiError as e:  # (409: changed meanwhile; the next pass decides again)
                metrics.RECONCILE_ERRORS.labels("autoscaling").inc()
                return Autoscaled(decision.desired, "Unknown", f"cannot set spec.replicas: {e}", load)
            changes.append((time.monotonic(), decision.replicas - replicas))
            message = f"spec.replicas {replicas} -> {decision.replicas}: {autoscale.describe(spec, load)}"
            await self._event(fleet.obj, decision.reason, message)
            out = Autoscaled(decision.desired, decision.reason, message, load, now())
        return out

    def _rollout(
        self,
        fleet: render.Fleet,
        statefulset: dict[str, Any] | None,
        pods: list[dict[str, Any]] | None,
        away: set[str] | frozenset[str] = frozenset(),
    ) -> rollout.Plan:
        """This pass's rollout step (rollout.plan); while the pods cannot be listed, the StatefulSet stays
        as it is."""
        key = (fleet.namespace, fleet.name)
        if pods is None:
            return rollout.Plan(rollout.Shape.of(statefulset, fleet.spec.replicas), recheck=5.0)
        # (after a restart the operator does not know when labels last changed: it waits as if just now)
        settled_for = time.monotonic() - self.steered_at.setdefault(key, time.monotonic())
        spec = fleet.spec
        return rollout.plan(
            statefulset,
            _brokers(pods),
            spec.replicas,
            now=time.time(),
            settled_for=settled_for,
            paused=spec.paused,
            deadline=spec.rollout.progressDeadline,
            away=away,
            max_unavailable=spec.disruption.max_unavailable(spec.replicas),
        )

    async def _steer(self, fleet: render.Fleet, plan: rollout.Plan) -> None:
        """Apply a plan's serving labels (the client Services select serving pods), and look again when
        it says something is due. A failed rollout is told in an Event once."""
        key = (fleet.namespace, fleet.name)
        for pod, value in plan.serving.items():
            self.steered_at[key] = time.monotonic()
            try:
                await self.kube.patch_labels("Pod", fleet.namespace, pod, {rollout.L_SERVING: value})
            except ApiError as e:
                if e.status != 404:  # (a pod gone meanwhile)
                    metrics.RECONCILE_ERRORS.labels("pods").inc()
                    log.warning("cannot label pod %s %s=%s: %s", pod, rollout.L_SERVING, value, e)
        if plan.recheck is not None:
            self._recheck(*key, plan.recheck)
        progress = plan.progress
        before = condition(fleet.obj.get("status"), "Progressing") or {}
        if progress is not None and plan.failed and before.get("reason") != progress.reason:
            await self._event(fleet.obj, progress.reason, f"rollout stopped: {progress.message}", "Warning")

    async def _bridges_with_secrets(
        self, namespace: str, bridges: list[render.Bridge], last: dict[str, render.Bridge]
    ) -> tuple[list[render.Bridge], dict[str, render.Rejection], dict[str, str]]:
        """The bridges to render, those refused, and their Secrets' files (render.bridge_secret).

        A bridge whose password or TLS Secret is missing is refused (naming the field) rather than
        rendered without its credentials; its last version keeps running."""
        kept: list[render.Bridge] = []
        rejected: dict[str, render.Rejection] = {}
        files: dict[str, str] = {}
        for bridge in bridges:
            found = await self._bridge_secret_files(namespace, bridge)
            if isinstance(found, dict):
                kept.append(bridge)
                files |= found
                continue
            rejected[bridge.name] = render.Rejection("SecretMissing", found)
            previous = last.get(bridge.name)
            if previous is not None and previous != bridge:
                before = await self._bridge_secret_files(namespace, previous)
                if isinstance(before, dict):
                    kept.append(previous)
                    files |= before
        return kept, rejected, files

    async def _bridge_secret_files(self, namespace: str, bridge: render.Bridge) -> dict[str, str] | str:
        """The files a bridge's Secrets give it (flat name -> base64 data), or what is missing."""
        remote = bridge.spec.remote
        password: str | None = None
        ref = remote.passwordSecretRef
        if ref is not None:
            secret = await self.kube.get("Secret", namespace, ref.name)
            password = ((secret or {}).get("data") or {}).get(ref.key)
            if password is None:
                return f"spec.remote.passwordSecretRef: Secret {ref.name} has no key {ref.key!r}"
        tls: dict[str, str] | None = None
        if remote.tls is not None and remote.tls.secretRef is not None:
            secret = await self.kube.get("Secret", namespace, remote.tls.secretRef.name)
            if secret is None:
                return f"spec.remote.tls.secretRef: Secret {remote.tls.secretRef.name} not found"
            tls = secret.get("data") or {}
        return render.bridge_secret_files(bridge.name, password, tls)

    async def _list_users(self, namespace: str) -> list[dict[str, Any]]:
        """The MqttUsers of a namespace; none where the cluster lacks their CRD (a chart upgraded with
        `helm upgrade`, which never adds CRDs, and an operator not managing them): fleets go on."""
        try:
            return await self.kube.list("MqttUser", namespace)
        except ApiError as e:
            if e.status != 404:
                raise
            return []

    async def _users_with_passwords(
        self, namespace: str, fleet: str, users: list[render.User], objs: list[dict[str, Any]]
    ) -> tuple[list[render.User], dict[str, render.Rejection], dict[str, str]]:
        """The users to render with their password hashes, those whose password cannot be had, and the
        Secret each one's password is in. A generated password's Secret is created here, once."""
        by_name = {o["metadata"]["name"]: o for o in objs}
        known = render.user_file_entries(
            await self.kube.get("Secret", namespace, render.names(fleet)["users"])
        )
        kept: list[render.User] = []
        rejected: dict[str, render.Rejection] = {}
        secret_names: dict[str, str] = {}
        for user in users:
            ref = user.spec.password_ref(user.name)
            if ref is None:  # certificate only
                kept.append(user)
                continue
            secret_names[user.name] = ref.name
            secret = await self.kube.get("Secret", namespace, ref.name)
            if secret is None and user.spec.generatePassword:
                secret = await self._generate_password(by_name[user.name], user, ref.name, ref.key)
            value = ((secret or {}).get("data") or {}).get(ref.key)
            where = "spec.passwordSecretRef" if user.spec.passwordSecretRef else "generatePassword"
            if value is None:
                why = (
                    f"Secret {ref.name} not found"
                    if secret is None
                    else f"Secret {ref.name} has no key {ref.key!r}"
                )
                rejected[user.name] = render.Rejection("SecretMissing", f"{where}: {why}")
                continue
            try:
                password = base64.b64decode(value).decode()
            except (ValueError, UnicodeDecodeError):
                msg = f"{where}: the password in Secret {ref.name} is not UTF-8"
                rejected[user.name] = render.Rejection("SecretMissing", msg)
                continue
            entry = await self._password_hash(password, known.get(user.username, []))
            kept.append(dataclasses.replace(user, entry=entry))
        return kept, rejected, secret_names

    async def _generate_password(
        self, obj: dict[str, Any], user: render.User, name: str, key: str
    ) -> dict[str, Any] | None:
        manifest = render.user_password_secret(obj, name, key, user.username, secrets.token_urlsafe(24))
        try:
            created = await self.kube.create(manifest)
        except ApiError as e:
            if e.status != 409:
                raise
            return await self.kube.get("Secret", obj["metadata"]["namespace"], name)  # made meanwhile
        await self._event(obj, "Created", f"Created Secret {name} with a generated password")
        return created

    async def _password_hash(self, password: str, candidates: list[str]) -> str:
        """The users-file hash of a password: one it already has in the fleet's users Secret (so the Secret
        stays as it is), else a new salted one. The slow checks run off the event loop, once a password."""
        loop = asyncio.get_running_loop()
        fingerprint = hashlib.sha256(password.encode()).hexdigest()
        if len(self.verified) > VERIFIED_LIMIT:
            self.verified.clear()
        for encoded in candidates:
            ok = self.verified.get((encoded, fingerprint))
            if ok is None:
                ok = await loop.run_in_executor(None, verify_password, password.encode(), encoded)
                self.verified[(encoded, fingerprint)] = ok
            if ok:
                return encoded
        encoded = await loop.run_in_executor(None, hash_password, password)
        self.verified[(encoded, fingerprint)] = True
        return encoded

    async def _user_statuses(
        self,
        objs: list[dict[str, Any]],
        rejected: dict[str, render.Rejection],
        users: list[render.User],
        secret_names: dict[str, str],
        rendered: render.Rendered | None,
        observed: Observed,
        pods: list[str],
    ) -> None:
        by_name = {u.name: u for u in users}
        for obj in objs:
            name = obj["metadata"]["name"]
            st = user_status(
                obj,
                rejection=rejected.get(name),
                rendered_user=by_name.get(name),
                rendered=rendered,
                nodeinfo=observed.nodeinfo,
                pods=pods,
                secret_name=secret_names.get(name),
            )
            before = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
            await self._patch_status(obj, st)
            accepted = next(c for c in st["conditions"] if c["type"] == "Accepted")
            if accepted["status"] == "False" and before.get("Accepted") != "False":
                await self._event(obj, accepted["reason"], accepted["message"], "Warning")

    async def _bridge_statuses(
        self,
        bridge_objs: list[dict[str, Any]],
        rejected: dict[str, render.Rejection],
        rendered: render.Rendered | None,
        observed: Observed,
    ) -> None:
        for obj in bridge_objs:
            if render.paused(obj):
                continue
            st = bridge_status(obj, rejected.get(obj["metadata"]["name"]), rendered, observed)
            before = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
            await self._patch_status(obj, st)
            accepted = next(c for c in st["conditions"] if c["type"] == "Accepted")
            if accepted["status"] == "False" and before.get("Accepted") != "False":
                await self._event(obj, accepted["reason"], accepted["message"], "Warning")

    async def _redis_passwords(self, fleet: render.Fleet) -> tuple[str | None, str | None]:
        """The passwords of the fleet's Redis servers and of its sentinels (None: none needed)."""
        namespace = fleet.namespace
        redis = fleet.spec.redis
        if redis.managed:
            password = await self._managed_password(fleet)
            return password, password if redis.mode == "sentinel" else None
        sentinel_ref = redis.sentinel.secretRef if redis.sentinel is not None else None
        return (
            await self._secret_key(namespace, redis.secretRef, "redis.secretRef"),
            await self._secret_key(namespace, sentinel_ref, "redis.sentinel.secretRef"),
        )

    async def _secret_key(self, namespace: str, ref: SecretKeyRef | None, field_name: str) -> str | None:
        if ref is None:
            return None
        secret = await self.kube.get("Secret", namespace, ref.name)
        if secret is None or ref.key not in (secret.get("data") or {}):
            raise render.RenderError(f"{field_name}: Secret {ref.name} has no key {ref.key!r}")
        return base64.b64decode(secret["data"][ref.key]).decode()

    async def _managed_password(self, fleet: render.Fleet) -> str:
        """The managed Redis' password: its Secret as it is, or created once with a random password. Never
        applied again, so a reconcile never changes the password under running servers."""
        namespace, name = fleet.namespace, render.names(fleet.name)["redis_auth"]
        secret = await self.kube.get("Secret", namespace, name)
        if secret is None:
            try:
                secret = await self.kube.create(render.redis_auth_secret(fleet, secrets.token_hex(24)))
                await self._event(
                    fleet.obj, "Created", f"Created Secret {name} (the managed Redis' password)"
                )
            except ApiError as e:
                if e.status != 409:
                    raise
                secret = await self.kube.get("Secret", namespace, name)  # made meanwhile: that one it is
        data = (secret or {}).get("data") or {}
        if render.PASSWORD_KEY not in data:
            raise render.RenderError(
                f"Secret {name} has no key {render.PASSWORD_KEY!r}: delete it to get a new one"
            )
        return base64.b64decode(data[render.PASSWORD_KEY]).decode()

    async def _api_keys(self, fleet: render.Fleet) -> None:
        """spec.api without keysSecretRef: the fleet's generated keys Secret, made once with one admin key
        (the key itself in it too, for the user; the pods mount only keys.yaml, hashes). Never rewritten:
        users add keys to it with `fleetmq-broker apikey`."""
        namespace, name = fleet.namespace, render.names(fleet.name)["api_keys"]
        if await self.kube.get("Secret", namespace, name) is not None:
            return
        key, record = apikeys.new_key("admin", "admin")
        try:
            await self.kube.create(render.api_keys_secret(fleet, apikeys.dump([record]), key))
        except ApiError as e:
            if e.status != 409:
                raise
            return  # made meanwhile
        await self._event(
            fleet.obj,
            "Created",
            f"Created Secret {name} with an admin API key (its key {render.API_ADMIN_KEY})",
        )

    async def _store_children(self, rendered: render.Rendered) -> dict[str, dict[str, Any] | None]:
        """The managed Redis' StatefulSets and Job as they are now (their status says how far it got)."""
        out: dict[str, dict[str, Any] | None] = {}
        for m in render.store_workloads(rendered.manifests):
            meta = m["metadata"]
            try:
                out[f"{m['kind']}/{meta['name']}"] = await self.kube.get(
                    m["kind"], meta["namespace"], meta["name"]
                )
            except ApiError:
                out[f"{m['kind']}/{meta['name']}"] = None
        return out

    async def _has_service_monitor(self) -> bool:
        checked, present = self.monitor_kind
        if time.monotonic() - checked > 300:
            try:
                present = await self.kube.has_kind("monitoring.coreos.com/v1", "ServiceMonitor")
            except ApiError:
                present = False
            self.monitor_kind = (time.monotonic(), present)
        return present

    async def _apply(
        self, fleet: dict[str, Any], rendered: render.Rendered, current_cm: dict[str, Any] | None
    ) -> str:
        """Server-side apply every child, delete the ones no longer rendered; returns an error or ""."""
        kube = self.kube
        errors = []
        for manifest in rendered.manifests:
            meta = manifest["metadata"]
            try:
                before = await kube.get(manifest["kind"], meta["namespace"], meta["name"])
                after = await kube.apply(manifest, render.MANAGER)
            except ApiError as e:
                metrics.RECONCILE_ERRORS.labels("apply").inc()
                errors.append(f"{manifest['kind']} {meta['name']}: {e}")
                continue
            if (
                before is None
                or before["metadata"]["resourceVersion"] != after["metadata"]["resourceVersion"]
            ):
                metrics.CHILD_CHANGES.labels(manifest["kind"]).inc()
                action = "Created" if before is None else "Updated"
                await self._event(fleet, action, f"{action} {manifest['kind']} {meta['name']}")
        old_hash = ((current_cm or {}).get("metadata", {}).get("annotations") or {}).get(render.A_CONFIG_HASH)
        if not errors and old_hash != rendered.config_hash:
            gens = ", ".join(f"{z} generation {g}" for z, g in sorted(rendered.zone_generations.items()))
            await self._event(fleet, "ConfigRendered", f"config {rendered.config_hash}: {gens or 'no zones'}")
        try:
            await self._prune(fleet, rendered)
        except ApiError as e:
            metrics.RECONCILE_ERRORS.labels("prune").inc()
            errors.append(f"pruning: {e}")
        return "; ".join(errors)

    async def _prune(self, fleet: dict[str, Any], rendered: render.Rendered) -> None:
        meta = fleet["metadata"]
        wanted = {(m["kind"], m["metadata"]["name"]) for m in rendered.manifests}
        selector = f"{render.L_FLEET}={meta['name']},{render.L_MANAGED}={render.MANAGER}"
        for kind in PRUNED_KINDS:
            if kind == "ServiceMonitor" and not await self._has_service_monitor():
                continue
            for obj in await self.kube.list(kind, meta["namespace"], selector):
                owners = obj["metadata"].get("ownerReferences") or []
                if (kind, obj["metadata"]["name"]) in wanted or not any(
                    o.get("uid") == meta["uid"] for o in owners
                ):
                    continue
                if await self.kube.delete(kind, meta["namespace"], obj["metadata"]["name"]):
                    metrics.CHILD_DELETES.labels(kind).inc()
                    await self._event(fleet, "Deleted", f"Deleted {kind} {obj['metadata']['name']}")

    async def _nodeinfo(
        self,
        fleet: dict[str, Any],
        pods: list[str],
        store: dict[str, Any],
        passwords: tuple[str | None, str | None],
    ) -> tuple[dict[str, dict[str, str]] | None, str]:
        """What each broker pod reports in Redis: applied config hash, load, the store's primary."""
        meta = fleet["metadata"]
        key = (meta["namespace"], meta["name"])
        try:
            reader = self.readers.get(key)
            if reader is None or reader.key != ReportReader.key_of(store, *passwords):
                if reader is not None:
                    await reader.close()
                reader = self.readers[key] = ReportReader(store, *passwords, name=render.MANAGER)
            return await reader.read(pods), ""
        except Exception as e:  # redis errors, DNS, timeouts: reported, never fatal
            metrics.RECONCILE_ERRORS.labels("nodeinfo").inc()
            return None, str(e) or type(e).__name__

    async def _patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        meta = obj["metadata"]
        try:
            await self.kube.patch_status(obj["kind"], meta["namespace"], meta["name"], status)
        except ApiError as e:
            if e.status != 404:
                metrics.RECONCILE_ERRORS.labels("status").inc()
                raise

    async def _zone_statuses(
        self,
        fleet: render.Fleet,
        zones: list[dict[str, Any]],
        rejected: dict[str, render.Rejection],
        rendered: render.Rendered | None,
        observed: Observed,
        fleet_st: dict[str, Any],
    ) -> None:
        all_pods = observed.brokers
        gens = pod_generations(rendered, observed.nodeinfo or {}, all_pods) if rendered else {}
        for zone in zones:
            zname = zone["metadata"]["name"]
            if render.paused(zone):
                continue
            st = zone_status(
                zone,
                fleet_found=True,
                rejection=rejected.get(zname),
                fleet_status_=fleet_st,
                pod_gens=gens.get(zname, dict.fromkeys(all_pods)),
            )
            before = {c["type"]: c["status"] for c in (zone.get("status") or {}).get("conditions") or []}
            await self._patch_status(zone, st)
            accepted = next(c for c in st["conditions"] if c["type"] == "Accepted")
            if accepted["status"] == "False" and before.get("Accepted") != "False":
                await self._event(zone, accepted["reason"], accepted["message"], "Warning")

    async def _zones_without_fleet(self, namespace: str, name: str) -> None:
        for zone in await self.kube.list("MqttZone", namespace):
            if fleet_ref(zone) == name and not render.paused(zone):
                await self.zone_without_fleet(zone)

    async def zone_without_fleet(self, zone: dict[str, Any]) -> None:
        st = zone_status(zone, fleet_found=False, rejection=None, fleet_status_=None, pod_gens=None)
        await self._patch_status(zone, st)

    async def user_without_fleet(self, user: dict[str, Any]) -> None:
        meta = user["metadata"]
        fresh = await self.kube.get("MqttUser", meta["namespace"], meta["name"])
        if fresh is None:
            return
        fleet = fleet_ref(fresh) or ""
        missing = render.Rejection("FleetNotFound", f"BrokerFleet {fleet!r} not found in this namespace")
        st = user_status(fresh, rejection=missing, rendered_user=None, rendered=None, nodeinfo=None, pods=[])
        await self._patch_status(fresh, st)

    async def _event(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        try:
            await self.kube.event(obj, reason, message, type_=type_, component=render.MANAGER)
        except ApiError as e:
            log.warning("cannot record event %s on %s: %s", reason, obj["metadata"]["name"], e)

    async def close(self) -> None:
        for task in list(self.rechecks):
            task.cancel()
        await asyncio.gather(*self.rechecks, return_exceptions=True)
        await self.kube.close()
        for reader in self.readers.values():
            with contextlib.suppress(Exception):
                await reader.close()


def _event_time(event: dict[str, Any]) -> float | None:
    return epoch(
        event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    )


def _replacing(new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """status.rebalance as a merge patch: a previous rebalance's pods are removed, not merged in."""
    gone = set((old or {}).get("pods") or {}) - set(new.get("pods") or {})
    return {**new, "pods": {**(new.get("pods") or {}), **dict.fromkeys(gone)}}


def _ns(namespace: str | None) -> str:
    """The namespace of an object of the operator's kinds (all namespaced: kopf types it optional)."""
    assert namespace is not None
    return namespace


def _op(memo: kopf.Memo) -> Operator:
    return memo["fleetmq"]  # type: ignore[no-any-return]


# -------------------------------------------------------------------------------------------- startup
async def _connection(memo: kopf.Memo) -> Connection:
    """The operator's one Connection (kubeconfig or ServiceAccount), shared by kopf and our own requests."""
    conn: Connection | None = memo.get("kube_connection")
    if conn is None:
        context = os.environ.get("FLEETMQ_KUBE_CONTEXT") or None
        conn = memo["kube_connection"] = await asyncio.to_thread(connect, context=context)
    return conn


@kopf.on.login()
async def login(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> kopf.AiohttpSession | None:
    """kopf's watches and patches go through a session of the shared Connection, so they carry its
    refreshed credentials too. kopf logs in again only after a 401: if the credentials are still the ones
    refused, there is nothing new to offer (kopf then stops with a LoginError rather than loop)."""
    conn = await _connection(memo)
    authorization = (await conn.headers()).get("Authorization")
    if "kube_login" in memo and memo["kube_login"] == authorization:
        logger.error("the apiserver refused the credentials and there are no new ones")
        return None
    memo["kube_login"] = authorization
    return kopf.AiohttpSession(
        server=conn.server, default_namespace=conn.namespace, aiohttp_session=conn.session()
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Watches end and restart within bounded time, so a silently dropped connection is never waited on.
    settings.watching.server_timeout = int(_env_float("FLEETMQ_WATCH_SERVER_TIMEOUT", 300))
    settings.watching.client_timeout = int(_env_float("FLEETMQ_WATCH_CLIENT_TIMEOUT", 330))
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = "fleetmq.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="operator.fleetmq.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="operator.fleetmq.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own Events say what we do; kopf's add noise
    kube = Kube(await _connection(memo))
    if os.environ.get("FLEETMQ_MANAGE_CRDS", "").lower() == "true":
        await crdsync.sync(kube)
    memo["fleetmq"] = Operator(
        kube, resync=_env_float("FLEETMQ_RESYNC_SECONDS", 30.0), namespace=_own_namespace()
    )


def _own_namespace() -> str | None:
    """The namespace of the operator's pod (FLEETMQ_OPERATOR_NAMESPACE, else its ServiceAccount's); None
    for an operator outside the cluster."""
    if ns := os.environ.get("FLEETMQ_OPERATOR_NAMESPACE"):
        return ns
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or None
    except OSError:
        return None


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    op = memo.get("fleetmq")
    if op is not None:
        await op.close()


# --------------------------------------------------------------------------------------------- fleets
@kopf.on.resume(*FLEETS)
@kopf.on.create(*FLEETS)
@kopf.on.update(*FLEETS)
async def fleet_changed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _op(memo).request(_ns(namespace), name)


@kopf.daemon(*FLEETS, cancellation_timeout=5.0)
async def fleet_resync(
    namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """Every resync interval: correct drift nobody told us about, refresh status from the pods' reports."""
    op = _op(memo)
    namespace = _ns(namespace)
    try:
        while not stopped:
            # plain sleeps: kopf's stopped.wait() leaves a timer task behind that can fail the shutdown
            await asyncio.sleep(min(op.resync, 1.0))
            last = op.last_reconcile.get((namespace, name), 0.0)
            if not stopped and time.monotonic() - last >= op.resync:
                try:
                    await op.request(namespace, name)
                except Exception:  # logged and counted by reconcile(); the next interval tries again
                    pass
    finally:
        # stopped: the fleet is gone, or this operator pauses for a peer (which then reports the fleet) or
        # exits; a paused operator must not keep exporting what it no longer watches
        metrics.forget_fleet(namespace, name)


@kopf.on.event(*FLEETS, when=lambda type, **_: type == "DELETED")
async def fleet_deleted(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    await _op(memo).request(_ns(namespace), name)


# ---------------------------------------------------------------------------------------------- zones
async def _zone_fleet(op: Operator, zone: dict[str, Any]) -> None:
    meta = zone["metadata"]
    fleet_name = fleet_ref(zone)
    if not fleet_name:
        return
    fleet = await op.kube.get("BrokerFleet", meta["namespace"], fleet_name)
    if fleet is None:
        if not render.paused(zone):
            await op.zone_without_fleet(zone)
        return
    await op.request(meta["namespace"], fleet_name)


@kopf.on.resume(*ZONES)
@kopf.on.create(*ZONES)
@kopf.on.update(*ZONES)
async def zone_changed(body: kopf.Body, old: Any, memo: kopf.Memo, **_: Any) -> None:
    op = _op(memo)
    zone = await op.kube.get("MqttZone", _ns(body.metadata.namespace), body.metadata.name) or dict(body)
    previous = fleet_ref(old)
    if previous and previous != fleet_ref(zone):
        await op.request(_ns(body.metadata.namespace), previous)  # the old fleet drops the zone
    await _zone_fleet(op, zone)


@kopf.on.event(*ZONES, when=lambda type, **_: type == "DELETED")
async def zone_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if fleet_name := fleet_ref(body):
        await _op(memo).request(_ns(body.metadata.namespace), fleet_name)


# -------------------------------------------------------------------------------------------- bridges
@kopf.on.resume(*BRIDGES)
@kopf.on.create(*BRIDGES)
@kopf.on.update(*BRIDGES)
async def bridge_changed(body: kopf.Body, old: Any, memo: kopf.Memo, **_: Any) -> None:
    op = _op(memo)
    previous, current = fleet_ref(old), fleet_ref(body)
    if previous and previous != current:
        await op.request(_ns(body.metadata.namespace), previous)  # the old fleet drops the bridge
    if current and await op.kube.get("BrokerFleet", _ns(body.metadata.namespace), current) is not None:
        await op.request(_ns(body.metadata.namespace), current)


@kopf.on.event(*BRIDGES, when=lambda type, **_: type == "DELETED")
async def bridge_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if fleet_name := fleet_ref(body):
        await _op(memo).request(_ns(body.metadata.namespace), fleet_name)


# ---------------------------------------------------------------------------------------------- users
@kopf.on.resume(*USERS)
@kopf.on.create(*USERS)
@kopf.on.update(*USERS)
async def user_changed(body: kopf.Body, old: Any, memo: kopf.Memo, **_: Any) -> None:
    op = _op(memo)
    previous, current = fleet_ref(old), fleet_ref(body)
    if previous and previous != current:
        await op.request(_ns(body.metadata.namespace), previous)  # the old fleet drops the user
    if current and await op.kube.get("BrokerFleet", _ns(body.metadata.namespace), current) is not None:
        await op.request(_ns(body.metadata.namespace), current)
    elif current:
        await op.user_without_fleet(dict(body))


@kopf.on.event(*USERS, when=lambda type, **_: type == "DELETED")
async def user_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if fleet_name := fleet_ref(body):
        await _op(memo).request(_ns(body.metadata.namespace), fleet_name)


def _brokers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The broker pods among a fleet's pods (the managed Redis' carry the fleet's label too)."""
    return [p for p in pods if (p["metadata"].get("labels") or {}).get(render.L_COMPONENT) == "broker"]


# ------------------------------------------------------------------------------------------- children
def _owned_child(labels: Mapping[str, str], **_: Any) -> bool:
    return bool(labels.get(render.L_FLEET))


@kopf.on.event("apps", "v1", "statefulsets", labels=CHILD_LABELS, when=_owned_child)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS, when=_owned_child)
@kopf.on.event("", "v1", "configmaps", labels=CHILD_LABELS, when=_owned_child)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS, when=_owned_child)
@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS, when=_owned_child)
async def child_event(
    type: str | None, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    """A child changed (its status, or someone edited or deleted it): reconcile its fleet."""
    if type is None:  # the initial listing (kopf passes None): the fleets' own resume handlers cover it
        return
    await _op(memo).request(_ns(namespace), labels[render.L_FLEET])
