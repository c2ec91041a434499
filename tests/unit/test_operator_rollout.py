"""The operator's rollout plans (operator/rollout.py), driven against a small model of the StatefulSet
controller and of clients that reconnect to a serving pod when theirs goes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from fleetmq.operator import rollout
from fleetmq.operator.rollout import Shape

T0 = 1_800_000_000.0


def stamp(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Pod:
    ordinal: int
    revision: str
    created: float
    ready_at: float | None  # None: never (a bad image)
    waiting: str | None = None  # a container's waiting reason
    serving: str = "true"
    deleting: bool = False
    clients: set[int] = field(default_factory=set)

    def obj(self, now: float) -> dict[str, Any]:
        ready = self.ready_at is not None and now >= self.ready_at and not self.deleting
        meta: dict[str, Any] = {
            "name": f"edge-{self.ordinal}",
            "creationTimestamp": stamp(self.created),
            "labels": {rollout.L_REVISION: self.revision, rollout.L_SERVING: self.serving},
        }
        if self.deleting:
            meta["deletionTimestamp"] = stamp(now)
        status: dict[str, Any] = {
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False",
                 "lastTransitionTime": stamp(self.ready_at if ready and self.ready_at else self.created)}
            ]
        }  # fmt: skip
        if self.waiting:
            status["containerStatuses"] = [{"name": "broker", "state": {"waiting": {"reason": self.waiting}}}]
        return {"metadata": meta, "status": status}


class Fleet:
    """The StatefulSet controller's rules as far as a rollout needs them (pkg/controller/statefulset):
    pods for the ordinals [start, start + replicas); a pod whose index (ordinal - start) is at or above
    the partition is made from the update revision, the others from the current one; a pod at or above
    the partition from another revision is deleted, one at a time; a pod outside the range goes."""

    def __init__(self, replicas: int, clients: int, seed: int = 1) -> None:
        self.now = T0
        self.shape = Shape(0, replicas, replicas)
        self.replicas = replicas  # the fleet's spec.replicas
        self.template = "r1"
        self.current = "r1"
        self.startup = 8.0  # seconds from creation to Ready
        self.eviction = 2.0  # seconds a deleted pod takes to stop once its clients are gone
        self.rate = 30  # clients a second a deleted pod lets go
        self.bad: set[str] = set()  # revisions whose pods never become Ready
        self.pods: dict[int, Pod] = {}
        self.gone_at: dict[int, float] = {}
        self.condemned: set[int] = set()
        self.rng = random.Random(seed)
        self.moves: dict[int, int] = {c: 0 for c in range(clients)}
        self.settled_at = T0 - 100
        self.replaced = 0  # pods of the fleet before the rollout that were deleted
        self.generation = self.observed = 1
        self.controller()
        for pod in self.pods.values():
            pod.ready_at = self.now
        for c in range(clients):
            self.pods[c % replicas].clients.add(c)

    def sts(self) -> dict[str, Any]:
        s = self.shape
        updated = sum(1 for p in self.pods.values() if p.revision == self.template)
        return {
            "metadata": {"generation": self.generation},
            "spec": {"replicas": s.replicas, "ordinals": {"start": s.start},
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": s.partition}}},
            "status": {"observedGeneration": self.observed, "updateRevision": self.template,
                       "currentRevision": self.current, "updatedReplicas": updated},
        }  # fmt: skip

    def set_template(self, revision: str) -> None:
        self.template = revision
        self.generation += 1

    def controller(self) -> None:
        s = self.shape
        self.observed = self.generation
        for o, pod in list(self.pods.items()):  # (a pass later: the plan may see one not marked yet)
            if o not in s.ordinals() and not pod.deleting:
                if o in self.condemned:
                    self.delete(pod)
                self.condemned.add(o)
        for o in s.ordinals():
            if o not in self.pods and self.gone_at.get(o, 0) <= self.now:
                revision = self.template if o - s.start >= s.partition else self.current
                ready = None if revision in self.bad else self.now + self.startup
                waiting = "ErrImageNeverPull" if revision in self.bad else None
                self.pods[o] = Pod(o, revision, self.now, ready, waiting)
        for o in sorted(s.ordinals(), reverse=True):
            pod = self.pods.get(o)
            if o - s.start < s.partition or pod is None:
                break
            if pod.revision != self.template and not pod.deleting:
                self.delete(pod)
                break
        live = [self.pods[o] for o in s.ordinals() if o in self.pods]
        if len(live) == s.replicas and all(p.revision == self.template for p in live):
            self.current = self.template

    def delete(self, pod: Pod) -> None:
        pod.deleting = True
        if pod.created == T0:
            self.replaced += 1
        self.gone_at[pod.ordinal] = self.now + self.eviction

    def evict(self) -> None:
        """A second of the deleted pods letting their clients go (`rate` a second, as evictionRate paces
        them): each reconnects to a pod the Services send it to at that moment. A pod is gone once it
        has no client and its time is up."""
        serving = [
            p for p in self.pods.values()
            if p.serving == "true" and not p.deleting and p.ready_at is not None and p.ready_at <= self.now
        ]  # fmt: skip
        for o, pod in list(self.pods.items()):
            if not pod.deleting:
                continue
            for c in sorted(pod.clients)[: self.rate]:
                self.moves[c] += 1
                self.rng.choice(serving).clients.add(c)
                pod.clients.discard(c)
            if not pod.clients and self.gone_at.get(o, 0) <= self.now:
                del self.pods[o]

    def step(self, paused: bool = False, deadline: float = 60.0, max_unavailable: int = 1) -> rollout.Plan:
        self.evict()
        pods = [p.obj(self.now) for p in self.pods.values()]
        plan = rollout.plan(
            self.sts(), pods, self.replicas, now=self.now, settled_for=self.now - self.settled_at,
            paused=paused, deadline=deadline, max_unavailable=max_unavailable,
        )  # fmt: skip
        for name, value in plan.serving.items():
            self.pods[int(name.rsplit("-", 1)[1])].serving = value
            self.settled_at = self.now
        self.shape = plan.shape
        self.controller()
        self.now += 1.0
        return plan

    def run(self, until: float, **kw: Any) -> rollout.Plan:
        """Passes, one a second, until then; returns the last plan."""
        plan = self.step(**kw)
        while self.now < until:
            plan = self.step(**kw)
        return plan

    def going(self) -> list[int]:
        """Pods deleted, or to be deleted (outside the ordinals), not gone yet."""
        return [o for o, p in self.pods.items() if p.deleting or o not in self.shape.ordinals()]

    def load(self) -> list[int]:
        return [len(p.clients) for _, p in sorted(self.pods.items()) if not p.deleting]


def test_outside_a_rollout_the_partition_keeps_a_new_template_from_changing_any_pod():
    fleet = Fleet(3, 30)
    assert fleet.step().shape == Shape(0, 3, 3)
    assert fleet.step().progress is None
    fleet.set_template("r2")
    fleet.observed = 1  # (the controller has not seen it yet: nothing is decided)
    pods = [p.obj(fleet.now) for p in fleet.pods.values()]
    assert rollout.plan(fleet.sts(), pods, 3, now=fleet.now, settled_for=99).shape == Shape(0, 3, 3)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rollout_adds_before_it_removes_and_moves_each_client_once(seed):
    fleet = Fleet(3, 300, seed)
    fleet.step()
    fleet.set_template("r2")
    shapes, reasons = [], set()
    while fleet.now < T0 + 600 and (fleet.current != "r2" or fleet.going()):
        plan = fleet.step()
        shapes.append(plan.shape)
        if plan.progress is not None:
            reasons.add(plan.progress.reason)
            assert plan.progress.status is True
        assert len([p for p in fleet.pods.values() if not p.deleting]) >= 3  # never fewer than replicas
        going = fleet.going()
        assert not going or fleet.shape.replicas == 3, f"a pod added while {going} let its clients go"
    assert fleet.current == "r2", "the rollout did not finish"
    assert sorted(fleet.pods) == [3, 4, 5]
    assert all(p.revision == "r2" and p.serving == "true" for p in fleet.pods.values())
    assert max(fleet.moves.values()) == 1 and min(fleet.moves.values()) == 1
    assert fleet.load() == [100, 100, 100], "each new pod took the clients of one old pod"
    assert Shape(0, 4, 3) in shapes and Shape(1, 3, 3) in shapes and shapes[-1] == Shape(3, 3, 3)
    assert reasons == {"RollingOut"}


def test_an_old_pod_goes_only_once_the_added_one_was_ready_and_alone_serving_long_enough():
    fleet = Fleet(3, 30)
    fleet.step()
    fleet.set_template("r2")
    while fleet.shape.start == 0:
        assert fleet.now < T0 + 120
        before = {o: (p.serving, p.ready_at) for o, p in fleet.pods.items()}
        plan = fleet.step()
        if plan.shape.start == 1:
            serving, ready_at = before[3]
            assert serving == "true" and all(before[o][0] == "false" for o in (0, 1, 2))
            assert ready_at is not None and fleet.now - 1 - ready_at >= rollout.READY_FOR
            assert fleet.now - 1 - fleet.settled_at >= rollout.STEER_SETTLE


def test_a_bad_image_stops_the_rollout_with_no_pod_replaced_and_setting_it_back_recovers():
    fleet = Fleet(3, 60)
    fleet.step()
    fleet.bad.add("r2")
    fleet.set_template("r2")
    plan = fleet.run(T0 + 60)
    assert plan.failed and plan.progress is not None
    assert (plan.progress.reason, plan.progress.pod) == ("ImagePullFailed", "edge-3")
    assert "ErrImageNeverPull" in plan.progress.message
    assert fleet.replaced == 0 and sorted(fleet.pods) == [0, 1, 2, 3]
    assert all(fleet.pods[o].serving == "true" for o in (0, 1, 2)), "the old pods must keep serving"
    assert max(fleet.moves.values()) == 0
    fleet.set_template("r1")  # set back: the added pod goes, nobody deletes a pod by hand
    plan = fleet.run(fleet.now + 60)
    assert plan.progress is None and plan.shape == Shape(0, 3, 3)
    assert sorted(o for o, p in fleet.pods.items() if not p.deleting) == [0, 1, 2]
    assert fleet.replaced == 0 and max(fleet.moves.values()) == 0


def test_an_added_pod_that_crash_loops_or_never_gets_ready_has_its_reason():
    fleet = Fleet(3, 3)
    fleet.step()
    fleet.bad.add("r2")
    fleet.set_template("r2")
    fleet.step()
    fleet.step()
    pod = fleet.pods[3]
    pod.waiting = "CrashLoopBackOff"
    plan = fleet.step()
    assert plan.progress is not None and plan.progress.reason == "CrashLoop"
    pod.waiting = None
    plan = fleet.run(fleet.now + 30, deadline=20.0)
    assert plan.progress is not None and plan.progress.reason == "ReadinessTimeout"
    assert "not Ready 20s after" in plan.progress.message and plan.failed


def test_a_paused_rollout_holds_where_it_is_and_resumes():
    fleet = Fleet(3, 30)
    fleet.step()
    fleet.set_template("r2")
    while fleet.shape.start == 0:
        fleet.step()
    held = fleet.shape
    for _ in range(30):
        plan = fleet.step(paused=True)
        assert plan.progress is not None and (plan.progress.status, plan.progress.reason) == (None, "Paused")
    assert fleet.shape == held
    fleet.run(fleet.now + 300)
    assert fleet.current == "r2" and max(fleet.moves.values()) == 1


def test_outside_a_rollout_pods_held_away_stop_serving_and_serve_again_after():
    fleet = Fleet(3, 3)
    pods = [p.obj(fleet.now) for p in fleet.pods.values()]
    plan = rollout.plan(fleet.sts(), pods, 3, now=fleet.now, settled_for=9, away={"edge-0"})
    assert plan.serving == {"edge-0": "false"}
    fleet.pods[0].serving = "false"
    pods = [p.obj(fleet.now) for p in fleet.pods.values()]
    assert rollout.plan(fleet.sts(), pods, 3, now=fleet.now, settled_for=9).serving == {"edge-0": "true"}


def test_a_pod_from_before_the_label_existed_gets_it_and_an_added_pod_failing_later_gives_serving_back():
    fleet = Fleet(3, 3)
    pods = [p.obj(fleet.now) for p in fleet.pods.values()]
    del pods[2]["metadata"]["labels"][rollout.L_SERVING]
    assert rollout.plan(fleet.sts(), pods, 3, now=fleet.now, settled_for=9).serving == {"edge-2": "true"}
    fleet = Fleet(3, 30)
    fleet.step()
    fleet.set_template("r2")
    while fleet.pods.get(3) is None or fleet.pods[0].serving == "true":
        assert fleet.now < T0 + 60
        fleet.step()
    fleet.pods[3].ready_at = None  # (its readiness probe fails from now on)
    fleet.step()
    assert all(fleet.pods[o].serving == "true" for o in (0, 1, 2)), "nowhere to connect"


def test_a_scale_down_takes_one_pod_at_a_time_out_of_the_services_before_it_goes():
    fleet = Fleet(4, 400)
    fleet.step()
    fleet.replicas = 2
    gone_while_serving = []
    while fleet.now < T0 + 120 and (fleet.shape.replicas != 2 or fleet.going()):
        before = {o: p.serving for o, p in fleet.pods.items()}
        deleting = sum(1 for p in fleet.pods.values() if p.deleting)
        fleet.step()
        assert sum(1 for p in fleet.pods.values() if p.deleting) <= max(deleting, 1), "two pods went at once"
        gone_while_serving += [o for o, p in fleet.pods.items() if p.deleting and before.get(o) == "true"]
    assert sorted(fleet.pods) == [0, 1] and fleet.shape == Shape(0, 2, 2)
    assert not gone_while_serving, f"pods {gone_while_serving} went while the Services still sent clients"
    assert max(fleet.moves.values()) == 1, "a client moved twice"
    assert sum(fleet.load()) == 400 and max(fleet.load()) - min(fleet.load()) <= 60, fleet.load()
    assert all(p.serving == "true" for p in fleet.pods.values())
    fleet.replicas = 3  # a scale-up adds at once, from the current template
    plan = fleet.step()
    assert plan.shape == Shape(0, 3, 3) and plan.progress is None


def test_no_pod_is_let_go_while_the_disruption_budget_is_spent():
    fleet = Fleet(3, 30)
    fleet.step()
    fleet.pods[1].ready_at = None  # (a node problem: one old pod not Ready)
    fleet.set_template("r2")
    plan = fleet.run(fleet.now + 60, max_unavailable=0)
    assert fleet.shape == Shape(0, 4, 3) and plan.progress is not None
    assert "disruption budget" in plan.progress.message and fleet.replaced == 0
    fleet.run(fleet.now + 30, max_unavailable=1)  # one may be down: it goes on
    assert fleet.replaced >= 1
    fleet = Fleet(3, 30)
    fleet.step()
    fleet.pods[0].ready_at = None
    fleet.replicas = 2
    fleet.run(fleet.now + 60, max_unavailable=0)
    assert fleet.shape == Shape(0, 3, 3), "a pod went while one that stays was not Ready"


def test_pods_never_made_come_from_the_new_template_once_it_is_fixed():
    """A template the API server refuses (a ServiceAccount that does not exist): no pod exists, and the
    StatefulSet's current revision stays the refused one. Fixed, the missing pods must be made from the
    new template (below the partition they would come from the current one, refused again)."""
    fleet = Fleet(3, 0)
    fleet.pods.clear()
    fleet.bad.add("r1")
    fleet.set_template("r2")
    fleet.controller = lambda: None  # (look at the plan alone)
    fleet.observed = fleet.generation
    plan = fleet.step()
    assert plan.shape == Shape(0, 3, 0), plan
    fleet = Fleet(3, 3)
    fleet.step()
    del fleet.pods[2]  # one pod missing while no rollout runs: the partition stays
    assert fleet.step().shape == Shape(0, 3, 3)
