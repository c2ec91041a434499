"""The checker: what a run's History must satisfy, and every way it did not.

Pure (no I/O), so it can be tested on made-up histories. Violation classes:
- lost: a message acknowledged to its publisher (PUBACK, or PUBREC for QoS 2) never delivered to a
  subscriber whose SUBACK came before the message was first sent;
- duplicate: a QoS 2 delivery handed to the same subscriber's application twice (the receiver already
  drops a resent PUBLISH whose packet id awaits PUBREL);
- order: a first delivery that comes after the first delivery of a later message of the same publisher
  on the same topic (repeats of QoS 1 messages are allowed; first deliveries must be in publish order);
  for a publisher over HTTP, of a later message acknowledged by the same node;
- stuck: an acknowledged message delivered only after its subscriber had been connected for `stuck_after`
  seconds in a row with no fault active;
- crash: a node exit the nemesis did not cause;
- session-lost: a session the broker had accepted (with an expiry of an hour) not present on reconnect;
- corrupt: a protocol error, an unexpected packet, a payload nobody sent;
- unrecovered: after every fault was healed and the clients drained, a publisher still had messages
  unacknowledged, or a subscriber never got its SUBACK.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from chaos.history import Delivery, Fault, History, MsgKey

CLASSES = {
    "lost": "acknowledged, never delivered to a subscriber subscribed before it was sent",
    "duplicate": "QoS 2 message delivered twice to one subscriber",
    "order": "first delivery after a later message of the same publisher and topic",
    "stuck": "acknowledged, not delivered while its subscriber was connected and no fault active",
    "crash": "node exit not caused by the nemesis",
    "session-lost": "persistent session not present on reconnect",
    "corrupt": "protocol error, unexpected packet or unknown payload",
    "unrecovered": "still unacknowledged / unsubscribed after healing and draining",
}


@dataclass
class Violation:
    kind: str
    t: float
    text: str


@dataclass
class Report:
    stats: dict[str, float] = field(default_factory=dict)
    violations: dict[str, list[Violation]] = field(default_factory=lambda: {k: [] for k in CLASSES})

    def add(self, kind: str, t: float, text: str) -> None:
        self.violations[kind].append(Violation(kind, t, text))

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.violations.items()}


def intervals_union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def longest_within(spans: list[tuple[float, float]], starts: list[float], a: float, b: float) -> float:
    """The longest piece of `spans` (sorted, disjoint; `starts` their starts) inside [a, b]."""
    best = 0.0
    i = max(0, bisect.bisect_right(starts, a) - 1)
    while i < len(spans) and spans[i][0] < b:
        lo, hi = max(spans[i][0], a), min(spans[i][1], b)
        best = max(best, hi - lo)
        i += 1
    return best


def healthy_spans(h: History, end: float) -> list[tuple[float, float]]:
    """When no fault was active, from the start of the run to `end`."""
    faults = intervals_union([(f.start, f.end if f.end is not None else end) for f in h.faults])
    out, t = [], 0.0
    for a, b in faults:
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < end:
        out.append((t, end))
    return out


def _faults_near(h: History, t: float, end: float) -> str:
    """The (at most three) faults closest to `t`: under way at t, or ended shortly before, or soon after."""

    def distance(f: Fault) -> float:
        f_end = f.end if f.end is not None else end
        return 0.0 if f.start <= t <= f_end else min(abs(t - f.start), abs(t - f_end))

    near = sorted((f for f in h.faults if distance(f) <= 5.0), key=distance)[:3]
    text = ", ".join(
        f"#{f.id} {f.kind} {f.target} ({f.start:.1f}-{(f.end if f.end is not None else end):.1f}s)"
        for f in sorted(near, key=lambda f: f.id)
    )
    return f"; faults near: {text}" if text else "; no fault within 5s"


def check(h: History, *, stuck_after: float = 10.0, unrecovered: list[str] | None = None) -> Report:
    end = h.end if h.end is not None else h.now()
    rep = Report()
    by_sub: dict[str, list[Delivery]] = defaultdict(list)
    for d in h.deliveries:
        by_sub[d.sub].append(d)

    healthy = healthy_spans(h, end)
    acked = [m for m in h.msgs.values() if m.acked is not None]
    expected_total = first_total = qos1_repeats = 0

    for sub, info in sorted(h.subs.items()):
        ds = by_sub.get(sub, [])
        first: dict[MsgKey, Delivery] = {}
        count: Counter[MsgKey] = Counter()
        qos2_count: Counter[MsgKey] = Counter()
        for d in ds:
            key = (d.pub, d.topic, d.seq)
            count[key] += 1
            first.setdefault(key, d)
            if d.qos == 2:
                qos2_count[key] += 1
            if key not in h.msgs:
                rep.add("corrupt", d.t, f"{sub}: got {key} from {d.node}, which no publisher sent")
        first_total += len(first)
        qos1_repeats += sum(n - 1 for k, n in count.items() if n > 1 and qos2_count[k] <= 1)

        # duplicates of QoS 2 deliveries
        for key, n in sorted(qos2_count.items()):
            if n > 1:
                times = [
                    f"{d.t:.3f}s via {d.node} (pid {d.packet_id}{', DUP' if d.dup else ''})"
                    for d in ds
                    if (d.pub, d.topic, d.seq) == key
                ]
                rep.add(
                    "duplicate",
                    first[key].t,
                    f"{sub}: {key[0]} {key[1]} #{key[2]} delivered {n} times: {'; '.join(times)}"
                    + _faults_near(h, first[key].t, end),
                )

        # first deliveries in publish order, per publisher and topic (and acknowledging node, per_node)
        latest: dict[tuple[str, ...], Delivery] = {}
        for d in first.values():  # dict order: order of first arrival
            m = h.msgs.get((d.pub, d.topic, d.seq))
            if m is None or m.refused:
                continue
            stream = (d.pub, d.topic, m.node_acked) if m.per_node else (d.pub, d.topic)
            top = latest.get(stream)
            if top is not None and d.seq < top.seq:
                rep.add(
                    "order",
                    d.t,
                    f"{sub}: {d.pub} {d.topic} #{d.seq} first delivered at {d.t:.3f}s via {d.node}, after "
                    f"#{top.seq} at {top.t:.3f}s via {top.node}" + _faults_near(h, d.t, end),
                )
            elif top is None or d.seq > top.seq:
                latest[stream] = d

        # lost and stuck
        if info.suback is None:
            continue
        conns = intervals_union(
            [
                (c.t_connack, c.t_closed if c.t_closed is not None else end)
                for c in h.conns
                if c.client == sub and c.reason == 0
            ]
        )
        watch = intersect(conns, healthy)
        starts = [a for a, _ in watch]
        for m in acked:
            if m.sent <= info.suback:
                continue
            expected_total += 1
            key = (m.pub, m.topic, m.seq)
            assert m.acked is not None
            got = first.get(key)
            if got is None:
                rep.add(
                    "lost",
                    m.acked,
                    f"{sub} (v{info.version} QoS{info.qos}): {m.pub} {m.topic} #{m.seq} (QoS{m.qos}) sent "
                    f"{m.sent:.3f}s via {m.node_sent}, acked {m.acked:.3f}s via {m.node_acked}, never delivered"
                    + _faults_near(h, m.acked, end),
                )
                continue
            if got.t - m.acked >= stuck_after:
                waited = longest_within(watch, starts, m.acked, got.t)
                if waited >= stuck_after:
                    rep.add(
                        "stuck",
                        m.acked,
                        f"{sub}: {m.pub} {m.topic} #{m.seq} acked {m.acked:.3f}s via {m.node_acked}, delivered "
                        f"{got.t:.3f}s via {got.node} after {waited:.1f}s connected with no fault active"
                        + _faults_near(h, m.acked, end),
                    )

    for name, t, code, expected in h.node_exits:
        if not expected:
            rep.add("crash", t, f"{name} exited with status {code} at {t:.3f}s" + _faults_near(h, t, end))
    for cid, t, node in h.session_lost:
        rep.add(
            "session-lost", t, f"{cid}: session not present on {node} at {t:.3f}s" + _faults_near(h, t, end)
        )
    for cid, t, what in h.corrupt:
        rep.add("corrupt", t, f"{cid}: {what}")
    for text in unrecovered or []:
        rep.add("unrecovered", end, text)

    fault_time = sum(
        b - a for a, b in intervals_union([(f.start, f.end if f.end is not None else end) for f in h.faults])
    )
    rep.stats = {
        "published": len(h.msgs),
        "acked": len(acked),
        "expected_deliveries": expected_total,
        "delivered_first": first_total,
        "delivered_total": len(h.deliveries),
        "qos1_repeats": qos1_repeats,
        "qos2_resends_deduped": sum(h.qos2_deduped.values()),
        "publishes_resent": sum(m.sends - 1 for m in h.msgs.values()),
        "refused_acks": sum(m.refused for m in h.msgs.values()),
        "connects": sum(1 for c in h.conns if c.reason == 0),
        "connack_refusals": len(h.refusals),
        "faults": len(h.faults),
        "fault_active_s": fault_time,
    }
    for v in rep.violations.values():
        v.sort(key=lambda x: x.t)
    return rep
