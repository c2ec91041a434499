"""The pipeline's formulas, plain Python: percentiles, the inflight window and queue recommendations.

One source of truth: the Spark job computes its percentiles with ``percentile_approx(col, p,
PERCENTILE_ACCURACY)``, which is this module's nearest-rank ``percentile`` (exact up to about
PERCENTILE_ACCURACY values per group, within n / PERCENTILE_ACCURACY ranks beyond), and it turns the
per-window KPIs into recommendations by calling ``recommend_zone`` on them.

Sizing rules (per zone, from its worst window, so the setting also fits the busy hours):
- max_inflight: the bandwidth-delay product. A session keeps its pipe full when the window holds as many
  unacknowledged messages as arrive during one ack round trip: p95 per-session delivery rate x p95
  deliver->ack round trip, times INFLIGHT_HEADROOM, rounded up, clamped to 1..65535.
- max_mqueue_len: the p99 offline backlog (what waits for a session that was away) times
  MQUEUE_HEADROOM, at least 1. A window with queue_full drops counts a backlog of at least the current
  limit (the queue was full), so the rule then asks for more.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: the latency and queue percentiles every table reports
PERCENTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
#: the Spark percentile_approx accuracy (its relative rank error is 1 / accuracy)
PERCENTILE_ACCURACY = 100_000
#: p-th percentile used for the per-session rate, the ack round trip and the inflight occupancy
P_SIZING = 0.95
INFLIGHT_HEADROOM = 2.0
MQUEUE_HEADROOM = 1.5
MAX_INFLIGHT_MIN = 1
MAX_INFLIGHT_MAX = 65535
MAX_MQUEUE_MIN = 1


def percentile(values: Iterable[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p of the values at or below it (None if empty)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"percentile must be within 0..1, got {p}")
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(math.ceil(p * len(ordered)) - 1, 0)]


def clamp(value: float, lo: int, hi: int) -> int:
    return int(min(max(value, lo), hi))


def bdp_messages(rate_per_s: float, rtt_s: float) -> float:
    """Messages in flight needed to keep one session's pipe full."""
    if rate_per_s < 0 or rtt_s < 0:
        raise ValueError(f"rate and round trip cannot be negative (rate={rate_per_s}, rtt={rtt_s})")
    return rate_per_s * rtt_s


def max_inflight_for(rate_per_s: float, rtt_s: float) -> int:
    return clamp(
        math.ceil(bdp_messages(rate_per_s, rtt_s) * INFLIGHT_HEADROOM), MAX_INFLIGHT_MIN, MAX_INFLIGHT_MAX
    )


def max_mqueue_len_for(backlog: float) -> int:
    if backlog < 0:
        raise ValueError(f"a backlog cannot be negative, got {backlog}")
    return max(math.ceil(backlog * MQUEUE_HEADROOM), MAX_MQUEUE_MIN)


@dataclass(frozen=True)
class WindowKpi:
    """What the recommendations need from one (zone, window) row of zone_kpis."""

    window_start: dt.datetime
    session_rate_p95: float | None  # deliveries per second of the p95 session (sampling undone)
    ack_rtt_p95_ms: float | None
    offline_backlog_p99: float | None
    drops_queue_full: int = 0
    inflight_full: int = 0


@dataclass(frozen=True)
class Recommendation:
    zone: str
    setting: str  # "max_inflight" or "max_mqueue_len" (camelCase in the MqttZone patch)
    current: int | None  # None: unknown (no zone_config event, no --config)
    recommended: int | None  # None: no data to base one on
    reason: str
    window_start: dt.datetime | None = None  # the window the value was sized on

    @property
    def changes(self) -> bool:
        return self.recommended is not None and self.recommended != self.current


def _when(w: WindowKpi) -> str:
    return w.window_start.strftime("%Y-%m-%d %H:%M UTC")


def _current(current: int | None) -> str:
    if current is None:
        return "the current value is unknown"
    return "current 0 (no limit)" if current == 0 else f"current {current}"


def recommend_max_inflight(zone: str, windows: Sequence[WindowKpi], current: int | None) -> Recommendation:
    sized = [w for w in windows if w.session_rate_p95 is not None and w.ack_rtt_p95_ms is not None]
    if not sized:
        return Recommendation(
            zone, "max_inflight", current, None, "no acknowledged QoS 1/2 deliveries: nothing to size it on"
        )
    worst = max(
        sized, key=lambda w: bdp_messages(w.session_rate_p95 or 0.0, (w.ack_rtt_p95_ms or 0.0) / 1000)
    )
    rate, rtt_ms = worst.session_rate_p95 or 0.0, worst.ack_rtt_p95_ms or 0.0
    bdp = bdp_messages(rate, rtt_ms / 1000)
    value = max_inflight_for(rate, rtt_ms / 1000)
    reason = (
        f"in the busiest window ({_when(worst)}) the p95 session received {rate:.3g} msg/s and the p95 ack "
        f"round trip was {rtt_ms:.3g} ms: {bdp:.3g} messages in flight keep the pipe full; "
        f"x{INFLIGHT_HEADROOM:g} headroom = {value}"
    )
    raw = math.ceil(bdp * INFLIGHT_HEADROOM)
    if raw != value:
        reason += f" (clamped from {raw} to {MAX_INFLIGHT_MIN}..{MAX_INFLIGHT_MAX})"
    if current and current < value and worst.inflight_full:
        reason += f"; {_current(current)} filled {worst.inflight_full} times in that window"
    else:
        reason += f"; {_current(current)}"
    return Recommendation(zone, "max_inflight", current, value, reason, worst.window_start)


def recommend_max_mqueue_len(zone: str, windows: Sequence[WindowKpi], current: int | None) -> Recommendation:
    def backlog_of(w: WindowKpi) -> float | None:
        # a queue_full drop means a queue held `current` messages, even if no resumed session showed it
        full = float(current) if w.drops_queue_full and current else None
        known = [v for v in (w.offline_backlog_p99, full) if v is not None]
        return max(known) if known else None

    sized = [w for w in windows if backlog_of(w) is not None]
    if not sized:
        return Recommendation(
            zone, "max_mqueue_len", current, None, "no offline backlog observed: nothing to size it on"
        )
    worst = max(sized, key=lambda w: (backlog_of(w) or 0.0, w.drops_queue_full))
    backlog = backlog_of(worst) or 0.0
    value = max_mqueue_len_for(backlog)
    reason = (
        f"in the worst window ({_when(worst)}) the p99 offline backlog was {backlog:.6g} messages; "
        f"x{MQUEUE_HEADROOM:g} headroom = {value}"
    )
    drops = sum(w.drops_queue_full for w in windows)
    if drops:
        reason += f"; the queue was full and dropped {drops} messages (queue_full), {_current(current)}"
    else:
        reason += f"; {_current(current)}"
    return Recommendation(zone, "max_mqueue_len", current, value, reason, worst.window_start)


def recommend_zone(
    zone: str, windows: Sequence[WindowKpi], max_inflight: int | None, max_mqueue_len: int | None
) -> list[Recommendation]:
    return [
        recommend_max_inflight(zone, windows, max_inflight),
        recommend_max_mqueue_len(zone, windows, max_mqueue_len),
    ]
