"""Loop prevention across bridges, on a message's MQTT 5 user properties.

Two fleets bridged both ways on one topic would pass each message back and forth forever. Three marks
stop that (docs/design.md "Bridges"): remote subscriptions use No Local, so a remote never returns what the
bridge itself published there; ``fmq-bridge-path`` lists the fleets a message went through, so egress
skips a remote already in it and ingress drops a message that has been here before; and HiveMQ's
``hmq-bridge-hop-count`` is honoured for setups mixing fleetmq and HiveMQ bridges. MQTT 3.1.1 has no
user properties: across a v3 remote only No Local-free topic design prevents loops (README "Bridges").
"""

from __future__ import annotations

PATH = "fmq-bridge-path"
HOP_COUNT = "hmq-bridge-hop-count"

UserProperties = list[tuple[str, str]]


def _path(props: UserProperties) -> list[str]:
    for key, value in props:
        if key == PATH:
            return [p for p in value.split(",") if p]
    return []


def _hops(props: UserProperties) -> int:
    for key, value in props:
        if key == HOP_COUNT:
            try:
                return max(int(value), 0)
            except ValueError:
                return 0
    return 0


def _marked(props: UserProperties, path: list[str], visited: str, hops: int) -> UserProperties:
    if visited not in path:
        path = [*path, visited]
    out = [(k, v) for k, v in props if k not in (PATH, HOP_COUNT)]
    out.append((PATH, ",".join(path)))
    out.append((HOP_COUNT, str(hops)))
    return out


def egress(props: UserProperties, fleet: str, remote: str, hop_limit: int) -> UserProperties | None:
    """The user properties to forward to `remote` with (this fleet added to the path, the hop counted), or
    None when forwarding would close a loop: the remote is on the path already, or the hop limit is
    reached (0: no limit)."""
    path = _path(props)
    if remote in path:
        return None
    hops = _hops(props)
    if hop_limit and hops > 0 and hops >= hop_limit:
        return None
    return _marked(props, path, fleet, hops + 1)


def ingress(props: UserProperties, remote: str) -> UserProperties:
    """The user properties a message from `remote` is published here with: the remote on its path, the
    bridge crossing counted."""
    return _marked(props, _path(props), remote, _hops(props) + 1)


def ingress_loops(props: UserProperties, fleet: str) -> bool:
    """Whether a message received from a remote went through this fleet before (drop it)."""
    return fleet in _path(props)
