"""Kubernetes API timestamps (RFC 3339, UTC, seconds), as status and events carry them."""

from __future__ import annotations

import datetime


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(timestamp: str | None) -> float | None:
    """Seconds since the epoch of an API timestamp (now()'s form, or RFC 3339 with fractions); None when
    there is none or it cannot be read."""
    if not timestamp:
        return None
    try:
        return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
